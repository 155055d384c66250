"""How `up` and `serve` log: `--log-format text|json` and `--log-level`, on stderr (the line
shapes: intentserve.common.logs). The workers log in the same format (their `log_format`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from intentserve.common.logs import LOG_FORMATS, formatter

LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(log_format: str, level: str) -> None:
    """The root logger's one handler, on stderr (what a previous call set up is replaced)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
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
