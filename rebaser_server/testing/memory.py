"""``MemoryReader``: a :class:`~rebaser_server.app.ChangeSetReader` held in memory, to unit-test an app without a
daemon: give it the other change sets' states and the stored batches a test's requests name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rebaser_core.api import Update
from rebaser_core.errors import UnprocessableError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.app import AppState, ChangeSet, Committed

__all__ = ["MemoryReader"]


class MemoryReader:
    """``states``: change set id -> committed state (any workspace); ``batches``: address -> updates (any
    workspace)."""

    def __init__(
        self,
        states: Mapping[ChangeSetId, AppState] | None = None,
        batches: Mapping[str, Sequence[Update]] | None = None,
    ) -> None:
        self.states: dict[ChangeSetId, AppState] = dict(states or {})
        self.batches: dict[str, list[Update]] = {address: list(u) for address, u in (batches or {}).items()}

    async def committed(self, change_set: ChangeSet) -> Committed | None:
        if change_set.change_set_id not in self.states:
            return None
        return Committed(change_set, self.states[change_set.change_set_id])

    async def stored_updates(self, workspace_id: WorkspacePk, address: str) -> list[Update]:
        if address not in self.batches:
            raise UnprocessableError(f"stored batch {address} does not exist")
        return list(self.batches[address])
