"""The request consumer's CONSUMER.CREATE config, built from a cached template at every activation."""

from __future__ import annotations

from rebaser_server.consumer import _config_template, _consumer_config


def test_the_template_gives_the_config_nats_py_would_send() -> None:
    for subject, deliver in (("p.requests.0.wk.cs", "_INBOX.a"), ("other.requests.3.x.y", "_INBOX.b")):
        sent = dict(_config_template(), filter_subject=subject)
        sent["deliver_subject"] = deliver
        assert sent == _consumer_config(subject, deliver).as_dict()


def test_the_template_is_not_changed_by_its_users() -> None:
    before = dict(_config_template())
    config = dict(_config_template(), filter_subject="a.b")
    config["deliver_subject"] = "_INBOX.c"
    assert _config_template() == before and "<filter>" in before.values()
