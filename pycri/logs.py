"""Logging set-up for `pycri serve`: text or one JSON object per line, on stderr."""

from __future__ import annotations

import json
import logging
import sys

from pycri.config import Config


class JSONFormatter(logging.Formatter):
    """One JSON object per line; the `fields` a record carries (oplog.py) become keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)  # server/oplog.py: one key per field
        if isinstance(fields, dict):
            entry.update((k, v) for k, v in fields.items() if k not in entry)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(cfg: Config) -> None:
    """Send every record to stderr in `log_format` at `log_level`; called again on reload."""
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())
