"""The ``REBASER_PAUSES`` KV bucket: opening it, created with the deployment's storage and replicas.

What a pause says, and its keys, are the wire contract's (:mod:`rebaser_core.pauses`).
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from rebaser_core.nats.streams import open_bucket
from rebaser_core.subjects import Subjects

__all__ = ["open_pauses"]


async def open_pauses(
    js: JetStreamContext, subjects: Subjects, *, create: bool, replicas: int = 1, storage: str = "file"
) -> KeyValue | None:
    """The pauses bucket; None if it does not exist and ``create`` is false (then nothing is paused)."""
    config = KeyValueConfig(
        bucket=subjects.pauses_bucket,
        history=1,
        storage=StorageType.FILE if storage == "file" else StorageType.MEMORY,
        replicas=replicas,
    )
    return await open_bucket(js, config, create=create)
