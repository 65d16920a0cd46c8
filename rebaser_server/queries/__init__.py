"""Queries any daemon answers about any change set, owned or not: get, fork, the reply to a request, settled.

- :mod:`~rebaser_server.queries.service`: the query subscriptions and their answers;
- :mod:`~rebaser_server.queries.settled`: holding a ``settled`` wait until the change set settles.

May import: everything below it (:mod:`rebaser_server.changeset` and down).
"""
