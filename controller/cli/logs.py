"""How `up` and `serve` log: `--log-format text|json` and `--log-level`, on stderr.

JSON is one object a line, for log shippers (Loki, Elasticsearch, Cloud Logging): `time` (UTC,
ISO 8601), `level`, `logger`, `message`, then the record's structured fields (a log call passes
them as `extra={"fields": {...}}`: the HTTP access log's method, route, status, latency_s and
request_id), and `error` with the traceback when there is one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


def configure_logging(log_format: str, level: str) -> None:
    """The root logger's one handler, on stderr (what a previous call set up is replaced)."""
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text (default) or json: one object a line, with the access log's fields",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="warning by default; info adds one access-log line per HTTP request",
    )
