"""Running the daemon as an operator does: --help and --version, REBASER_* variables and a --config file, JSON
logs with the request's ids, and one line (no traceback) for the usual mistakes."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client.admin.cli.main import main as client_cli
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.cli import main as server_cli
from rebaser_server.daemon.config import ServerConfig
from tests.support.daemons import daemon_processes, run_daemon, spawn_daemon


def _one_line_error(output: str) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    return errors[0]


# ------------------------------------------------------------------------------------------------ --help, --version


def test_help_documents_every_flag_with_its_default_and_variable() -> None:
    command = server_cli.main
    ctx = click.Context(command, info_name="rebaser-server", **command.context_settings)
    for param in command.params:
        assert isinstance(param, click.Option)
        if param.name in ("help", "version"):
            continue
        record = param.get_help_record(ctx)
        assert record is not None, param.name
        names, text = record
        assert param.help, f"{names} has no help text"
        assert f"env var: {param.envvar}" in text, f"{names}: {text}"
        assert str(param.envvar).startswith("REBASER_"), names
        if isinstance(param.default, str | int | float) and not param.is_flag:
            assert "default: " in text, f"{names} does not show its default: {text}"
    help_text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    for flag in ("--user", "--password", "--token", "--tls-ca", "--ack-wait", "--progress-period"):
        assert flag in help_text
    assert "default: 2.5" in help_text  # --ack-wait: the Settings default, not "None"


@pytest.mark.parametrize(("command", "name"), [(server_cli.main, "rebaser-server"), (client_cli, "rebaser")])
def test_version(command: click.Command, name: str) -> None:
    result = CliRunner().invoke(command, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{name}, version ")


# ------------------------------------------------------------------------------------------ variables and a config file


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """The configuration ``rebaser-server`` would serve with (serve() is replaced: nothing starts)."""
    configs: list[ServerConfig] = []

    async def fake_serve(config: ServerConfig, *, demo: bool = False) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(server_cli, "serve", fake_serve)
    monkeypatch.setattr(server_cli, "configure_logging", lambda *args: None)
    for name in ("REBASER_NATS_URL", "REBASER_CONCURRENCY", "REBASER_CONFIG", "REBASER_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    return configs


def _run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(server_cli.main, args, env=env)


def test_config_file_then_variables_then_flags(tmp_path: Path, served: list[ServerConfig]) -> None:
    config = tmp_path / "rebaser.toml"
    config.write_text(
        "nats-url = ['nats://a:4222', 'nats://b:4222']\n"
        "http_port = 9999\n"
        "concurrency = 7\n"
        "ready_max_backlog = 3\n"  # a tunable with no flag of its own
        "log-format = 'json'\n"
    )
    assert _run(["--config", str(config)]).exit_code == 0
    first = served[-1]
    assert first.connect is not None and first.connect.servers == ("nats://a:4222", "nats://b:4222")
    assert (first.http_port, first.settings.concurrency, first.settings.ready_max_backlog) == (9999, 7, 3)
    assert first.log_format == "json"

    env = {"REBASER_CONFIG": str(config), "REBASER_CONCURRENCY": "9", "REBASER_READY_MAX_BACKLOG": "4"}
    assert _run([], env).exit_code == 0
    assert (served[-1].settings.concurrency, served[-1].settings.ready_max_backlog) == (9, 4)

    assert _run(["--concurrency", "11", "--http-port", "-1"], env).exit_code == 0
    assert (served[-1].settings.concurrency, served[-1].http_port) == (11, -1)


def test_every_flag_reads_its_variable(served: list[ServerConfig], tmp_path: Path) -> None:
    env = {
        "REBASER_NATS_URL": "nats://x:4222 nats://y:4222",
        "REBASER_NATS_USER": "me",
        "REBASER_NATS_TOKEN": "tok",
        "REBASER_PREFIX": "pfx",
        "REBASER_APP": "tests.support.apps:RecordingApp",
        "REBASER_ACK_WAIT": "10",
        "REBASER_PROGRESS_PERIOD": "2",
        "REBASER_HANDLER_DEADLINE": "30",
        "REBASER_QUIESCENT_PERIOD": "5",
        "REBASER_DATA_DIR": str(tmp_path),
        "REBASER_EMBEDDED_HOST": "0.0.0.0",
        "REBASER_HTTP_HOST": "0.0.0.0",
        "REBASER_HTTP_PORT": "1234",
        "REBASER_LOG_FORMAT": "json",
    }
    result = _run([], env)
    assert result.exit_code == 0, result.output
    config = served[-1]
    assert config.connect is not None and config.connect.servers == ("nats://x:4222", "nats://y:4222")
    assert (config.connect.user, config.connect.token) == ("me", "tok")
    settings = config.settings
    assert (settings.prefix, settings.ack_wait, settings.progress_period) == ("pfx", 10, 2)
    assert (settings.handler_deadline, settings.quiescent_period) == (30, 5)
    assert (config.app, config.data_dir, config.embedded_host) == (
        "tests.support.apps:RecordingApp",
        tmp_path,
        "0.0.0.0",
    )
    assert (config.http_host, config.http_port, config.log_format) == ("0.0.0.0", 1234, "json")


def test_a_bad_config_file_is_one_line(tmp_path: Path, served: list[ServerConfig]) -> None:
    config = tmp_path / "rebaser.toml"
    config.write_text("no_such_thing = 1\n")
    result = _run(["--config", str(config)])
    assert result.exit_code != 0 and "unknown key 'no_such_thing'" in _one_line_error(result.output)
    config.write_text("max_attemtps = 3\n")
    result = _run(["--config", str(config)])
    assert "unknown key 'max_attemtps'" in _one_line_error(result.output)
    assert "(did you mean 'max_attempts'?)" in result.output
    config.write_text("http-prot = 3\n")  # said in the file's own spelling
    assert "(did you mean 'http-port'?)" in _one_line_error(_run(["--config", str(config)]).output)
    config.write_text("concurrency = \n")
    result = _run(["--config", str(config)])
    assert result.exit_code != 0 and "not valid TOML" in _one_line_error(result.output)
    assert not served


def test_a_misspelled_variable_is_said_at_start_up(
    served: list[ServerConfig], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    result = _run([], {"REBASER_MAX_ATTEMTPS": "3", "REBASER_CONCURRENCY": "2"})
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "REBASER_" in r.getMessage()]
    assert said == [  # the known one is not said
        "REBASER_MAX_ATTEMTPS is set but rebaser-server does not read it (did you mean REBASER_MAX_ATTEMPTS?)"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "REBASER_" in r.getMessage())
    assert served[-1].settings.concurrency == 2


async def test_a_misspelled_variable_is_one_line_on_the_daemon_s_output(tmp_path: Path) -> None:
    # The daemon as an operator starts it: the line is on its output, before it fails to reach NATS.
    url = f"nats://127.0.0.1:{_free_port()}"
    env = {"REBASER_MAX_ATTEMTPS": "3"}
    code, output = await run_daemon(("--nats-url", url, "--http-port", "-1"), tmp_path, "daemon", 30, env=env)
    assert code != 0
    said = [line for line in output.splitlines() if "REBASER_MAX_ATTEMTPS" in line]
    assert len(said) == 1 and "did you mean REBASER_MAX_ATTEMPTS?" in said[0], output
    assert "Traceback" not in output


# -------------------------------------------------------------------------------------------- one-line mistakes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--app", "no_such_module:App"), {}, "cannot load --app no_such_module:App"),
        (("--app", "rebaser_server:Nope"), {}, "has no attribute 'Nope'"),
        ((), {"REBASER_READY_MAX_BACKLOG": "lots"}, "bad setting: ready_max_backlog"),
        (
            ("--ack-wait", "1", "--progress-period", "1"),
            {},
            "progress_period must be at most 0.25 x ack_wait",
        ),
        ((), {"REBASER_ACK_WAIT": "soon"}, "'soon' is not a valid float"),
    ],
    ids=[
        "unknown-app-module",
        "unknown-app-attribute",
        "bad-setting",
        "inconsistent-settings",
        "bad-flag-value",
    ],
)
async def test_operator_mistakes_are_one_line(
    args: tuple[str, ...], env: dict[str, str], expected: str, nats_url: str, tmp_path: Path
) -> None:
    full = ("--nats-url", nats_url, "--http-port", "-1", *args)
    code, output = await run_daemon(full, tmp_path, "daemon", timeout=30, env=env)
    assert code != 0
    assert expected in _one_line_error(output)
    assert "rebaser daemon serving" not in output


async def test_unreachable_nats_is_one_line(tmp_path: Path) -> None:
    url = f"nats://someone:secret@127.0.0.1:{_free_port()}"
    code, output = await run_daemon(("--nats-url", url, "--http-port", "-1"), tmp_path, "daemon", timeout=30)
    assert code != 0
    error = _one_line_error(output)
    assert "cannot connect to NATS at nats://***@127.0.0.1:" in error and "--nats-url" in error
    assert "secret" not in output
    assert len(output.strip().splitlines()) == 1, output  # not one warning per failed attempt either


# ---------------------------------------------------------------------------------------------------- JSON logs


async def test_json_logs_carry_the_request_ids(nats_url: str, subject_prefix: str, tmp_path: Path) -> None:
    async with daemon_processes() as daemons:
        daemon = await spawn_daemon(
            nats_url, subject_prefix, tmp_path, {}, "json", args=("--log-format", "json")
        )
        daemons.append(daemon)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with await RebaserClient.connect(nats_url, prefix=subject_prefix) as client:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/poison", value=1)], timeout=20
            )
        assert reply.status.kind == "error"

        def lines() -> list[dict[str, Any]]:
            return [json.loads(line) for line in daemon.log.read_text().splitlines() if line.strip()]

        def dead_letter_line() -> dict[str, Any] | None:
            return next((r for r in lines() if r["message"].startswith("dead-lettered request")), None)

        record = await wait_for(dead_letter_line, timeout=10, message="the dead letter was logged")
        assert record["level"] == "WARNING" and record["logger"] == "rebaser_server.changeset.replies"
        assert (record["request_id"], record["workspace_id"], record["change_set_id"]) == (
            str(reply.id),
            str(wk),
            str(cs),
        )
        assert record["time"].endswith("+00:00")
        daemon.terminate()
        assert await daemon.wait(30) == 0
    every = lines()  # every line the daemon wrote, start-up lines included, is a JSON object
    assert any("rebaser daemon serving" in r["message"] for r in every)
    assert any(r["message"].startswith("health endpoint on http://") for r in every)


# ------------------------------------------------------------------------------------------------- in a container


def test_the_embedded_server_binds_every_interface_only_when_asked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only binds loopback"):
        NatsServer(host="0.0.0.0")
    server = NatsServer(host="0.0.0.0", expose=True, store_dir=tmp_path / "nats")
    server.start()
    try:
        assert server.url == f"nats://127.0.0.1:{server.port}"  # where this machine reaches it
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            assert conn.recv(4).startswith(b"INFO")
    finally:
        server.stop()
