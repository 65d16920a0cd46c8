"""Testing the cart: the app alone (plain Python, no server), and on a real daemon with the pytest plugin.

The plugin comes with rebaser and its ``testing`` extra brings pytest too (rebaser is on no package index:
``pip install -e '/path/to/rebaser[testing]'`` from a checkout, or a wheel: docs/apps.md). ``rebaser_client`` is a
client of a daemon that runs the app named by the ``rebaser_app`` marker (or the ``rebaser_app`` ini option, see
``pytest.ini``) on an embedded nats-server. Each form of the marker is used once below.
"""

from __future__ import annotations

import asyncio

import pytest
from cart import CartApp

from rebaser_client import ChangeSetId, SetLiteral, WorkspacePk
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, RefusedStatus, Remove
from rebaser_core.ids import RequestId
from rebaser_server import ChangeSet, RefusedError
from rebaser_server.testing import MemoryReader


def _item(sku: str, quantity: object, price_cents: int = 40) -> SetLiteral:
    return SetLiteral(path=f"/items/{sku}", value={"quantity": quantity, "price_cents": price_cents})


# -- the app alone: fast, no server ------------------------------------------------------------------------------


def _request(cart: ChangeSet, *updates: SetLiteral | Remove) -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=cart.workspace_id,
        change_set_id=cart.change_set_id,
        updates=InlineUpdates(updates=list(updates)),
    )


def test_apply_then_total() -> None:
    app, cart = CartApp(), ChangeSet(WorkspacePk.new(), ChangeSetId.new(), MemoryReader())
    state = app.initial_state(cart)
    applied = asyncio.run(app.apply(cart, state, _request(cart, _item("apple", 3), _item("pear", 1, 90))))
    assert applied.status.kind == "success" and applied.dvu
    assert asyncio.run(app.dependent_values_update(cart, applied.state))["total_cents"] == 3 * 40 + 90


def test_a_bad_quantity_is_refused() -> None:
    app, cart = CartApp(), ChangeSet(WorkspacePk.new(), ChangeSetId.new(), MemoryReader())
    with pytest.raises(RefusedError) as refused:
        asyncio.run(app.apply(cart, app.initial_state(cart), _request(cart, _item("apple", 0))))
    assert refused.value.details == {"sku": "apple", "field": "quantity", "minimum": 1}


# -- on a daemon -------------------------------------------------------------------------------------------------


@pytest.mark.rebaser_app.with_args(CartApp)  # a class: a new app for the test
def test_a_refusal_is_answered_and_not_dead_lettered(rebaser_client, rebaser_daemon) -> None:
    workspace, cart = WorkspacePk.new(), ChangeSetId.new()
    assert rebaser_client.enqueue_updates_with_reply(workspace, cart, [_item("apple", 2)]).ok
    reply = rebaser_client.enqueue_updates_with_reply(workspace, cart, [_item("apple", 0)])
    assert isinstance(reply.status, RefusedStatus)
    assert reply.status.details == {"sku": "apple", "field": "quantity", "minimum": 1}
    rebaser_client.wait_settled(workspace, cart)
    assert (
        rebaser_client.get_change_set(workspace, cart).values["/total_cents"] == 80
    )  # the refused one left no trace
    assert rebaser_daemon.daemon.stats.requests_dead_lettered == 0


@pytest.mark.rebaser_app("cart:CartApp")  # a "module:attr" string
def test_one_cart_applied_onto_another(rebaser_client) -> None:
    workspace, mine, theirs = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    assert rebaser_client.enqueue_updates_with_reply(workspace, mine, [_item("apple", 1)]).ok
    assert rebaser_client.enqueue_updates_with_reply(
        workspace, theirs, [_item("apple", 2), _item("fig", 1, 75)]
    ).ok
    assert rebaser_client.enqueue_updates_from_change_set_with_reply(workspace, mine, theirs).ok
    rebaser_client.wait_settled(workspace, mine)
    values = rebaser_client.get_change_set(workspace, mine).values
    assert values["/items"]["apple"]["quantity"] == 3
    assert values["/total_cents"] == 3 * 40 + 75


@pytest.mark.rebaser_app(CartApp())  # an app object, used as it is
def test_a_stale_version_is_a_conflict(rebaser_client) -> None:
    workspace, cart = WorkspacePk.new(), ChangeSetId.new()
    assert rebaser_client.enqueue_updates_with_reply(workspace, cart, [_item("apple", 1)]).ok
    stale = SetLiteral(path="/items/apple", value={"quantity": 5, "price_cents": 40}, expected_version="7")
    reply = rebaser_client.enqueue_updates_with_reply(workspace, cart, [stale])
    assert reply.status.kind == "conflicts"
    assert reply.status.conflicts[0].actual_version == "1"


def make_cart() -> CartApp:
    return CartApp()


@pytest.mark.rebaser_app.with_args(make_cart)  # a factory, called with no arguments
def test_a_removed_item_leaves_the_total(rebaser_client) -> None:
    workspace, cart = WorkspacePk.new(), ChangeSetId.new()
    assert rebaser_client.enqueue_updates_with_reply(
        workspace, cart, [_item("apple", 2), _item("fig", 1, 75)]
    ).ok
    assert rebaser_client.enqueue_updates_with_reply(workspace, cart, [Remove(path="/items/apple")]).ok
    rebaser_client.wait_settled(workspace, cart)
    assert rebaser_client.get_change_set(workspace, cart).values["/total_cents"] == 75


def test_the_ini_option_names_the_app(rebaser_daemon) -> None:  # no marker: pytest.ini's rebaser_app
    assert isinstance(rebaser_daemon.app, CartApp)
