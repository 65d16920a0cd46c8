"""How the daemon calls an app: the one place that knows which request goes to which method, and which optional
parts of the contract an app has (reported in one line at start-up)."""

from __future__ import annotations

from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.errors import RefusedError
from rebaser_server.app.contract import Applied, AppState, ChangeSet, RebaserApp, SupportsChangeSetApply

__all__ = ["OPTIONAL", "apply_request", "capabilities"]

# Each optional method a caller notices the lack of, and what the daemon does without it. (The commit hooks are
# optional too, but an app without them needs none.)
OPTIONAL = {
    "apply_change_set": "requests with from_change_set_id are refused",
    "describe": "get queries are answered with an error",
    "fork": "fork queries are answered with an error",
}


async def apply_request(
    app: RebaserApp, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest
) -> Applied:
    """Apply one request: ``apply``, or ``apply_change_set`` with the source's committed state for a request that
    applies another change set onto this one. Refused (:class:`RefusedError`) when the app cannot merge change sets
    or the source does not exist."""
    source_id = request.from_change_set_id
    if source_id is None:
        return await app.apply(change_set, state, request)
    if not isinstance(app, SupportsChangeSetApply):
        raise RefusedError(
            f"this daemon's app ({type(app).__name__}) does not apply one change set onto another "
            "(from_change_set_id)",
            {"unsupported": "from_change_set_id"},
        )
    if source_id == change_set.change_set_id:
        raise RefusedError(
            "a change set cannot be applied onto itself", {"from_change_set_id": str(source_id)}
        )
    source = await change_set.read(source_id)
    if source is None:
        raise RefusedError(f"change set {source_id} does not exist", {"from_change_set_id": str(source_id)})
    return await app.apply_change_set(change_set, state, request, source)


def capabilities(app: RebaserApp) -> str:
    """One line: the app, and the optional parts it lacks with what that means."""
    missing = [
        f"{name} ({effect})" for name, effect in OPTIONAL.items() if not callable(getattr(app, name, None))
    ]
    name = f"{type(app).__module__}.{type(app).__qualname__}"
    if not missing:
        return f"app {name}: serves requests, from_change_set_id, get and fork"
    return f"app {name}: lacks " + "; ".join(missing)
