"""A shopping cart on rebaser: the example of docs/apps.md. Copy this file, rename the class, and edit.

A change set is one cart. Its requests set and remove items; its state (committed by the daemon, in order, one
request at a time) is a JSON object::

    {"items": {"apple": {"quantity": 3, "price_cents": 40, "version": "2"}}, "total_cents": 120}

- ``set /items/<sku>`` with ``{"quantity": n, "price_cents": p}`` adds or changes an item; a quantity that is not a
  whole number of at least 1 is *refused*: the caller gets a ``refused`` reply, nothing is dead-lettered.
- ``remove /items/<sku>`` removes it.
- An update's ``expected_version`` (optional) must be the item's current ``version``, else nothing of the request
  is applied and the caller gets the conflicts.
- The total is a dependent value: ``apply`` only says it is due, ``dependent_values_update`` recomputes it.
- A request with ``from_change_set_id`` adds another cart's items to this one (``apply_change_set``).

Run it: ``rebaser-server --app cart:CartApp`` (with this directory on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

from rebaser_core.api import Conflict, ConflictsStatus, EnqueueUpdatesRequest, Remove, SetLiteral, Update
from rebaser_server import App, Applied, AppState, ChangeSet, Committed, RefusedError

__all__ = ["CartApp"]


class CartApp(App):
    """Items and their quantities; the total is recomputed after the requests."""

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"items": {}, "total_cents": 0}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        updates = await change_set.updates(request)  # inline, or a stored batch the daemon reads
        items: dict[str, Any] = dict(state["items"])
        conflicts = [conflict for update in updates if (conflict := _conflict(items, update)) is not None]
        if conflicts:
            return Applied(ConflictsStatus(conflicts=conflicts), state)  # nothing of the request applied
        for update in updates:
            sku = _sku(update.path)
            if isinstance(update, Remove):
                items.pop(sku, None)
            elif isinstance(update, SetLiteral):
                items[sku] = _item(sku, update.value, items.get(sku))
            else:
                raise RefusedError(
                    f"{update.path}: a cart takes set and remove, not {update.op}", {"op": update.op}
                )
        return Applied.success({**state, "items": items}, len(updates), dvu=True)

    async def apply_change_set(
        self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest, source: Committed
    ) -> Applied:
        """Add the items of another cart (``source``, as last committed) to this one."""
        items: dict[str, Any] = dict(state["items"])
        for sku, theirs in source.state["items"].items():
            ours = items.get(sku)
            quantity = theirs["quantity"] + (ours["quantity"] if ours else 0)
            items[sku] = _item(sku, {"quantity": quantity, "price_cents": theirs["price_cents"]}, ours)
        return Applied.success({**state, "items": items}, len(source.state["items"]), dvu=True)

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        total = sum(item["quantity"] * item["price_cents"] for item in state["items"].values())
        return {**state, "total_cents": total}


def _sku(path: str) -> str:
    parts = path.split("/")  # "/items/apple" -> ["", "items", "apple"]
    if len(parts) != 3 or parts[1] != "items":
        raise RefusedError(f"{path}: a cart's paths are /items/<sku>", {"path": path})
    return parts[2]


def _conflict(items: dict[str, Any], update: Update) -> Conflict | None:
    if update.expected_version is None:
        return None
    current = items.get(_sku(update.path))
    actual = None if current is None else current["version"]
    if actual == update.expected_version:
        return None
    return Conflict(path=update.path, expected_version=update.expected_version, actual_version=actual)


def _item(sku: str, value: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
    """A new or changed item; refused if ``value`` is not ``{"quantity": n >= 1, "price_cents": p >= 0}``."""
    quantity = value.get("quantity") if isinstance(value, dict) else None
    price = value.get("price_cents") if isinstance(value, dict) else None
    if type(quantity) is not int or quantity < 1:
        raise RefusedError(
            f"{sku}: quantity must be a whole number of at least 1, got {quantity!r}",
            {"sku": sku, "field": "quantity", "minimum": 1},
        )
    if type(price) is not int or price < 0:
        raise RefusedError(
            f"{sku}: price_cents must be a whole number of at least 0", {"sku": sku, "field": "price_cents"}
        )
    version = str(int(previous["version"]) + 1) if previous else "1"
    return {"quantity": quantity, "price_cents": price, "version": version}
