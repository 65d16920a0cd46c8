"""The life of one owned change set: from its task taken to its task acked or handed back.

The processor (:mod:`~rebaser_server.changeset.processor`) runs the lifecycle: acquire the record (fencing every
earlier owner; whether a request is queued read meanwhile, :mod:`~rebaser_server.changeset.cold_start`), consume the
change set's requests in stream order through one ordered push consumer (:mod:`~rebaser_server.changeset.consumer`,
bookkeeping in :mod:`~rebaser_server.changeset.ordering`), run the dependent values updates
(:mod:`~rebaser_server.changeset.dvu`, :mod:`~rebaser_server.changeset.dvu_runs`) and let go when quiet
(the rule :mod:`~rebaser_server.changeset.quiet`, applied by :mod:`~rebaser_server.changeset.idle`;
:mod:`~rebaser_server.changeset.release`).

One request's path, decide then act:

1. the consumer hands the delivery to ``ChangeSetProcessor._on_request``;
2. :class:`~rebaser_server.changeset.handling.RequestHandler` reads it against the group's record and returns a
   :class:`~rebaser_server.changeset.decisions.Decision` (applied, replayed, refused with a dead letter, an
   attempt to count, or retry); it sends, writes and commits nothing;
3. :class:`~rebaser_server.changeset.postprocess.PostProcess` stages the decision in the open commit group
   (:mod:`~rebaser_server.changeset.group`) and decides when the group is carried out: it is the only place that
   flushes;
4. a flush carries out the group's decisions in order: dead letters, the record's commit, the counters, the
   replies (:mod:`~rebaser_server.changeset.replies`), the removal of the processed requests
   (:mod:`~rebaser_server.changeset.trimmer`), the DVU notification.

What the owned change sets of one daemon share is cut by concern in :mod:`~rebaser_server.changeset.context`
(the connection, where to report, the shard layout, the counters) and handed to each processor as
:class:`~rebaser_server.changeset.owning.Owning`; every piece below the processor gets only what it uses.

What the change set's followers are told (its event feed, decided with each commit and carried by its write) is
:mod:`~rebaser_server.changeset.events`; the events stream, with ``events`` on, is stored in order by
:mod:`~rebaser_server.changeset.event_pump`, which finds what the stream holds already (an earlier owner's events, a
batch that got no answer) through :mod:`~rebaser_server.changeset.event_lookup`. A paused change set is let go by
:func:`~rebaser_server.changeset.release.let_go_paused`, and one whose record cannot be read is paused (quarantined)
by :mod:`~rebaser_server.changeset.quarantine` instead of being retried for ever.

How a task ends is :mod:`~rebaser_server.changeset.outcome`; the order across a shard layout change is
:mod:`~rebaser_server.changeset.migration`; app steps run under the lease in :mod:`~rebaser_server.changeset.steps`.

May import: ``rebaser_core``, :mod:`rebaser_server.app`, :mod:`rebaser_server.task`,
:mod:`rebaser_server.record` and :mod:`rebaser_server.ops`.
"""
