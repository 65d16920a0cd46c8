"""Durations given to the ``rebaser`` commands are finite and not negative, the settings' finite: a NaN or infinite
deadline never comes, so a command given one would wait for ever (or a timer would overflow)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from rebaser_client.admin.cli.main import main
from rebaser_core.settings import Settings

_WK, _CS = "01KBDQ4Y6N3W2Z8J5X0A9B7C1D", "01KBDQ4Y6N3W2Z8J5X0A9B7C1E"
_COMMANDS = [
    ["request", "--workspace", _WK, "--change-set", _CS, "--set", "/x=1"],
    ["wait", _WK, _CS],
    ["streams", "set", "2"],
]


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("timeout", ["nan", "inf", "-inf", "-1", "1e300", "soon"])
def test_a_timeout_that_is_not_a_finite_duration_is_refused_before_connecting(
    command: list[str], timeout: str
) -> None:
    # Port 9 on loopback: nothing listens there, and nothing may be tried before the flag is refused.
    result = CliRunner().invoke(main, [*command, "--timeout", timeout, "--nats-url", "nats://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    assert "--timeout" in result.output and "seconds" in result.output


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_settings_refuse_nan_and_infinity(value: str) -> None:
    with pytest.raises(ValidationError):
        Settings(ack_wait=value)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings.from_env({"REBASER_NATS_TIMEOUT": value})
