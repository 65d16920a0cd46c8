"""``rebaser`` answers at once: importing the command line, ``--help`` and option parsing load neither nats-py nor
aiohttp, pydantic or rich (each command imports what it uses), and a command that talks to NATS loads aiohttp only
if it connects by WebSocket. Each check runs in a fresh interpreter; ``scripts/cli_timings.py`` measures the times.
"""

from __future__ import annotations

import json
import subprocess
import sys

# What a command pays for only when it uses it (nats-py brings aiohttp; the wire models are pydantic).
_HEAVY = ("nats", "aiohttp", "pydantic", "pydantic_core", "rich", "opentelemetry", "ulid")


def _run(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


_LOADED = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({_HEAVY!r}))"


def test_importing_the_cli_loads_nothing_heavy() -> None:
    # What made the import slow (0.7 s against 0.1 s) was the heavy modules; how long it takes is a benchmark's to say
    # (scripts/cli_timings.py): a bound on the time failed on a machine busy with other work (1.5 s).
    result = _run(
        f"import json, sys\nimport rebaser_client.admin.cli.main\nprint(json.dumps({{'loaded': {_LOADED}}}))\n"
    )
    assert result["loaded"] == [], f"importing rebaser_client.admin.cli.main loaded {result['loaded']}"


def test_help_and_option_parsing_load_nothing_heavy() -> None:
    # --help of the group and of subcommands, and a command refused at its options (an id that is none, a URL
    # that is not NATS's): nothing of it needs more than click.
    result = _run(
        "import contextlib, io, json, sys\n"
        "from rebaser_client.admin.cli.main import main\n"
        "codes = []\n"
        "for args in (['--help'], ['dlq', 'replay', '--help'], ['streams', 'set', '--help'],\n"
        "             ['change-set', 'show', 'not-an-id', 'x'], ['status', '--nats-url', 'http://127.0.0.1:1']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main(args)\n"
        "        except SystemExit as exit:\n"
        "            codes.append(exit.code)\n"
        f"print(json.dumps({{'codes': codes, 'loaded': {_LOADED}}}))\n"
    )
    assert result["codes"] == [0, 0, 0, 2, 2]
    assert result["loaded"] == [], f"rebaser --help loaded {result['loaded']}"


def test_nats_py_defers_aiohttp_to_its_first_use() -> None:
    result = _run(
        "import json, sys\n"
        "from rebaser_client.admin.cli.lazy_imports import defer_aiohttp\n"
        "defer_aiohttp()\n"
        "import nats.aio.client\n"
        "from nats.aio import transport\n"
        "before = 'aiohttp' in sys.modules\n"
        "session = transport.aiohttp.ClientSession  # what a ws:// connection uses first\n"
        "import aiohttp\n"
        "print(json.dumps({'before': before, 'after': 'aiohttp' in sys.modules,\n"
        "                  'same': session is aiohttp.ClientSession}))\n"
    )
    assert result["before"] is False  # nats-py imported without it
    assert result["after"] is True and result["same"] is True  # and the real one is there once used
