"""Where in an app an exception was raised (app_failures.raised_at, app_trace): pure, no server."""

from __future__ import annotations

import json

from rebaser_server.changeset.app_failures import app_trace, raised_at


def _price(items: dict[str, int], sku: str) -> int:
    return items[sku]  # a KeyError raised by the dict, in C: this line is where


def _apply(body: str) -> int:
    return _price(json.loads(body), "sku")


def _caught(body: str) -> BaseException:
    try:
        _apply(body)
    except Exception as err:
        return err
    raise AssertionError("no exception")


def test_the_innermost_frame_of_the_app_is_where_it_was_raised() -> None:
    err = _caught("{}")
    assert isinstance(err, KeyError)
    where = raised_at(err)
    assert (
        where is not None
        and where.startswith("test_app_failure_location.py:")
        and where.endswith("in _price")
    )
    trace = app_trace(err)
    assert trace is not None and trace.endswith("in _apply > " + where)


def test_an_exception_from_the_standard_library_points_at_the_app_line_that_called_it() -> None:
    err = _caught("not json")  # raised deep inside json's decoder
    where = raised_at(err)
    assert where is not None and where.endswith("in _apply")
    trace = app_trace(err)
    assert trace is not None and "decoder.py" in trace  # the trace keeps the library's frames


def test_the_daemons_own_frames_are_not_the_app() -> None:
    from rebaser_core.ids import ChangeSetId

    try:
        ChangeSetId("not a ulid")
    except Exception as err:
        assert raised_at(err) is not None  # this test's own frame: the call site
        assert "ids.py" not in (app_trace(err) or "")
