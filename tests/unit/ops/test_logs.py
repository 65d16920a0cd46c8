"""Log lines: ids bound for a request appear on every line written meanwhile, in both formats, and only then."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from rebaser_server.ops.logs import bind_request, configure_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_console_lines_carry_the_bound_ids(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("info", "console", out)
    log = logging.getLogger("rebaser_server.test")
    with bind_request(request_id="R1", change_set_id="C1", workspace_id=None):
        log.warning("inside")
    log.warning("outside")
    inside, outside = out.getvalue().splitlines()
    assert inside.endswith("WARNING rebaser_server.test: inside request_id=R1 change_set_id=C1")
    assert outside.endswith("WARNING rebaser_server.test: outside")


def test_json_lines_are_objects_with_ids_extras_and_exceptions(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("DEBUG", "json", out)
    log = logging.getLogger("rebaser_server.test")
    with bind_request(request_id="R2"):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed %d", 3, extra={"seq": 7})
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "failed 3" and record["level"] == "ERROR"
    assert record["request_id"] == "R2" and record["seq"] == 7
    assert "ValueError: boom" in record["exception"]
