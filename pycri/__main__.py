"""`python -m pycri` is the `pycri` command."""

from pycri.cli import main

main()
