"""Content-addressed objects in a JetStream Object Store: written once in two light round trips, read in two.

nats-py's ``ObjectStore.put`` reads the object's info first (a JetStream API call), publishes the chunks and the
info through its JetStream context, then purges the chunks of any object it replaced; with the snapshot store's own
"already stored?" look-up in front, a snapshot write through it costs four sequential round trips, a third of a
daemon's CPU per request with the built-in app. A snapshot never changes under its address, so here the existence
check is folded into the write: the chunks go out, then the info message with
``Nats-Expected-Last-Subject-Sequence: 0``, which JetStream refuses if the object exists already. The loser of such a
race (two daemons writing one snapshot) purges its own chunks, which nobody references.

The objects written are the ones nats-py writes (same subjects, same info document, SHA-256 digest, 128 KiB
chunks), so ``ObjectStore.get`` and every other Object Store client read them as usual.

Reading: nats-py's ``ObjectStore.get`` creates an ordered consumer on the chunks (a consumer created and deleted
on the server, a subscription) for every object. An object of one chunk, which every snapshot under 128 KiB is, is
read here with two direct gets (the info, then the chunk), its size and digest checked as nats-py checks them.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
from typing import Any

from nats.nuid import NUID

from rebaser_core.nats.requester import JS_API, Requester

__all__ = [
    "CHUNK_SIZE",
    "MultipleChunks",
    "ObjectCorrupt",
    "ObjectReader",
    "ObjectStoreError",
    "ObjectWriter",
]

log = logging.getLogger(__name__)

CHUNK_SIZE = 128 * 1024  # nats-py's default chunk size
_EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
_ROLLUP = "Nats-Rollup"
_WRONG_LAST_SEQUENCE = 10071
_STATUS = "Status"


def _meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


class ObjectStoreError(Exception):
    """JetStream refused to store or read an object (a refused write leaves nothing referenced)."""


class ObjectCorrupt(ObjectStoreError):
    """An object's chunks do not match its info (size or digest)."""


class MultipleChunks(Exception):
    """The object has more than one chunk (read it with nats-py's ObjectStore.get)."""


class ObjectWriter:
    def __init__(self, requester: Requester, bucket: str, *, timeout: float) -> None:
        self._requester = requester
        self._bucket = bucket
        self._timeout = timeout
        self._nuid = NUID()

    async def put_once(self, name: str, data: bytes) -> bool:
        """Store ``data`` as object ``name`` unless the bucket holds that name already; True if this call wrote it.
        Raises ``ObjectStoreError`` (refused) or NATS errors (unreachable): then nothing is referenced."""
        nuid = self._nuid.next().decode()
        chunks = f"$O.{self._bucket}.C.{nuid}"
        try:
            for start in range(0, len(data), CHUNK_SIZE):
                self._check(await self._request(chunks, data[start : start + CHUNK_SIZE]), chunks)
            info = {
                "name": name,
                "bucket": self._bucket,
                "nuid": nuid,
                "size": len(data),
                "mtime": datetime.datetime.now(datetime.UTC).isoformat(),
                "chunks": -(-len(data) // CHUNK_SIZE),
                "digest": _digest(data),
                "deleted": False,
                "options": {"max_chunk_size": CHUNK_SIZE},
            }
            meta = _meta_subject(self._bucket, name)
            headers = {_ROLLUP: "sub", _EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
            reply = await self._request(meta, json.dumps(info).encode(), headers)
            if (reply.get("error") or {}).get("err_code") == _WRONG_LAST_SEQUENCE:
                await self._discard(chunks)  # stored already (by another daemon, or before a restart)
                return False
            self._check(reply, meta)
            return True
        except Exception:
            await self._discard(chunks)
            raise

    async def _request(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> Any:
        msg = await self._requester.request(subject, payload, timeout=self._timeout, headers=headers)
        try:
            return json.loads(msg.data)
        except ValueError:
            raise ObjectStoreError(f"unreadable JetStream reply on {subject}: {msg.data[:80]!r}") from None

    @staticmethod
    def _check(reply: Any, subject: str) -> None:
        if not isinstance(reply, dict) or "error" in reply:
            raise ObjectStoreError(f"publish to {subject} refused: {reply}")

    async def _discard(self, chunks: str) -> None:
        """Purge chunks no info message references (best effort: orphaned chunks are only wasted space)."""
        try:
            payload = json.dumps({"filter": chunks}).encode()
            await self._requester.request(
                f"{JS_API}.STREAM.PURGE.OBJ_{self._bucket}", payload, timeout=self._timeout
            )
        except Exception as err:
            log.debug("purging unreferenced chunks %s failed: %r", chunks, err)


class ObjectReader:
    def __init__(self, requester: Requester, bucket: str, *, timeout: float) -> None:
        self._requester = requester
        self._bucket = bucket
        self._timeout = timeout

    async def get(self, name: str) -> bytes | None:
        """The object's data; None if the bucket has no such object. An object of more than one chunk is not read
        here: ``MultipleChunks`` is raised, and the caller reads it with nats-py."""
        info = await self._last(_meta_subject(self._bucket, name))
        if info is None:
            return None
        try:
            meta = json.loads(info)
            deleted, nuid, size, chunks, digest = (
                meta.get("deleted", False),
                str(meta["nuid"]),
                int(meta["size"]),
                int(meta.get("chunks", 0)),
                meta.get("digest"),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ObjectCorrupt(f"object {name}: unreadable info") from None
        if deleted:
            return None
        if chunks > 1:
            raise MultipleChunks(name)
        data = b"" if chunks == 0 else await self._last(f"$O.{self._bucket}.C.{nuid}")
        if data is None or len(data) != size or (digest is not None and digest != _digest(data)):
            raise ObjectCorrupt(f"object {name}: chunks do not match its size or digest")
        return data

    async def _last(self, subject: str) -> bytes | None:
        """The data of the last message on ``subject`` (a direct get), None if there is none."""
        msg = await self._requester.request(
            f"{JS_API}.DIRECT.GET.OBJ_{self._bucket}",
            json.dumps({"last_by_subj": subject}).encode(),
            timeout=self._timeout,
        )
        status = (msg.headers or {}).get(_STATUS)
        if status == "404":
            return None
        if status is not None:
            raise ObjectStoreError(f"direct get of {subject} failed: {status} {msg.headers}")
        return bytes(msg.data)
