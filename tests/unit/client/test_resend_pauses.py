"""The client's resend of an unanswered request publish (rebaser_client._publisher.resend_pauses), as pure logic: the
first after 2 s, then doubling up to 8 s, each pause jittered so that many callers do not resend at once."""

from __future__ import annotations

import itertools

from rebaser_client._publisher import _RESEND_AFTER, _RESEND_JITTER, _RESEND_MAX, resend_pauses


def test_the_pauses_double_from_the_first_up_to_the_cap() -> None:
    assert (_RESEND_AFTER, _RESEND_MAX) == (2.0, 8.0)
    pauses = list(itertools.islice(resend_pauses(), 10))
    for i, pause in enumerate(pauses):
        wanted = min(_RESEND_AFTER * 2**i, _RESEND_MAX)
        assert wanted * (1 - _RESEND_JITTER) <= pause <= wanted * (1 + _RESEND_JITTER), (i, pauses)
    # Growing until the cap (the doubling outruns the jitter), however the jitter falls.
    assert pauses[0] < pauses[1] < pauses[2]


def test_the_pauses_are_jittered() -> None:
    firsts = {next(resend_pauses()) for _ in range(100)}
    assert len(firsts) > 50
    assert min(firsts) < _RESEND_AFTER < max(firsts)
