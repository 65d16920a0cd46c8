"""The commonest reply, a success, encoded and decoded without pydantic.

A daemon encodes one reply per request and a client decodes one. Through pydantic and the general codec that is
about 9 µs and 30 µs of a request's CPU, of 130 µs in all for a client (``bench/micro.py``). A success reply has one
fixed shape, so both sides take this path when the message is exactly that shape and the general one for anything
else, with the same result: :func:`encode_success` writes the bytes the general encoder writes, and
:func:`decode_success` returns the message the general decoder returns or ``None`` (then the caller decodes in full).

What the decoder takes without pydantic is what our own daemons send: our exact header names; CBOR (no tag, so
nothing can expand, and no deeper or larger than a success) or JSON; the ids of the request it answers as their
canonical text; and a status of exactly ``kind``, ``updates_performed`` (an int, not below 0) and
``snapshot_address`` (text or null). Every other reply, hostile ones included, takes the general path with its
bounds and its typed errors.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any, TypeVar

import cbor2
from pydantic import BaseModel

from rebaser_core import headers as h
from rebaser_core.api.cbor_scan import CborLimits, check_plain
from rebaser_core.api.codec import ContentType, encode_body
from rebaser_core.api.enqueue_updates_request import EnqueueUpdatesRequest
from rebaser_core.api.enqueue_updates_response import (
    ENQUEUE_UPDATES_RESPONSE,
    EnqueueUpdatesResponse,
    SuccessStatus,
)

__all__ = ["decode_success", "encode_success"]

# The version a success is sent in (the oldest that carries it: oldest_form), and those a success is read from.
_SENT_VERSION = "1"
_READ_VERSIONS = frozenset(str(v) for v in ENQUEUE_UPDATES_RESPONSE.versions)
_NAME = ENQUEUE_UPDATES_RESPONSE.name
# A success reply takes about 170 bytes; anything much larger is not one of ours.
_MAX_BODY = 1024
_MAX_INT = 2**64
# A success is a map holding one map (2 levels deep); its length, at most _MAX_BODY, bounds its items.
_CBOR_LIMITS = CborLimits(max_depth=2)
_CBOR, _JSON = (
    ContentType.CBOR.value,
    ContentType.JSON.value,
)  # plain text: an enum member's value is a property
_STATUS_KEYS = frozenset({"kind", "updates_performed", "snapshot_address"})


def encode_success(
    response: EnqueueUpdatesResponse, content_type: ContentType
) -> tuple[dict[str, str], bytes] | None:
    """Headers and body of ``response`` as ``ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), ...)`` writes
    them, if its status is a success; else None."""
    status = response.status
    if type(status) is not SuccessStatus:
        return None
    rid = str(response.id)
    data = {
        "id": rid,
        "workspace_id": str(response.workspace_id),
        "change_set_id": str(response.change_set_id),
        "status": {
            "kind": "success",
            "updates_performed": status.updates_performed,
            "snapshot_address": status.snapshot_address,
        },
    }
    headers = {
        h.CONTENT_TYPE: content_type.value,
        h.MESSAGE_TYPE: _NAME,
        h.MESSAGE_VERSION: _SENT_VERSION,
        h.NATS_MSG_ID: rid,
    }
    return headers, encode_body(data, content_type)


def decode_success(
    headers: Mapping[str, str] | None, body: bytes, request: EnqueueUpdatesRequest
) -> EnqueueUpdatesResponse | None:
    """The success reply to ``request`` in ``body``, if the message is exactly what a daemon sends for one;
    else None (decode it in full: it may be another status, another shape, or invalid)."""
    if not headers or len(body) > _MAX_BODY:
        return None
    if headers.get(h.MESSAGE_TYPE) != _NAME or headers.get(h.MESSAGE_VERSION) not in _READ_VERSIONS:
        return None
    content_type = headers.get(h.CONTENT_TYPE)
    data: object
    try:
        h.check_header_block(headers)
        if content_type == _CBOR:
            check_plain(
                body, _CBOR_LIMITS
            )  # no tag (nothing can expand), and no deeper or larger than a success
            stream = io.BytesIO(body)
            data = cbor2.CBORDecoder(stream).decode()
            if stream.tell() != len(body):
                return None
        elif content_type == _JSON:
            data = json.loads(body)
        else:
            return None
    except Exception:  # whatever it is, the general path says it with a typed error
        return None
    if type(data) is not dict or len(data) != 4:
        return None
    status = data.get("status")
    if (
        data.get("id") != str(request.id)
        or data.get("workspace_id") != str(request.workspace_id)
        or data.get("change_set_id") != str(request.change_set_id)
        or type(status) is not dict
        or status.keys() != _STATUS_KEYS
        or status["kind"] != "success"
    ):
        return None
    performed, address = status["updates_performed"], status["snapshot_address"]
    if type(performed) is not int or not 0 <= performed < _MAX_INT:
        return None
    if address is not None and type(address) is not str:
        return None
    if type(address) is str and content_type == _JSON:
        try:
            address.encode("utf-8")  # JSON may carry a lone surrogate; CBOR text is decoded strictly
        except UnicodeEncodeError:
            return None
    return _built(
        EnqueueUpdatesResponse,
        {
            "id": request.id,
            "workspace_id": request.workspace_id,
            "change_set_id": request.change_set_id,
            "status": _built(
                SuccessStatus,
                {"kind": "success", "updates_performed": performed, "snapshot_address": address},
            ),
        },
    )


M = TypeVar("M", bound=BaseModel)


def _built(cls: type[M], fields: dict[str, Any]) -> M:
    """An instance of ``cls`` holding ``fields``, all of them given and already valid, made as pydantic makes a
    validated one: a fifth of the time of validating them again (and ``model_construct`` takes longer still,
    resolving defaults). Equal to the validated instance, field set included (tests/unit/core/test_success_reply)."""
    made = cls.__new__(cls)
    object.__setattr__(made, "__dict__", fields)
    object.__setattr__(made, "__pydantic_fields_set__", set(fields))
    object.__setattr__(made, "__pydantic_extra__", None)
    object.__setattr__(made, "__pydantic_private__", None)
    return made
