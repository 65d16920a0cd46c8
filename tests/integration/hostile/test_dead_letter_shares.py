"""A flood of refused requests in one workspace evicts only that workspace's dead letters: each change set keeps
``dead_letter_max_per_change_set`` (the stream's per-subject limit), each workspace ``dead_letter_max_per_workspace``
(the daemon purges its oldest), and the stream's global caps come last (docs/capacity.md#bounds)."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.settings import Settings
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.hostile_wire import REQUEST_HEADERS, raw_call


async def _refuse(nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId) -> None:
    headers = {**REQUEST_HEADERS, h.NATS_MSG_ID: str(RequestId.new())}
    reply = await raw_call(nc, settings, wk, cs, headers, b"\xff not a request")
    assert reply.status.kind == "error" and "DecodeError" in reply.status.message


async def _letters(nc: NatsClient, settings: Settings, wk: WorkspacePk) -> dict[str, int]:
    info = await nc.jetstream().stream_info(
        settings.subjects.dead_letter_stream, subjects_filter=settings.subjects.dead_letters_of_workspace(wk)
    )
    return dict(info.state.subjects or {})


async def test_a_flood_of_refusals_evicts_only_its_own_workspace_s_dead_letters(
    nc: NatsClient, subject_prefix: str
) -> None:
    # Scaled down: 40 letters in all (the last resort), 10 per workspace, 4 per change set.
    settings = fast_settings(
        subject_prefix,
        dead_letter_max_msgs=40,
        dead_letter_max_per_workspace=10,
        dead_letter_max_per_change_set=4,
    )
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        victim, victim_cs = WorkspacePk.new(), ChangeSetId.new()
        for _ in range(3):
            await _refuse(nc, settings, victim, victim_cs)
        # The flood: 60 refusals, more than the whole stream holds, over 6 change sets of one workspace.
        flooder = WorkspacePk.new()
        flooded = [ChangeSetId.new() for _ in range(6)]
        for n in range(60):
            await _refuse(nc, settings, flooder, flooded[n % 6])
        # One change set more of the flooder, refused 7 times: it keeps its 4 newest.
        loud = ChangeSetId.new()
        for _ in range(7):
            await _refuse(nc, settings, flooder, loud)

        assert await _letters(nc, settings, victim) == {settings.subjects.dead_letter(victim, victim_cs): 3}
        theirs = await _letters(nc, settings, flooder)
        assert sum(theirs.values()) == 10, theirs  # its newest 10: the loud change set's 4, and 6 before them
        assert theirs[settings.subjects.dead_letter(flooder, loud)] == 4
        assert daemon.stats.dead_letters_evicted > 0  # counted (rebaser_dead_letters_evicted_total)


async def test_an_existing_dead_letter_stream_gets_the_per_change_set_limit(
    nc: NatsClient, subject_prefix: str
) -> None:
    """Deployments made before the limit get it when a daemon starts (ensure_streams updates the stream)."""
    settings = fast_settings(subject_prefix)
    js = nc.jetstream()
    await ensure_streams(js, fast_settings(subject_prefix, dead_letter_max_per_change_set=-1), consumer=False)
    assert (await js.stream_info(settings.subjects.dead_letter_stream)).config.max_msgs_per_subject == -1
    await ensure_streams(js, settings, consumer=False)
    config = (await js.stream_info(settings.subjects.dead_letter_stream)).config
    assert config.max_msgs_per_subject == Settings().dead_letter_max_per_change_set == 100
