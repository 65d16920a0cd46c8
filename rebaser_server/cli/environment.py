"""Misspelled settings said at start-up: every ``REBASER_*`` variable the daemon does not read, with the closest
name it does read (``REBASER_MAX_ATTEMTPS``: did you mean ``REBASER_MAX_ATTEMPTS``?), and the same for a
``--config`` file's unknown key.

A variable is known when an option of ``rebaser-server`` or of the ``rebaser`` command reads it (both are often
set in one environment), when it names a ``Settings`` field, or when it is one of :data:`OTHER_KNOWN`. Variables
under :data:`TOOLING_PREFIXES` belong to this project's test and benchmark tooling and are left alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

import click

from rebaser_core.settings import Settings

__all__ = ["OTHER_KNOWN", "TOOLING_PREFIXES", "closest", "known_variables", "unknown_variables"]

# Read outside any option of rebaser-server: the nats-server binary to run (rebaser_core.embedded.binary's
# ENV_NATS_SERVER, named here because importing it loads the embedded server's modules), and the one variable of
# the `rebaser` command that no daemon option shares (a shell that runs both often sets them all).
OTHER_KNOWN = frozenset({"REBASER_NATS_SERVER", "REBASER_DAEMON_URLS"})
TOOLING_PREFIXES = ("REBASER_TEST_", "REBASER_BENCH_", "REBASER_CHAOS_", "REBASER_POWERLOSS_")


def known_variables(command: click.Command) -> frozenset[str]:
    """Every ``REBASER_*`` variable ``command`` (and its subcommands) or the settings read."""
    names = set(OTHER_KNOWN) | {f"REBASER_{field.upper()}" for field in Settings.model_fields}
    commands: list[click.Command] = [command]
    while commands:
        current = commands.pop()
        for param in current.params:
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or ())
        if isinstance(current, click.Group):
            commands.extend(current.commands.values())
    return frozenset(name for name in names if name.startswith("REBASER_"))


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name most like ``name``, if any is close enough to be a likely misspelling. The ``REBASER_``
    prefix every variable shares is left out of the comparison (it would make any two names look alike)."""
    prefix = "REBASER_" if name.startswith("REBASER_") else ""
    tails = {other.removeprefix(prefix): other for other in known if other.startswith(prefix)}
    found = difflib.get_close_matches(name.removeprefix(prefix), list(tails), n=1, cutoff=0.7)
    return tails[found[0]] if found else None


def unknown_variables(environ: Mapping[str, str], known: frozenset[str]) -> list[str]:
    """One line per ``REBASER_*`` variable of ``environ`` that nothing reads, in name order."""
    lines = []
    for name in sorted(environ):
        if not name.startswith("REBASER_") or name in known or name.startswith(TOOLING_PREFIXES):
            continue
        guess = closest(name, known)
        hint = f" (did you mean {guess}?)" if guess else ""
        lines.append(f"{name} is set but rebaser-server does not read it{hint}")
    return lines
