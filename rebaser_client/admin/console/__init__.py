"""``rebaser console``: a web console an operator opens in a browser (docs/console.md).

It owns:

- :mod:`~rebaser_client.admin.console.server`: the aiohttp application, its pages and actions;
  :mod:`~rebaser_client.admin.console.guard`: the guard every request goes through (a token off loopback, the Host,
  the CSRF header and Origin of an action, read-only mode) and the audit log of what it lets through and refuses;
  :mod:`~rebaser_client.admin.console.sse`: the pages' live updates, as server-sent events.
- :mod:`~rebaser_client.admin.console.live`: the one set of NATS watches and reads of a console process, shared by
  every open browser (no browser makes NATS work of its own), and :mod:`~rebaser_client.admin.console.hub`, which
  fans what changed out to the browsers.
- :mod:`~rebaser_client.admin.console.index`: what is known of every change set, and the list's filters (pure).
- :mod:`~rebaser_client.admin.console.actions`: pause, resume, skip, replay and drop, one or many, asked first.
- :mod:`~rebaser_client.admin.console.pages`, :mod:`~rebaser_client.admin.console.pages_detail`,
  :mod:`~rebaser_client.admin.console.html` and :mod:`~rebaser_client.admin.console.views`: the HTML (pure but for
  the views' shared reads); ``static/``: the script and style sheet, the console's only assets (nothing is loaded
  from elsewhere).

May import: the operators' reads and writes (``rebaser_client.admin``: status, change_set, dead_letters, repairs),
their formatting (``format``, ``format_actions``), the library (pausing and skipping are the library's) and
``rebaser_core``; aiohttp. Never ``rebaser_client.admin.cli`` (the command imports this package, not the other way)
nor ``rebaser_server``. One implementation, two faces: an action here calls what the ``rebaser`` command calls. The
layers inside (the server above its guard, the pages and actions, above the live state, above the index and hub) are an
import-linter contract in ``pyproject.toml``.
"""
