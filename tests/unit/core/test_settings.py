"""Settings: defaults, validation, the environment, and the stream configurations derived from them."""

from __future__ import annotations

import pytest
from nats.js import api as js_api
from pydantic import ValidationError

from rebaser_core.nats.streams import (
    dead_letter_stream_config,
    requests_stream_config,
    tasks_consumer_config,
    tasks_stream_config,
)
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects

NS = 1_000_000_000


# -- defaults and validation ------------------------------------------------------------------------------------


def test_defaults() -> None:
    s = Settings()
    assert s.prefix is None
    assert s.replicas == 1
    assert s.storage == "file"
    assert s.duplicate_window == 120.0
    assert s.requests_max_msgs == 1_000_000 and s.tasks_max_msgs == 1_000_000
    assert s.requests_max_bytes == -1
    assert s.requests_max_msgs_per_change_set == -1
    assert s.requests_max_age == 0.0
    assert s.dead_letter_max_age == 14 * 86400.0
    assert s.max_active_change_sets == 10_000
    assert s.ack_wait == 2.5
    assert s.progress_period == 0.5
    assert s.progress_period <= 0.25 * s.ack_wait
    assert s.nats_timeout == 5.0
    assert s.lease_margin == 0.5
    assert s.quiescent_period == 60.0
    assert s.handler_deadline == 120.0
    assert s.concurrency == 500
    assert s.retry_backoff == 1.0
    assert s.retry_backoff_max == 60.0
    assert s.max_attempts == 5
    assert s.sweep_interval == 30.0
    assert s.shutdown_grace == 10.0
    assert s.idempotency_window == 64
    assert s.subjects == Subjects()


def test_settings_are_frozen_and_refuse_unknown_fields() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.ack_wait = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Settings(ackwait=5.0)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("progress_period", "ack_wait"),
    [(30.0, 30.0), (31.0, 30.0), (2.0, 1.0), (0.5, 1.0), (0.4, 1.0), (0.26, 1.0), (1.0, 2.5)],
)
def test_progress_period_over_two_renewals_per_lease_is_refused(
    progress_period: float, ack_wait: float
) -> None:
    with pytest.raises(ValidationError, match=r"progress_period must be at most 0\.25 x ack_wait"):
        Settings(progress_period=progress_period, ack_wait=ack_wait)


def test_progress_period_of_two_renewals_per_lease_is_accepted() -> None:
    s = Settings(progress_period=0.25, ack_wait=1.0)
    assert (s.progress_period, s.ack_wait) == (0.25, 1.0)


def test_a_long_ack_wait_with_the_default_progress_period() -> None:
    assert Settings(ack_wait=60.0).progress_period == 0.5
    with pytest.raises(ValidationError):
        Settings(ack_wait=1.0)  # the default progress period (0.5 s) would renew the lease too rarely


@pytest.mark.parametrize(
    "field_values",
    [
        {"replicas": 0},
        {"replicas": 6},
        {"storage": "disk"},
        {"duplicate_window": 0},
        {"ack_wait": 0},
        {"ack_wait": -1},
        {"progress_period": 0},
        {"quiescent_period": 0},
        {"max_active_change_sets": 0},
        {"concurrency": 0},
        {"max_attempts": 0},
        {"idempotency_window": 7},
        {"requests_max_age": -1},
        {"shutdown_grace": -0.1},
    ],
)
def test_out_of_range_values_are_refused(field_values: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings.model_validate(field_values)


@pytest.mark.parametrize("prefix", ["a.b", "a b", "*", ">", "a..b"])
def test_invalid_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValidationError):
        Settings(prefix=prefix)


def test_prefix_reaches_the_subjects() -> None:
    assert Settings(prefix="t1").subjects == Subjects("t1")
    assert Settings(prefix="").prefix is None


# -- the environment --------------------------------------------------------------------------------------------


def test_from_env_reads_rebaser_variables() -> None:
    env = {
        "REBASER_PREFIX": "t1",
        "REBASER_ACK_WAIT": "60",
        "REBASER_PROGRESS_PERIOD": "10.5",
        "REBASER_STORAGE": "memory",
        "REBASER_REPLICAS": "3",
        "REBASER_MAX_ACTIVE_CHANGE_SETS": "42",
        "REBASER_QUIESCENT_PERIOD": "0.25",
        "REBASER_REQUESTS_MAX_MSGS_PER_CHANGE_SET": "100",
        "UNRELATED": "x",
        "REBASER_NOT_A_SETTING": "ignored",
        "rebaser_concurrency": "7",  # names are upper case
    }
    s = Settings.from_env(env)
    assert s.prefix == "t1"
    assert s.ack_wait == 60.0
    assert s.progress_period == 10.5
    assert s.storage == "memory"
    assert s.replicas == 3
    assert s.max_active_change_sets == 42
    assert s.quiescent_period == 0.25
    assert s.requests_max_msgs_per_change_set == 100
    assert s.concurrency == 500
    assert s.subjects.tasks_stream == "t1_REBASER_TASKS"


def test_from_env_without_variables_gives_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBASER_CONCURRENCY", "12")
    monkeypatch.setenv("REBASER_PREFIX", "envtest")
    monkeypatch.delenv("REBASER_ACK_WAIT", raising=False)
    monkeypatch.delenv("REBASER_PROGRESS_PERIOD", raising=False)
    s = Settings.from_env()
    assert s.concurrency == 12
    assert s.prefix == "envtest"


