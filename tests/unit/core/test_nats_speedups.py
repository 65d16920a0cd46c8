"""rebaser_core.nats.speedups does exactly what nats-py's own header routines do: same bytes, same dicts, same
errors. Compared against nats-py's code on the same inputs (hypothesis), and every code point for the whitespace
rule."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats import errors
from nats.aio.client import Client as NatsClient

from rebaser_core.nats import speedups as nats_speedups

_original_parse = NatsClient._parse_header_lines

# Header names: valid tokens, names with spaces around them, empty ones, invalid ones; values: any text, with
# CR/LF and surrounding white space.
_names = st.one_of(
    st.from_regex(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,20}", fullmatch=True),
    st.sampled_from(["X-CONTENT-TYPE", "Nats-Msg-Id", " padded ", "", "   "]),
    st.text(max_size=12),
)
_values = (
    st.text(max_size=40)
    | st.text(
        min_size=129, max_size=300
    )  # longer than the cached values: a record's event window takes this path
    | st.sampled_from(
        ["a\r\nb", " x ", "\n", "application/cbor", " " + "w\r" * 100 + "\n", "\r\n" + "z" * 150 + " "]
    )
)


class _Recorder:
    """Just enough of a nats-py client for _send_publish: records the command it would send."""

    def __init__(self) -> None:
        self.stats = {"out_msgs": 0, "out_bytes": 0}
        self.sent: list[bytes] = []
        self._flush_queue = None

    async def _send_command(self, cmd: bytes, priority: bool = False) -> None:
        self.sent.append(cmd)

    async def _flush_pending(self, force_flush: bool = False) -> None:
        return None


def _send(fn: Any, headers: dict[str, Any] | None) -> tuple[str, bytes | None, dict[str, int]]:
    """Run a _send_publish on a recorder: what it raised (or ""), what it sent and its stats."""
    rec = _Recorder()
    try:
        asyncio.run(fn(rec, "subj.a", "_INBOX.r", b"payload", 7, headers))
    except Exception as err:
        return type(err).__name__, None, rec.stats
    return "", rec.sent[0], rec.stats


def test_the_installed_nats_py_is_the_one_mirrored() -> None:
    # If this fails, nats-py changed: install() leaves connections alone (safe), and the speed-up is lost. Read
    # the new nats-py's _send_publish and _parse_header_lines, and update nats_speedups to match them.
    assert nats_speedups._compatible(NatsClient)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_names, _values, max_size=8))
def test_publish_bytes_and_errors_match_nats_py(headers: dict[str, str]) -> None:
    assert _send(nats_speedups._send_publish, headers) == _send(NatsClient._send_publish, headers)


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"bad name": "x"},
        {"ok": None},
        {"ok": ["unhashable"]},
        {"a": "1", "b:c": "2"},
        {"Nats-Msg-Id": "id", "X": "v\r\n"},
    ],
)
def test_publish_edge_cases_match_nats_py(headers: dict[str, Any] | None) -> None:
    assert _send(nats_speedups._send_publish, headers) == _send(NatsClient._send_publish, headers)


def test_cached_lines_are_the_lines_of_their_values() -> None:
    # The same names with many values, some cached and some not: every block still matches nats-py's.
    for i in range(40):
        headers = {"X-Seen-Often": f"v{i % 3}", "X-Always-New": f"id-{i}", "X-Long": "x" * (100 + i)}
        assert _send(nats_speedups._send_publish, headers) == _send(NatsClient._send_publish, headers)


def test_a_bad_header_name_is_refused_every_time() -> None:
    # A refused name is never cached as good.
    for _ in range(2):
        with pytest.raises(errors.BadHeaderError):
            nats_speedups.header_block({"no spaces inside": "x"})


_raw_lines = st.lists(
    st.one_of(
        st.tuples(_names, _values).map(lambda kv: f"{kv[0]}: {kv[1]}".encode("utf-8", "surrogatepass")),
        st.binary(max_size=30),
        st.sampled_from([b"", b"no-colon", b"K:V", b"K:\tV", b"\xff\xfe: x", b"a b: c", b"k\x1c: v"]),
    ),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(_raw_lines)
def test_parsing_matches_nats_py(lines: list[bytes]) -> None:
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    assert nats_speedups.parse_header_lines(raw) == _original_parse(raw)


def test_the_whitespace_rule_is_str_isspace() -> None:
    pattern = re.compile(r"\s")
    differ = [c for c in range(sys.maxunicode + 1) if chr(c).isspace() != bool(pattern.search(chr(c)))]
    assert differ == []


def test_install_sets_the_connection_not_the_class() -> None:
    nc = NatsClient()
    assert nats_speedups.install(nc)
    assert nc._parse_header_lines is nats_speedups.parse_header_lines
    assert NatsClient._parse_header_lines is _original_parse
    assert NatsClient().__dict__.get("_send_publish") is None


def test_install_leaves_another_client_alone() -> None:
    class Other(NatsClient):
        async def _send_publish(self, *args: Any) -> None:  # another signature: not the mirrored code
            raise AssertionError

    nc = Other()
    assert not nats_speedups.install(nc)
    assert "_send_publish" not in nc.__dict__
