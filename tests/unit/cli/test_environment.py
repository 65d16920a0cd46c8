"""Misspelled settings are said at start-up (rebaser_server/cli/environment.py): pure, no server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.app import ChangeSet
from rebaser_server.app.contract import load_app
from rebaser_server.changeset.app_failures import AppFailureLog
from rebaser_server.cli import main as server_cli
from rebaser_server.cli.environment import closest, known_variables, unknown_variables

KNOWN = known_variables(server_cli.main)


def test_every_option_s_variable_and_every_setting_is_known() -> None:
    # An option's variable, a tunable with no flag of its own, and the `rebaser` command's own.
    for name in ("REBASER_NATS_URL", "REBASER_HTTP_PORT", "REBASER_LOG_FORMAT", "REBASER_CONFIG"):
        assert name in KNOWN
    for name in (
        "REBASER_MAX_ATTEMPTS",
        "REBASER_READY_MAX_BACKLOG",
        "REBASER_LEASE_MODE",
        "REBASER_DAEMON_URLS",
    ):
        assert name in KNOWN
    assert all(name.startswith("REBASER_") for name in KNOWN)


def test_the_nats_server_variable_named_by_hand_is_the_one_the_embedded_server_reads() -> None:
    from rebaser_core.embedded.binary import ENV_NATS_SERVER

    assert ENV_NATS_SERVER in KNOWN


def test_a_misspelled_variable_gets_one_line_with_the_closest_name() -> None:
    environ = {
        "REBASER_MAX_ATTEMTPS": "3",
        "REBASER_MAX_ATTEMPTS": "3",  # known: not said
        "REBASER_QUIESCENT_PERIOD": "1",
        "REBASER_TEST_RECORD": "/tmp/x",  # the project's test tooling: left alone
        "REBASER_SOMETHING_ELSE_ENTIRELY": "1",
        "PATH": "/bin",
    }
    assert unknown_variables(environ, KNOWN) == [
        "REBASER_MAX_ATTEMTPS is set but rebaser-server does not read it (did you mean REBASER_MAX_ATTEMPTS?)",
        "REBASER_SOMETHING_ELSE_ENTIRELY is set but rebaser-server does not read it",
    ]


def test_closest_names_only_a_likely_misspelling() -> None:
    assert closest("REBASER_ACK_WIAT", KNOWN) == "REBASER_ACK_WAIT"
    assert closest("REBASER_XYZ", KNOWN) is None


def test_an_app_file_with_a_syntax_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_app.py").write_text("class App:\n    def apply(self\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as raised:
        load_app("broken_app:App")
    message = str(raised.value)
    assert f"SyntaxError at {tmp_path / 'broken_app.py'}:2" in message and "\n" not in message, message


def test_an_app_that_fails_as_it_is_imported_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing_app.py").write_text("X = 1\nY = undefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=r"NameError at .*failing_app\.py:2: name 'undefined_name'"):
        load_app("failing_app:App")


def _failure() -> KeyError:
    try:
        {}["missing"]
    except KeyError as err:
        return err
    raise AssertionError("unreachable")


def test_failed_attempts_are_logged_with_their_traceback_once_a_period_per_change_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = AppFailureLog(period=60, clock=lambda: now[0])
    one, other = (
        ChangeSet(WorkspacePk.new(), ChangeSetId.new()),
        ChangeSet(WorkspacePk.new(), ChangeSetId.new()),
    )
    caplog.set_level(logging.WARNING, logger="rebaser_server.changeset.app_failures")
    assert failures.failed(one, "r1", 1, 3, _failure())
    assert not failures.failed(one, "r1", 2, 3, _failure())  # a crash loop: within the period, counted only
    assert failures.failed(other, "r2", 1, 3, _failure())  # another change set is not held back
    now[0] = 61.0
    assert failures.failed(one, "r1", 3, 3, _failure())
    records = caplog.records
    assert [r.levelno for r in records] == [logging.WARNING] * 3
    first, last = records[0], records[2]
    assert "attempt 1 of 3 (will retry): KeyError: 'missing'" in first.getMessage()
    assert first.exc_info is not None and first.exc_info[0] is KeyError  # the traceback: file and line
    assert "test_environment.py" in caplog.text and "in _failure" in caplog.text
    assert "attempt 3 of 3 (gave up); 1 more failures since the last one logged" in last.getMessage()


def test_the_failure_log_forgets_the_longest_quiet_change_sets_first() -> None:
    failures = AppFailureLog(period=60, tracked=2, clock=lambda: 0.0)
    sets = [ChangeSet(WorkspacePk.new(), ChangeSetId.new()) for _ in range(3)]
    for change_set in sets:
        failures.failed(change_set, "r", 1, 3, _failure())
    assert failures.failed(sets[0], "r", 2, 3, _failure())  # forgotten, so logged again
    assert not failures.failed(sets[2], "r", 2, 3, _failure())
