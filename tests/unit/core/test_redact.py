"""Credentials in NATS URLs and connect options are never shown."""

from __future__ import annotations

import pytest

from rebaser_core.nats.connect import ConnectOptions, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://alice:s3cret@n1:4222", "nats://***@n1:4222"),
        ("nats://tok3n@n1:4222", "nats://***@n1:4222"),
        ("tls://al:p@ss@word@n1:4222", "tls://***@n1:4222"),
        ("alice:s3cret@n1:4222", "***@n1:4222"),
        ("alice:s3cret@127.0.0.1:4222", "***@127.0.0.1:4222"),
        ("nats://n1:4222", "nats://n1:4222"),
        ("n1:4222", "n1:4222"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_connect_options_repr_shows_no_credentials() -> None:
    options = ConnectOptions(
        servers=("nats://alice:s3cret@n1:4222",), user="bob", password="hunter2", token="t0k"
    )
    text = repr(options)
    assert "s3cret" not in text and "hunter2" not in text and "t0k" not in text and "alice" not in text
    assert "n1:4222" in text and "user='bob'" in text
