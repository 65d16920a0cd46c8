"""The change set's record: its committed state, the fence, the idempotency memory, read and written in KV.

- :mod:`~rebaser_server.record.model`: the record's form (fields, encoding, decoding of untrusted bytes,
  remembered replies), free of NATS;
- :mod:`~rebaser_server.record.store`: the store, which reads the record and takes a change set over by bumping
  its epoch;
- :mod:`~rebaser_server.record.handle`: the per-ownership handle that commits the record by compare-and-set (the
  fence: a commit by an owner whose epoch was bumped fails) and reads back a write whose answer was lost;
- :mod:`~rebaser_server.record.direct_reads`: reads of a stream's last message as its leader has it;
- :mod:`~rebaser_server.record.reader`: what an app may read besides its own change set (another change set's
  committed state, a request's stored batch): the daemon's ``ChangeSetReader``.

May import: ``rebaser_core``, :mod:`rebaser_server.app` and :mod:`rebaser_server.task`.
"""
