"""Power loss: JetStream's store on a filesystem that loses every write not fsynced (see powerloss/lossyfs.py).

nats-server fsyncs its file store every ``sync_interval`` (2 min by default) unless told
``jetstream { sync_interval: always }``. Here the server is SIGKILLed, then the power is cut (the FUSE process
holding the unsynced writes dies with them), and a new server recovers the store. With ``always`` every message
the server acknowledged is back; with the default interval acknowledged messages are gone, which shows that the
simulation can fail a test. The end-to-end variant does the same under a rebaser daemon and its clients: with
``always`` every acknowledged request is applied exactly once, in order, after the restart.

Needs FUSE (root, /dev/fuse, libfuse and mfusepy); the tests skip, naming what is missing, without it:

    bash scripts/install_powerloss_deps.sh        # apt-get install fuse3 libfuse3-3; .venv/bin/pip install mfusepy
    .venv/bin/pytest -m slow -q -s tests/chaos/test_power_loss.py     # or `make chaos`, which runs every slow test

``REBASER_POWERLOSS_MESSAGES`` (default 2000) sets how many messages are published, ``REBASER_POWERLOSS_REQUESTS``
(default 400) how many requests are acknowledged before the cut of the end-to-end variant. See docs/power-loss.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StorageType

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import RequestId
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.record.store import ChangeSetStore
from tests.chaos.powerloss.lossyfs import LossyMount, missing_dependencies
from tests.support.daemons import daemon_processes, read_record, spawn_daemon

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("REBASER_POWERLOSS_MESSAGES", "2000"))
# Publishes in flight at once: enough to keep the server busy, as a real load does.
IN_FLIGHT = 32
# Random bytes per message (hex-encoded, so twice as many on the wire and on disk).
PAYLOAD = 512
STREAM = "POWERLOSS"

# nats-server's sync_interval per case: "always", or None for nats-server's own default, 2 minutes.
SYNC = {"always": "always", "default": None}


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[LossyMount]:
    reason = missing_dependencies()
    if reason:
        pytest.skip(f"the power-loss simulation needs FUSE: {reason}")
    with LossyMount(tmp_path / "disk", tmp_path / "store") as mount:
        yield mount


def test_the_simulated_disk_keeps_only_what_was_fsynced(lossy: LossyMount) -> None:
    """The simulator itself: reads see unsynced writes; after a cut only fsynced data is there, metadata all is."""
    m = lossy.mountpoint
    with open(m / "synced", "wb") as f:
        f.write(b"a" * 10_000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"b" * 100)  # after the fsync: lost
        f.flush()
    (m / "unsynced").write_bytes(b"never fsynced")
    os.makedirs(m / "dir")
    with open(m / "dir" / "cut", "wb") as f:
        f.write(b"c" * 9_000)
        f.flush()
        os.fsync(f.fileno())
        f.truncate(10)  # a truncate is a data write too: undone by the cut
        f.flush()
    os.rename(m / "dir", m / "moved")  # metadata: durable at once
    assert (m / "synced").read_bytes() == b"a" * 10_000 + b"b" * 100  # read your writes
    assert (m / "moved" / "cut").read_bytes() == b"c" * 10
    before = lossy.power_cut()
    assert before["fsync"] == 2 and before["dirty_files"] == 3
    lossy.mount()
    assert (m / "synced").read_bytes() == b"a" * 10_000
    assert (m / "unsynced").read_bytes() == b""  # created (metadata), its data lost
    assert (m / "moved" / "cut").read_bytes() == b"c" * 9_000
    (m / "clean").write_bytes(b"kept")
    lossy.unmount()  # a clean unmount writes everything back
    assert (lossy.backing / "clean").read_bytes() == b"kept"
    lossy.mount()  # for the fixture, which unmounts


async def _create_stream(url: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream(timeout=10).add_stream(
            name=STREAM, subjects=["powerloss.>"], storage=StorageType.FILE
        )
    finally:
        async with asyncio.timeout(10):
            await nc.close()


async def _publish(url: str, count: int) -> dict[int, bytes]:
    """Publish ``count`` messages to the stream; the acknowledged ones, by stream sequence."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        acked: dict[int, bytes] = {}
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> None:
            payload = f"message {i} ".encode() + os.urandom(PAYLOAD // 2).hex().encode()
            async with gate:
                ack = await js.publish(f"powerloss.{i % 10}", payload)
            assert not ack.duplicate
            acked[ack.seq] = payload

        await asyncio.gather(*(one(i) for i in range(count)))
        return acked
    finally:
        async with asyncio.timeout(10):
            await nc.close()


async def _read_back(url: str, acked: dict[int, bytes]) -> tuple[int, list[int]]:
    """The stream's message count after recovery, and the acknowledged sequences missing or changed."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        try:
            count = (await js.stream_info(STREAM)).state.messages
        except nats.js.errors.NotFoundError:
            return -1, sorted(acked)  # the stream itself is gone
        lost = []
        for seq, payload in sorted(acked.items()):
            try:
                msg = await js.get_msg(STREAM, seq)
            except nats.js.errors.NotFoundError:
                lost.append(seq)
                continue
            if msg.data != payload:
                lost.append(seq)
        return count, lost
    finally:
        async with asyncio.timeout(10):
            await nc.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sync", "power_cut"),
    [("always", True), ("default", True), ("default", False)],
    ids=["always", "default", "default-crash-only"],
)
async def test_acknowledged_messages_survive_a_power_cut(
    sync: str, power_cut: bool, lossy: LossyMount, tmp_path: Path
) -> None:
    """The default interval with ``power_cut`` False is the control: the same SIGKILL, then a clean unmount (the
    page cache reaches the disk), loses nothing; what the default loses, the cut took."""
    started = time.monotonic()
    server = NatsServer(store_dir=lossy.mountpoint, sync=SYNC[sync])
    server.start()
    try:
        await _create_stream(server.url)
        # The stream's definition reaches the disk, as a kernel's writeback would put it there in the 30 s or so
        # after its creation: what the cut below decides is the fate of the messages, not of the stream.
        lossy.sync_all()
        acked = await _publish(server.url, MESSAGES)
        published = time.monotonic()
    finally:
        # SIGKILL first: the server writes nothing more, so the cut below is all that decides what is on "disk".
        server.kill()
        server.stop()  # releases the store's lock and the server's log; the store itself stays
    cut = lossy.stats()
    if power_cut:
        lossy.power_cut()
    else:
        lossy.unmount()
    lossy.mount()
    server = NatsServer(store_dir=lossy.mountpoint, sync=SYNC[sync])
    server.start(timeout=60)  # recovery rebuilds the stream's state from its message blocks
    try:
        recovery = server.log_tail(since_start=True)
        count, lost = await _read_back(server.url, acked)
    finally:
        server.stop()
    ended = time.monotonic()

    print(
        f"\n{'power cut' if power_cut else 'no power cut'}, sync_interval {sync}: {len(acked)} acknowledged, "
        f"{len(lost)} lost, "
        f"{count} in the stream after recovery; {cut['fsync']} fsyncs, {cut['dirty_files']} files with "
        f"{cut['dirty_pages']} dirty pages {'dropped' if power_cut else 'written back'}; "
        f"publish {published - started:.1f} s, "
        f"total {ended - started:.1f} s"
    )
    assert len(acked) == MESSAGES
    if sync == "always" or not power_cut:
        assert lost == [], f"acknowledged and lost: {len(lost)}, first {lost[:10]}; recovery log:\n{recovery}"
        assert count == len(acked)
        # The setting reached the server (without it nothing is fsynced).
        assert (cut["fsync"] > 0) == (sync == "always"), cut
    else:
        # Without fsyncs the acknowledged messages sit in the (simulated) page cache, and the cut takes them.
        assert lost, f"nothing lost without fsync: the simulation did not bite ({cut})"


# -- end to end: the rebaser daemon on the lossy store ----------------------------------------------------------

REQUESTS = int(os.environ.get("REBASER_POWERLOSS_REQUESTS", "400"))
CHANGE_SETS = 4
DAEMON_ENV = {
    "REBASER_STORAGE": "file",
    "REBASER_REPLICAS": "1",
    "REBASER_ACK_WAIT": "3",
    "REBASER_PROGRESS_PERIOD": "0.5",
    "REBASER_QUIESCENT_PERIOD": "0.3",
    "REBASER_SWEEP_INTERVAL": "2",
    "REBASER_RETRY_BACKOFF": "0.1",
}


class _Load:
    """Producers, one per change set, each sending its next request once the last one is acknowledged."""

    def __init__(self, client: RebaserClient) -> None:
        self.client = client
        self.wk = WorkspacePk.new()
        self.acked: dict[ChangeSetId, list[str]] = {ChangeSetId.new(): [] for _ in range(CHANGE_SETS)}
        self.in_doubt: set[str] = set()  # sent, never acknowledged: stored or not, applied at most once

    def count(self) -> int:
        return sum(len(ids) for ids in self.acked.values())

    async def produce(self, cs: ChangeSetId) -> None:
        while True:
            request = EnqueueUpdatesRequest(
                id=RequestId.new(),
                workspace_id=self.wk,
                change_set_id=cs,
                # A short apply, so the cut also finds requests in the middle of one.
                updates=InlineUpdates(updates=[SetLiteral(path="/sleep", value=0.002)]),
            )
            self.in_doubt.add(str(request.id))
            await self.client.send(request)  # raises once the power is cut: the producer ends there
            self.in_doubt.discard(str(request.id))
            self.acked[cs].append(str(request.id))


def _daemon_env(tmp_path: Path) -> dict[str, str]:
    # Each apply's start and end, from the daemons (tests/support/apps.py), on the real disk: what was applied
    # before the cut, and what is applied again after it.
    return {**DAEMON_ENV, "REBASER_TEST_RECORD": str(tmp_path / "applies.jsonl")}


async def _run_until_cut(
    url: str, prefix: str, tmp_path: Path, lossy: LossyMount, server: NatsServer
) -> _Load:
    """A daemon under load until REQUESTS are acknowledged; then the daemon and the server are SIGKILLed while the
    producers are still sending."""
    async with daemon_processes() as procs:
        procs.append(await spawn_daemon(url, prefix, tmp_path, _daemon_env(tmp_path), "before-cut"))
        # The daemon's streams and buckets reach the disk, as a kernel's writeback would put them there in the
        # 30 s or so after they are made: the cut decides the fate of the requests, not of the set-up.
        lossy.sync_all()
        # No reconnects: the connection closes itself once the server is killed, and is not closed a second time
        # (nats-py's close racing its own can raise CancelledError).
        nc = await nats.connect(url, allow_reconnect=False)
        try:
            async with RebaserClient(nc, prefix=prefix, publish_timeout=5.0) as client:
                load = _Load(client)
                producers = [asyncio.create_task(load.produce(cs)) for cs in load.acked]
                try:
                    await wait_for(
                        lambda: load.count() >= REQUESTS, timeout=120, message="requests acknowledged"
                    )
                finally:
                    for p in procs:
                        p.kill()
                    server.kill()
                    for task in producers:
                        task.cancel()
                    async with asyncio.timeout(10):
                        await asyncio.gather(*producers, return_exceptions=True)
                    await wait_for(
                        lambda: nc.is_closed, timeout=10, message="the connection ends with its server"
                    )
        finally:
            if not nc.is_closed:  # an error before the cut
                async with asyncio.timeout(10):
                    await nc.close()
    return load


async def _applied_after_restart(
    url: str, prefix: str, tmp_path: Path, load: _Load
) -> dict[ChangeSetId, list[str]]:
    """A new daemon on the recovered store; each change set's applied request ids once a last request with a
    reply is answered (everything queued before it is applied then)."""
    async with daemon_processes() as procs:
        procs.append(await spawn_daemon(url, prefix, tmp_path, _daemon_env(tmp_path), "after-cut"))
        nc = await nats.connect(url)
        try:
            finals = set()
            async with RebaserClient(nc, prefix=prefix, publish_timeout=5.0) as client:
                for cs in load.acked:
                    final = await client.enqueue_updates_with_reply(load.wk, cs, [], timeout=90)
                    assert final.ok, final
                    finals.add(str(final.id))
            store = ChangeSetStore(nc.jetstream(timeout=10), Settings(prefix=prefix, replicas=1))
            await store.open()
            applied = {}
            for cs in load.acked:
                record = await store.read(ChangeSet(load.wk, cs))
                assert record is not None
                applied[cs] = [str(rid) for rid in record.state["applied"] if str(rid) not in finals]
            return applied
        finally:
            async with asyncio.timeout(10):
                await nc.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["always", "default"])
async def test_acknowledged_requests_are_applied_once_after_a_power_cut(
    sync: str, lossy: LossyMount, tmp_path: Path, subject_prefix: str
) -> None:
    started = time.monotonic()
    server = NatsServer(store_dir=lossy.mountpoint, sync=SYNC[sync])
    server.start()
    try:
        load = await _run_until_cut(server.url, subject_prefix, tmp_path, lossy, server)
    finally:
        server.kill()
        server.stop()
    cut = lossy.power_cut()
    ended_before = {str(e["rid"]) for e in read_record(tmp_path / "applies.jsonl") if e["e"] == "end"}
    lossy.mount()
    server = NatsServer(store_dir=lossy.mountpoint, sync=SYNC[sync])
    server.start(timeout=60)
    try:
        applied = await _applied_after_restart(server.url, subject_prefix, tmp_path, load)
    finally:
        server.stop()
    ended = time.monotonic()

    lost = [rid for cs, ids in load.acked.items() for rid in ids if rid not in applied[cs]]
    twice = [rid for ids in applied.values() for rid in set(ids) if ids.count(rid) > 1]
    # Order among the acknowledged requests that were applied (all of them, unless some were lost).
    reordered = [
        cs
        for cs, ids in load.acked.items()
        if [r for r in applied[cs] if r in set(ids)] != [r for r in ids if r in set(applied[cs])]
    ]
    unknown = [
        rid for cs, ids in applied.items() for rid in ids if rid not in load.acked[cs] + [*load.in_doubt]
    ]
    ends = [str(e["rid"]) for e in read_record(tmp_path / "applies.jsonl") if e["e"] == "end"]
    again = len(ends) - len(set(ends))  # applies whose commit the cut took (or never saw), done once more
    backlog = load.count() - len(ended_before & {rid for ids in load.acked.values() for rid in ids})
    print(
        f"\npower loss end to end, sync_interval {sync}: {load.count()} requests acknowledged, "
        f"{len(load.in_doubt)} in doubt and {backlog} acknowledged but not yet applied at the cut, {again} applied "
        f"again after it; {len(lost)} lost, {len(twice)} applied twice, "
        f"{len(reordered)} change sets out of order; {cut['fsync']} fsyncs, {cut['dirty_pages']} dirty pages "
        f"dropped; total {ended - started:.1f} s"
    )
    assert unknown == [], f"applied, and never sent: {unknown[:5]}"
    if sync == "always":
        assert lost == [], f"acknowledged and never applied: {len(lost)}, first {lost[:5]}"
        assert twice == [], f"applied twice: {twice[:5]}"
        assert reordered == [], f"applied out of order: {reordered}"
    else:
        assert lost, f"nothing lost without fsync: the simulation did not bite ({cut})"
