"""rebaser_core.nats: the NATS plumbing that client and server share. It talks to NATS through nats-py, and does
the speed work on that path.

It owns:

- connecting: :mod:`.connect` (the options an operator passes, server URLs checked and redacted, closing without
  raising);
- request-reply and subscriptions lighter than nats-py's: :mod:`.requester` (one reply subscription, JetStream API
  calls, direct gets), :mod:`.inline_subscription` (messages handled in nats-py's read loop), :mod:`.deadlines`
  (many calls' timeouts on one timer); :mod:`.cancellation` (a cancel that nats-py's waits lose on Python 3.11,
  raised where a background loop next sleeps);
- nats-py's header routines done faster: :mod:`.speedups`. JetStream publish acks read without ``json.loads``:
  :mod:`.pub_ack`;
- publishing a change set's task and turning JetStream's refusals into typed errors: :mod:`.tasks`;
- the JetStream objects: the stream and consumer configurations built from the settings, their creation and the
  KV buckets (:mod:`.streams`); a whole bucket read or followed, with an end of its initial values that can be
  trusted (:mod:`.bucket_watch`); the layout bucket, with the durability a daemon found
  (:mod:`.layout_store`); the pauses bucket (:mod:`.pause_store`); each shard's facts and leaders
  (:mod:`.shard_info`);
- what an acknowledged write survives: :mod:`.durability` (pure logic), read from the servers' monitoring
  endpoints by :mod:`.monitoring`.

May import: nats-py and the wire contract, which is rebaser_core's other modules (ids, subjects, settings, headers,
errors, layout, pauses, batches, ``api``...). It never imports :mod:`rebaser_core.embedded` or
:mod:`rebaser_core.testing`, and never the client or the server. The wire contract never imports this package, nor
nats-py. The import-linter contracts in ``pyproject.toml`` enforce both rules.

This file imports nothing. The command lines import :mod:`.connect` to check a ``--nats-url`` before they know
whether they will connect, and they must not pay for nats-py then. Inside the package every import is absolute
(``import nats``, ``from rebaser_core.nats.requester import ...``), so ``nats`` is always nats-py.
"""
