"""Log lines as JSON, one object a line, for log shippers (Loki, Elasticsearch, Cloud Logging):
the controller's (`up --log-format json`) and its workers' alike, so one request id can be
followed through both.

Keys: `time` (UTC, ISO 8601), `level`, `logger`, `message`, then the record's structured fields
(a log call passes them as `extra={"fields": {...}}`: the HTTP access log's method, route, status,
latency_s and request_id; a worker's finished request), and `error` with the traceback when there
is one.
"""

from __future__ import annotations

import datetime
import json
import logging

LOG_FORMATS = ("text", "json")
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


def formatter(log_format: str) -> logging.Formatter:
    """`json` or `text` (ValueError naming the allowed values otherwise)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format: {log_format!r}; allowed: {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
