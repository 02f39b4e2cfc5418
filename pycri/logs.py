"""Logging set-up for `pycri serve`: text or one JSON object per line, on stderr."""

from __future__ import annotations

import json
import logging
import re
import sys

from pycri.config import Config

# A URL's userinfo and its query and fragment: where credentials ride (a presigned
# redirect's signature, `user:password@`); the scheme, host and path are kept.
_URL = re.compile(r"(?P<keep>[a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/\s@'\"]*@)?"
                  r"(?P<path>[^\s?#'\"]*)(?:[?#][^\s'\"]*)?")


def without_url_secrets(text: str) -> str:
    """`text` with every URL in it cut to its scheme, host and path (issue 39)."""
    return _URL.sub(r"\g<keep>\g<path>", text) if "://" in text else text


class _NoURLSecrets(logging.Filter):
    """Every line leaves with its URLs cut (httpx logs each request's URL at INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "://" in message:
            record.msg, record.args = without_url_secrets(message), None
        return True


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
    handler.addFilter(_NoURLSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())
