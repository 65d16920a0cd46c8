"""Queries any daemon answers about any change set, owned or not: get, fork, the reply to a request, settled.

- :mod:`~rebaser_server.queries.service`: the query subscriptions and their answers;
- :mod:`~rebaser_server.queries.settled`: holding a ``settled`` wait until the change set settles;
- :mod:`~rebaser_server.queries.follow`: event followers' consumers, checked and made on their behalf;
- :mod:`~rebaser_server.queries.gate`: the requests of callers in accounts of their own, passed on within their
  workspace's limit.

May import: everything below it (:mod:`rebaser_server.changeset` and down).
"""
