"""A query whose reply would exceed the connection's max_payload is answered with the documented ``error``."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.errors import RebaserRefused
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


async def test_get_over_max_payload_is_answered_with_an_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        chunk = "v" * (nc.max_payload // 3)
        for i in range(4):  # each request fits in a message; all the values together do not
            response = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path=f"/big/{i}", value=chunk)], timeout=20
            )
            assert response.ok
        with pytest.raises(RebaserRefused, match="max_payload"):
            await client.get_change_set(wk, cs, timeout=10)
        one = await client.get_change_set(wk, cs, "/big/0", timeout=10)  # one path still fits
        assert one.values == {"/big/0": chunk}
