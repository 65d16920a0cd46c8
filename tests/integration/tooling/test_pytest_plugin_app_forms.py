"""Every form of choosing the app for the pytest plugin's ``rebaser_daemon`` fixture: a class, an app object, a
factory, a ``"module:attr"`` string, and the ``rebaser_app`` ini option, each against a real daemon (``pytester``
runs a small user project in a pytest of its own); and what is none of these fails in one line.

A class is the delicate form: ``RebaserApp`` is a runtime-checkable protocol, so ``isinstance(CounterApp, RebaserApp)``
is true of the class itself, and a plugin that asked that first would hand the class to the daemon
(``CounterApp.start() missing 1 required positional argument``)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# The user's app module: the built-in counter app as an object and a factory, and a class of its own (to tell the
# marker's app from the ini option's).
MYAPPS = """
from rebaser_server.apps.counter import CounterApp

INSTANCE = CounterApp()


def make_counter():
    return CounterApp()


class DoubleCounter(CounterApp):
    pass
"""

# One request against the daemon, and its reply: the counter app reports how many updates it counted.
ONE_REQUEST = """
from rebaser_client import ChangeSetId, SetLiteral, WorkspacePk


def one_request(client):
    updates = [SetLiteral(path="/a", value=1), SetLiteral(path="/b", value=2)]
    reply = client.enqueue_updates_with_reply(WorkspacePk.new(), ChangeSetId.new(), updates, timeout=30)
    assert reply.ok, reply
    assert reply.status.updates_performed == 2, reply
"""

MARKER_TESTS = """
import pytest
from myapps import INSTANCE, make_counter
from one_request import one_request
from rebaser_server.apps.counter import CounterApp

seen = []


@pytest.mark.rebaser_app.with_args(CounterApp)
def test_class(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp
    one_request(rebaser_client)
    seen.append(rebaser_daemon.app)


@pytest.mark.rebaser_app.with_args(CounterApp)
def test_class_makes_a_new_app_per_test(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp and all(app is not rebaser_daemon.app for app in seen)
    one_request(rebaser_client)


@pytest.mark.rebaser_app.with_args(INSTANCE)
def test_instance_with_args(rebaser_daemon, rebaser_client):
    assert rebaser_daemon.app is INSTANCE
    one_request(rebaser_client)


@pytest.mark.rebaser_app(INSTANCE)  # not callable: the mark takes it as its argument, no with_args needed
def test_instance(rebaser_daemon, rebaser_client):
    assert rebaser_daemon.app is INSTANCE
    one_request(rebaser_client)


@pytest.mark.rebaser_app.with_args(make_counter)
def test_factory(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp
    one_request(rebaser_client)


@pytest.mark.rebaser_app("rebaser_server.apps.counter:CounterApp")
def test_string_naming_a_class(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp
    one_request(rebaser_client)


@pytest.mark.rebaser_app("myapps:make_counter")
def test_string_naming_a_factory(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp
    one_request(rebaser_client)
"""

INI_TESTS = """
import pytest
from myapps import DoubleCounter
from one_request import one_request
from rebaser_server.apps.counter import CounterApp


def test_app_of_the_ini_option(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is CounterApp
    one_request(rebaser_client)


@pytest.mark.rebaser_app.with_args(DoubleCounter)
def test_the_marker_wins_over_the_ini_option(rebaser_daemon, rebaser_client):
    assert type(rebaser_daemon.app) is DoubleCounter
    one_request(rebaser_client)
"""

# None of these needs the daemon: the app is resolved (and refused) before any server starts.
BAD_TESTS = """
import pytest
from rebaser_server.apps.counter import CounterApp


class NeedsArguments(CounterApp):
    def __init__(self, store):
        self.store = store


@pytest.mark.rebaser_app(42)
def test_not_an_app(rebaser_app):
    pass


@pytest.mark.rebaser_app.with_args(dict)
def test_a_class_that_is_not_an_app(rebaser_app):
    pass


@pytest.mark.rebaser_app.with_args(lambda: CounterApp)
def test_a_factory_returning_a_class(rebaser_app):
    pass


@pytest.mark.rebaser_app.with_args(NeedsArguments)
def test_a_class_needing_arguments(rebaser_app):
    pass


@pytest.mark.rebaser_app("rebaser_server.apps.counter")
def test_a_string_without_attribute(rebaser_app):
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(myapps=MYAPPS, one_request=ONE_REQUEST)
    return pytester


def test_each_form_of_the_marker_runs_the_app(project: pytest.Pytester) -> None:
    project.makepyfile(test_marker_forms=MARKER_TESTS)
    project.makeini("[pytest]\nfilterwarnings = error\n")
    result = project.runpytest_subprocess(
        "-p", "no:asyncio", "-p", "no:cacheprovider", "test_marker_forms.py", timeout=110
    )
    result.assert_outcomes(passed=7)


def test_a_class_named_by_the_ini_option_runs(project: pytest.Pytester) -> None:
    project.makepyfile(test_ini_form=INI_TESTS)
    project.makeini(
        "[pytest]\nrebaser_app = rebaser_server.apps.counter:CounterApp\nfilterwarnings = error\n"
    )
    result = project.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider", timeout=110)
    result.assert_outcomes(passed=2)


def test_what_is_no_app_is_a_one_line_failure(project: pytest.Pytester) -> None:
    project.makepyfile(test_bad_forms=BAD_TESTS)
    result = project.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(errors=5)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.rebaser_app: 42 (int) is not a rebaser app, nor a class or factory making one, nor a "
            "'module:attr' string",
            "*@pytest.mark.rebaser_app: <class 'dict'> (type) made {} (dict), which is not a rebaser app*",
            "*@pytest.mark.rebaser_app: <function <lambda> at *> (function) made "
            "<class 'rebaser_server.apps.counter.CounterApp'> (type), which is not a rebaser app*",
            "*@pytest.mark.rebaser_app: cannot load <class 'test_bad_forms.NeedsArguments'> (type): TypeError: *",
            "*@pytest.mark.rebaser_app: cannot load 'rebaser_server.apps.counter': ValueError: *",
        ]
    )
    result.stdout.no_fnmatch_line("*Traceback*")


def test_a_bad_ini_option_is_a_one_line_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad_ini="def test_it(rebaser_app):\n    pass\n")
    pytester.makeini("[pytest]\nrebaser_app = rebaser_server.apps.counter:NoSuchApp\n")
    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*ini option rebaser_app: cannot load 'rebaser_server.apps.counter:NoSuchApp': AttributeError: *"]
    )
    result.stdout.no_fnmatch_line("*Traceback*")
