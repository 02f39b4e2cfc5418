"""Where a parser gave up on a file, worded without the file's text.

JSON, YAML and TOML errors quote what they choke on: YAML prints the offending line
with a caret, TOML the character. A file read as root may be a link to a secret
(/etc/shadow in a spec dir, issue 22 defect 7), and its error may reach a CRI client
or a log, so an error says which format, and the line and column, and nothing else.
"""

from __future__ import annotations

import json
import re

# tomllib ends every message with its position.
_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)$")


def where(e: Exception) -> str:
    """'line L, column C' (or 'byte N', 'end of document') of a parser's error; ''
    when the error carries no position."""
    if isinstance(e, json.JSONDecodeError):
        return f"line {e.lineno}, column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return f"byte {e.start}"
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)  # YAML
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(position := getattr(e, "position", None), int):  # YAML's reader
        return f"character {position}"
    text = str(e)
    if m := _TOML_AT.search(text):
        return f"line {m[1]}, column {m[2]}"
    if text.endswith("(at end of document)"):
        return "end of document"
    return ""


def invalid(fmt: str, e: Exception) -> str:
    """'not valid YAML (at line 2, column 6)': `e`, a parser's error on a `fmt` file."""
    what = "UTF-8" if isinstance(e, UnicodeDecodeError) else fmt
    at = where(e)
    return f"not valid {what} (at {at})" if at else f"not valid {what}"
