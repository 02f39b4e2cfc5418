"""CDI (Container Device Interface) devices: spec files on the host, edits to the OCI spec.

`registry` finds, loads and checks the spec files and resolves device names to their
edits (host reads: call it from a worker thread); `edits` applies them to an OCI spec
(pure); `schema` is the spec file format; `names` the device-name syntax.
"""
