"""The ``rebaser`` command: :mod:`~rebaser_client.admin.cli.main` is the group (the console script's ``main``) and
the commands that send requests; every other module is one operator command or group, and
:mod:`~rebaser_client.admin.cli.common` is what they share.

The commands parse options and print; the work is done by ``rebaser_client.admin`` and the library. A command
answers at once: nats-py, pydantic and rich are imported by the commands that use them, never by ``--help`` or
option parsing (:mod:`~rebaser_client.admin.cli.lazy_imports` defers nats-py's aiohttp too).
"""
