"""`--log-format json` / `--log-level`: one JSON object a line with the record's structured
fields, at the level asked for."""

from __future__ import annotations

import json
import logging

import pytest
from intentserve.common.logs import formatter
from intentserve.controller.cli.logs import configure_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_fields_and_the_level_filters(restore_logging, capsys):
    configure_logging("json", "info")
    log = logging.getLogger("intentserve.access")
    log.debug("not shown")
    log.info("GET /health 200", extra={"fields": {"status": 200, "request_id": "r1"}})
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines] == ["GET /health 200", "failed"]
    first = lines[0]
    assert (first["level"], first["logger"], first["status"], first["request_id"]) == (
        "info",
        "intentserve.access",
        200,
        "r1",
    )
    assert first["time"].endswith("+00:00")
    assert "ValueError: boom" in lines[1]["error"]


def test_a_log_format_other_than_text_or_json_is_refused_naming_it():
    with pytest.raises(ValueError, match="log_format: 'yaml'; allowed: text, json"):
        formatter("yaml")


def test_text_is_the_default_shape_and_warning_hides_info(restore_logging, capsys):
    configure_logging("text", "warning")
    logging.getLogger("a").info("quiet")
    logging.getLogger("a").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err
    assert "WARNING a: loud" in err