def test_from_env_overrides_win_and_none_overrides_are_ignored() -> None:
    env = {"REBASER_CONCURRENCY": "12", "REBASER_PREFIX": "fromenv"}
    s = Settings.from_env(env, concurrency=3, prefix=None, storage="memory")
    assert s.concurrency == 3
    assert s.prefix == "fromenv"
    assert s.storage == "memory"


@pytest.mark.parametrize(
    "env",
    [
        {"REBASER_ACK_WAIT": "soon"},
        {"REBASER_ACK_WAIT": ""},
        {"REBASER_CONCURRENCY": "1.5"},
        {"REBASER_PREFIX": "a.b"},
        {"REBASER_PROGRESS_PERIOD": "40"},  # not shorter than the default ack_wait
    ],
)
def test_from_env_refuses_bad_values(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Settings.from_env(env)


# -- stream and consumer configurations ---------------------------------------------------------------------------


@pytest.fixture(params=[None, "P"], ids=["no-prefix", "prefix"])
def settings(request: pytest.FixtureRequest) -> Settings:
    return Settings(
        prefix=request.param,
        ack_wait=45.0,
        progress_period=9.0,
        max_active_change_sets=1234,
        replicas=3,
        storage="memory",
        duplicate_window=90.0,
    )


def _p(settings: Settings, name: str, sep: str) -> str:
    return f"{settings.prefix}{sep}{name}" if settings.prefix else name


def test_tasks_stream_is_a_work_queue_with_one_task_per_change_set(settings: Settings) -> None:
    c = tasks_stream_config(settings)
    assert c.name == _p(settings, "REBASER_TASKS", "_")
    assert c.subjects == [_p(settings, "rebaser.tasks.*.*.process", ".")]
    assert c.retention == js_api.RetentionPolicy.WORK_QUEUE
    assert c.discard == js_api.DiscardPolicy.NEW
    assert c.max_msgs_per_subject == 1
    assert c.discard_new_per_subject is True
    assert c.storage == js_api.StorageType.MEMORY
    assert c.num_replicas == 3
    assert c.duplicate_window == 90.0
    assert c.as_dict()["duplicate_window"] == 90 * NS


def test_requests_stream_keeps_requests_and_refuses_new_ones_when_full(settings: Settings) -> None:
    c = requests_stream_config(settings)
    assert c.name == _p(settings, "REBASER_REQUESTS", "_")
    assert c.subjects == [_p(settings, "rebaser.requests.*.*", ".")]
    assert c.retention == js_api.RetentionPolicy.LIMITS
    assert c.discard == js_api.DiscardPolicy.NEW
    assert c.allow_direct is True
    assert c.storage == js_api.StorageType.MEMORY
    assert c.num_replicas == 3
    assert c.duplicate_window == 90.0
    # One ordered consumer per active change set, plus headroom.
    assert c.max_consumers is not None
    assert c.max_consumers > settings.max_active_change_sets
    # No per-change-set cap by default.
    assert c.max_msgs_per_subject == -1
    assert c.discard_new_per_subject is False
    # A message cap by default (it costs nothing until reached); no byte cap (nats-server reserves one up front).
    assert c.max_msgs == 1_000_000
    assert c.max_bytes == -1


def test_the_tasks_stream_is_bounded_and_its_bounds_split_over_the_shards() -> None:
    c = tasks_stream_config(Settings(), 0, 1)
    assert (c.max_msgs, c.max_bytes, c.discard) == (1_000_000, -1, js_api.DiscardPolicy.NEW)
    c = tasks_stream_config(Settings(tasks_max_msgs=900, tasks_max_bytes=9000), 1, 3)
    assert (c.max_msgs, c.max_bytes, c.max_msgs_per_subject) == (300, 3000, 1)


def test_requests_stream_carries_the_backlog_limits() -> None:
    s = Settings(
        requests_max_msgs_per_change_set=5,
        requests_max_msgs=1000,
        requests_max_bytes=2**20,
        requests_max_age=3600.0,
    )
    c = requests_stream_config(s)
    assert c.max_msgs_per_subject == 5
    assert c.discard_new_per_subject is True
    assert c.max_msgs == 1000
    assert c.max_bytes == 2**20
    assert c.max_age == 3600.0
    assert c.as_dict()["max_age"] == 3600 * NS


def test_dead_letter_stream(settings: Settings) -> None:
    c = dead_letter_stream_config(settings)
    assert c.name == _p(settings, "REBASER_DEAD_LETTERS", "_")
    assert c.subjects == [_p(settings, "dlq.rebaser.requests.>", ".")]
    assert c.retention == js_api.RetentionPolicy.LIMITS
    assert c.max_age == settings.dead_letter_max_age
    assert c.num_replicas == 3


def test_tasks_consumer_is_shared_durable_and_capped_by_max_active_change_sets(settings: Settings) -> None:
    c = tasks_consumer_config(settings)
    assert c.durable_name == "rebaser-tasks"
    assert c.filter_subject == _p(settings, "rebaser.tasks.*.*.*", ".")
    assert c.max_ack_pending == settings.max_active_change_sets == 1234
    assert c.ack_policy == js_api.AckPolicy.EXPLICIT
    assert c.ack_wait == 45.0
    assert c.as_dict()["ack_wait"] == 45 * NS
    assert c.deliver_policy == js_api.DeliverPolicy.ALL
    assert c.max_deliver == -1  # a task is a lock; max_deliver would strand it in the work queue
    assert c.num_replicas == 3


def test_file_storage_is_the_default() -> None:
    s = Settings()
    for config in (requests_stream_config(s), tasks_stream_config(s), dead_letter_stream_config(s)):
        assert config.storage == js_api.StorageType.FILE
        assert config.num_replicas == 1
        assert config.duplicate_window == 120.0
