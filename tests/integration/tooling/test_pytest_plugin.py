"""The pytest plugin (entry point ``pytest11``) as an application's test suite uses it: ``pytester`` runs a small
user project in a pytest of its own, with a custom app chosen by marker, ini option or fixture override, from
sync tests without pytest-asyncio and from an async test with it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

MYAPP = """
from rebaser_server.apps.snapshots import SnapshotApp


def make_app():
    app = SnapshotApp()
    app.register_function("shout", lambda args: str(args[0]).upper() + "!")
    return app
"""

# Shared by the user's tests: one request with the app's own function, and the value it computed.
HELPERS = """
import time

from rebaser_client import ChangeSetId, SetFunction, SetLiteral, WorkspacePk

UPDATES = [SetLiteral(path="/name", value="web"), SetFunction(path="/loud", function="shout", args=["/name"])]


def computed(client, workspace, change_set):
    deadline = time.monotonic() + 20  # dependent values are computed after the reply: wait for them
    while True:
        values = client.get_change_set(workspace, change_set).values
        if values.get("/loud") == "WEB!" or time.monotonic() > deadline:
            return values.get("/loud")
        time.sleep(0.05)
"""

SYNC_TESTS = """
import pytest
from helpers import UPDATES, computed
from myapp import make_app
from rebaser_client import ChangeSetId, WorkspacePk


@pytest.mark.rebaser_app("myapp:make_app")
def test_app_by_marker(rebaser_client, rebaser_daemon):
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    reply = rebaser_client.enqueue_updates_with_reply(wk, cs, UPDATES, timeout=30)
    assert reply.ok, reply
    assert computed(rebaser_client, wk, cs) == "WEB!"
    assert "shout" in rebaser_daemon.app.functions
    assert rebaser_daemon.daemon.stats.requests_applied >= 1


@pytest.mark.rebaser_app.with_args(make_app)  # a callable alone would be decorated
def test_app_object_by_marker(rebaser_client):
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    assert rebaser_client.enqueue_updates_with_reply(wk, cs, UPDATES, timeout=30).ok


def test_default_app(rebaser_client, request):
    reply = rebaser_client.enqueue_updates_with_reply(WorkspacePk.new(), ChangeSetId.new(), UPDATES, timeout=30)
    expected_ok = request.config.getini("rebaser_app") == "myapp:make_app"
    assert reply.ok == expected_ok, reply  # the built-in app does not know "shout"


def test_each_test_has_its_own_prefix(rebaser_daemon, rebaser_prefix, rebaser_nats):
    assert rebaser_daemon.prefix == rebaser_prefix and rebaser_daemon.nats_url == rebaser_nats
"""

ASYNC_TESTS = """
import pytest
from helpers import UPDATES
from rebaser_client import ChangeSetId, WorkspacePk


@pytest.fixture
def rebaser_app():  # overriding the fixture is the third way to choose the app
    from myapp import make_app

    return make_app()


@pytest.mark.asyncio
async def test_async_client(rebaser_daemon):
    async with rebaser_daemon.client() as client:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await client.enqueue_updates_with_reply(wk, cs, UPDATES, timeout=30)
        assert reply.ok, reply
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(myapp=MYAPP, helpers=HELPERS, test_sync=SYNC_TESTS, test_async=ASYNC_TESTS)
    return pytester


def test_sync_tests_without_pytest_asyncio(project: pytest.Pytester) -> None:
    # Warnings are errors, as they should be in a user's suite: the plugin leaves no loop or thread unclosed.
    project.makeini("[pytest]\nfilterwarnings = error\n")
    result = project.runpytest_subprocess(
        "-p", "no:asyncio", "-p", "no:cacheprovider", "test_sync.py", timeout=110
    )
    result.assert_outcomes(passed=4)


def test_app_by_ini_option_and_an_async_test(project: pytest.Pytester) -> None:
    project.makeini(
        "[pytest]\nrebaser_app = myapp:make_app\nfilterwarnings = error\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", timeout=110)
    result.assert_outcomes(passed=5)


def test_a_bad_app_is_a_one_line_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
import pytest

@pytest.mark.rebaser_app("no_such_module:App")
def test_it(rebaser_daemon):
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:asyncio", timeout=60)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.rebaser_app: cannot load 'no_such_module:App': ModuleNotFoundError*"]
    )
    result.stdout.no_fnmatch_line("*Traceback*")


def test_the_plugin_imports_no_dev_extra_and_no_nats() -> None:
    """pytest loads it in every run of an environment with rebaser installed: it must import cheaply, and never
    what only the dev extras provide."""
    code = (
        "import sys\n"
        "for name in ('pytest_asyncio', 'pytest_timeout', 'hypothesis'):\n"
        "    sys.modules[name] = None  # importing it now raises ImportError\n"
        "import rebaser_server.testing.pytest_plugin\n"
        "heavy = [m for m in ('nats', 'rebaser_server.daemon.daemon', 'rebaser_client') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_plugin_is_registered_for_pytest() -> None:
    found = [ep.value for ep in entry_points(group="pytest11") if ep.name == "rebaser"]
    assert found == ["rebaser_server.testing.pytest_plugin"], "reinstall the package: pip install -e '.[dev]'"
