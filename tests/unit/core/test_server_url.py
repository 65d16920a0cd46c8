"""NATS server URLs are checked where they are given: a scheme nats-py does not speak (``http://``) is refused naming
the ones it does, instead of surfacing as a failed name lookup of ``http``."""

from __future__ import annotations

import pytest

from rebaser_client import RebaserClient
from rebaser_core.errors import InvalidUrl, RebaserError
from rebaser_core.nats.connect import SERVER_URL_SCHEMES, ConnectOptions, check_server_url


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:4222",
        "tls://n1.example:4443",
        "ws://n1:8080",
        "wss://user:pw@n1:443/path",
        "nats://alice:s3cret@n1",
        "n1:4222",  # no scheme: nats-py reads nats://
        "n1",
        "[::1]:4222",
    ],
)
def test_urls_nats_py_connects_with_are_accepted(url: str) -> None:
    assert check_server_url(url) == url
    assert ConnectOptions(servers=(url,)).servers == (url,)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:4222", "http:// is not a NATS URL scheme"),
        ("https://n1:4222", "https:// is not a NATS URL scheme"),
        ("NATS://n1:4222", "NATS:// is not a NATS URL scheme"),
        ("://n1:4222", "an empty scheme is not a NATS URL scheme"),
        ("nats://n1:port", "is not a NATS server URL"),
        ("nats://", "names no host"),
    ],
)
def test_other_urls_are_refused_saying_why(url: str, expected: str) -> None:
    with pytest.raises(InvalidUrl, match=expected) as caught:
        check_server_url(url)
    assert isinstance(caught.value, RebaserError) and isinstance(caught.value, ValueError)
    if "scheme" in expected:
        assert all(f"{scheme}://" in str(caught.value) for scheme in SERVER_URL_SCHEMES)
    with pytest.raises(InvalidUrl):
        ConnectOptions(servers=("nats://n1:4222", url))


def test_the_refusal_shows_no_credentials() -> None:
    with pytest.raises(InvalidUrl) as caught:
        check_server_url("http://alice:s3cret@n1:4222")
    assert "s3cret" not in str(caught.value) and "***@n1:4222" in str(caught.value)


async def test_the_python_client_refuses_before_connecting() -> None:
    with pytest.raises(InvalidUrl, match="use one of nats://, tls://, ws://, wss://"):
        await RebaserClient.connect("http://127.0.0.1:4222")
