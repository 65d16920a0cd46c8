"""The reply-inbox rule: the only subjects the daemon publishes to on a caller's say-so."""

from __future__ import annotations

import pytest

from rebaser_core import headers as h
from rebaser_core.errors import InvalidReplyInbox
from rebaser_core.inbox import MAX_INBOX_BYTES, check_inbox_prefix, check_reply_inbox, reply_inbox_of
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects

PLAIN, PREFIXED = Subjects(None), Subjects("P")


@pytest.mark.parametrize(
    "inbox",
    [
        "_INBOX.abc",
        "_INBOX.k3Jd9q2WfX7mTz.01JAW0QC8E0G2J4M6P8S0V2X4Z",
        "_INBOX.a-b_c.d$e",
        "_INBOX." + "x" * 248,
    ],
)
def test_valid_inboxes(inbox: str) -> None:
    assert check_reply_inbox(inbox, "_INBOX.", PLAIN) == inbox


@pytest.mark.parametrize(
    "inbox",
    [
        "$KV.REBASER_CHANGE_SETS.01JAW0Q7NB2K5Z8R4V6X9C3D1E.01JAW0Q8F3T6M9P2S5V8Y1B4C7",
        "$O.REBASER_SNAPSHOTS.M.abc",
        "$JS.API.STREAM.DELETE.REBASER_REQUESTS",
        "rebaser.requests.01JAW0Q7NB2K5Z8R4V6X9C3D1E.01JAW0Q8F3T6M9P2S5V8Y1B4C7",
        "dlq.rebaser.requests.x.y",
        "_INBOX.",
        "_INBOX",
        "_INBOXES.x",
        "_INBOX.a..b",
        "_INBOX.a.",
        "_INBOX.*",
        "_INBOX.a.>",
        "_INBOX.a b",
        "_INBOX.a\tb",
        "_INBOX.a\r\nPUB x 1",
        "_INBOX.zürich",
        "_INBOX." + "x" * 4096,
        "_INBOX." + "x" * (MAX_INBOX_BYTES - 6),
        "",
    ],
)
def test_invalid_inboxes(inbox: str) -> None:
    with pytest.raises(InvalidReplyInbox):
        check_reply_inbox(inbox, "_INBOX.", PLAIN)


def test_custom_prefix_and_the_deployments_own_subjects() -> None:
    assert check_reply_inbox("_I_alice.x", "_I_alice.", PLAIN) == "_I_alice.x"
    with pytest.raises(InvalidReplyInbox):
        check_reply_inbox("_INBOX.x", "_I_alice.", PLAIN)
    with pytest.raises(InvalidReplyInbox):
        check_inbox_prefix("P.inbox.", PREFIXED)  # under the deployment's prefix
    with pytest.raises(InvalidReplyInbox):
        check_inbox_prefix("rebaser.", PLAIN)
    with pytest.raises(InvalidReplyInbox):
        check_inbox_prefix("$SYS.", PLAIN)
    with pytest.raises(InvalidReplyInbox):
        check_inbox_prefix("_INBOX", PLAIN)  # must end with a dot


def test_settings_validate_the_inbox_prefix() -> None:
    assert Settings(reply_inbox_prefix="_R.").reply_inbox_prefix == "_R."
    with pytest.raises(ValueError, match="inbox prefix"):
        Settings(reply_inbox_prefix="$KV.")
    with pytest.raises(ValueError, match="inbox prefix"):
        Settings(prefix="P", reply_inbox_prefix="P.")


def test_reply_inbox_header_lookup() -> None:
    assert reply_inbox_of({}, "_INBOX.", PLAIN) is None
    assert reply_inbox_of({"x-reply-inbox": "_INBOX.a"}, "_INBOX.", PLAIN) == "_INBOX.a"
    with pytest.raises(InvalidReplyInbox, match="more than one"):
        reply_inbox_of({h.REPLY_INBOX: "_INBOX.a", "x-reply-inbox": "$KV.x"}, "_INBOX.", PLAIN)
    assert reply_inbox_of({h.REPLY_INBOX: ""}, "_INBOX.", PLAIN) is None
