"""``rebaser-server`` at first contact: ``--help`` without the daemon's imports, a NATS URL with a scheme NATS does not
speak refused naming the schemes, and a bad value in the ``--config`` file named by the file and its key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rebaser_server.cli.config_file import settings_from
from rebaser_server.cli.main import DEV_CLUSTER_SUMMARY, NEW_APP_SUMMARY, main


def test_help_loads_neither_the_daemon_nor_nats() -> None:
    code = (
        "import contextlib, io, json, sys\n"
        "from rebaser_server.cli.main import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = {'nats', 'aiohttp', 'opentelemetry', 'rich'}\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & heavy)\n"
        "daemon = ('rebaser_server.daemon.daemon', 'rebaser_server.devtools', 'rebaser_server.cli.serve')\n"
        "ours = sorted(m for m in sys.modules if m.startswith(daemon))\n"
        "print(json.dumps({'loaded': loaded, 'ours': ours, 'help': out.getvalue()}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [] and result["ours"] == [], result
    assert "dev-cluster" in result["help"]


def test_the_dev_cluster_summary_is_its_help() -> None:
    from rebaser_server.devtools.devcluster_command import command

    assert (command.help or "").startswith(DEV_CLUSTER_SUMMARY)
    result = CliRunner().invoke(main, ["dev-cluster", "--help"])
    assert result.exit_code == 0 and "--daemons" in result.output  # imported when asked for


def test_the_new_app_summary_is_its_help() -> None:
    from rebaser_server.devtools.new_app import command

    assert (command.help or "").startswith(NEW_APP_SUMMARY)
    result = CliRunner().invoke(main, ["new-app", "--help"])
    assert result.exit_code == 0 and "--dir" in result.output  # imported when asked for


def test_the_health_endpoint_defaults_are_the_endpoint_s() -> None:
    from rebaser_server.daemon.config import ServerConfig
    from rebaser_server.ops.http import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT

    assert (ServerConfig.http_host, ServerConfig.http_port) == (DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT)


def test_a_nats_url_of_another_scheme_names_the_schemes() -> None:
    result = CliRunner().invoke(main, ["--nats-url", "http://127.0.0.1:4222"])
    assert result.exit_code == 2, result.output
    assert "http:// is not a NATS URL scheme" in result.output
    assert all(scheme in result.output for scheme in ("nats://", "tls://", "ws://", "wss://"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('concurrency = "abc"\n', "Invalid value for 'concurrency' in "),
        ('http-port = "nine"\n', "Invalid value for 'http-port' in "),
        ('nats-url = ["http://n1:4222"]\n', "Invalid value for 'nats-url' in "),
    ],
)
def test_a_bad_option_value_in_the_config_file_names_the_file_and_key(
    tmp_path: Path, content: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("REBASER_CONCURRENCY", "REBASER_HTTP_PORT", "REBASER_NATS_URL"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "rebaser.toml"
    config.write_text(content)
    result = CliRunner().invoke(main, ["--config", str(config), "--help"])  # refused before --help answers
    assert result.exit_code == 2, result.output
    assert expected + str(config) in " ".join(result.output.split())
    assert "env var" not in result.output


def test_one_nats_url_in_the_config_file_is_a_list_of_one(tmp_path: Path) -> None:
    config = tmp_path / "rebaser.toml"
    config.write_text('nats-url = "nats://127.0.0.1:4222"\n')
    result = CliRunner().invoke(main, ["--config", str(config), "--help"])
    assert result.exit_code == 0, result.output


def test_a_bad_setting_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REBASER_READY_MAX_BACKLOG", raising=False)
    monkeypatch.delenv("REBASER_ACK_WAIT", raising=False)
    with pytest.raises(click.ClickException) as caught:
        settings_from({"ready_max_backlog": "abc"}, config_path=Path("/etc/rebaser.toml"))
    assert "from 'ready_max_backlog' in /etc/rebaser.toml" in caught.value.message
    monkeypatch.setenv("REBASER_READY_MAX_BACKLOG", "xyz")  # the variable wins over the file, and is named
    with pytest.raises(click.ClickException) as caught:
        settings_from({"ready_max_backlog": "abc"}, config_path=Path("/etc/rebaser.toml"))
    assert "'xyz' from REBASER_READY_MAX_BACKLOG" in caught.value.message
    with pytest.raises(click.ClickException) as caught:
        settings_from({}, ack_wait=-1.0)
    assert "from --ack-wait" in caught.value.message


def test_the_http_token_comes_from_its_option_or_its_file(tmp_path: Path) -> None:
    from rebaser_server.cli.option_groups import http_token_from

    secret = tmp_path / "token"
    secret.write_text("  from-a-file \n# ignored\n")
    assert http_token_from(None, secret) == "from-a-file"
    assert http_token_from(" given ", None) == "given" and http_token_from(None, None) is None
    (tmp_path / "empty").write_text("\n")
    for token, path in (("a", secret), ("  ", None), (None, tmp_path / "empty")):
        with pytest.raises(click.UsageError):
            http_token_from(token, path)
