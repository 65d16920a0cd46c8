"""The request consumer's CONSUMER.CREATE config, built from a cached template at every activation and reset."""

from __future__ import annotations

import pytest

from rebaser_server.changeset.consumer import _config_template, consumer_config, nats_config


@pytest.mark.parametrize("start", [None, 1, 12_345])
@pytest.mark.parametrize("heartbeat", [0.2, 5.0, 3600.0])
def test_the_config_is_the_one_nats_py_would_send(start: int | None, heartbeat: float) -> None:
    for subject, inbox in (("p.requests.0.wk.cs", "_INBOX.a"), ("other.requests.3.x.y", "_INBOX.b")):
        sent = consumer_config(subject, inbox, heartbeat=heartbeat, start=start)
        assert sent == nats_config(subject, inbox, heartbeat=heartbeat, start=start).as_dict()


def test_the_template_is_not_changed_by_its_users() -> None:
    before = dict(_config_template())
    consumer_config("a.b", "_INBOX.c", heartbeat=1.0, start=7)
    assert _config_template() == before and "<filter>" in before.values()
