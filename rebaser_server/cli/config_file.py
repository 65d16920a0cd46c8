"""``--config FILE`` and the layering of settings: the file, then ``REBASER_*`` variables, then flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from rebaser_core.settings import Settings
from rebaser_server.cli.environment import closest

__all__ = ["CONFIG_PATH", "FILE_SETTINGS", "load_config_file", "settings_from", "tunable"]


def load_config_file(ctx: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of option values (long names, ``-`` or ``_``) and ``Settings`` fields.

    Its values are defaults: a flag on the command line or a ``REBASER_*`` variable still wins over them. A value
    that is wrong for its option is refused here, naming the file and the key (click would name the option's
    environment variable, which the user did not set)."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as err:
        raise click.BadParameter(
            f"cannot read {path}: {err.strerror or err}", ctx=ctx, param=_param
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise click.BadParameter(f"{path} is not valid TOML: {err}", ctx=ctx, param=_param) from None
    options = {p.name: p for p in ctx.command.params if p.name and p.name != "config"}
    by_flag = {
        opt.lstrip("-").replace("-", "_"): p.name
        for p in ctx.command.params
        if p.name
        for opt in getattr(p, "opts", ())
        if opt.startswith("--")
    }
    defaults: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in by_flag and by_flag[name] in options:
            option = options[by_flag[name]]
            if getattr(option, "multiple", False) and isinstance(value, str):
                value = [value]  # nats-url = "nats://n1:4222": one of a repeatable option
            try:
                option.process_value(ctx, value)
            except click.BadParameter as err:
                raise click.BadParameter(err.message, ctx=ctx, param_hint=f"{key!r} in {path}") from None
            defaults[by_flag[name]] = value
        elif name in Settings.model_fields:
            settings[name] = value
        else:
            guess = closest(name, [*by_flag, *Settings.model_fields])
            shown = guess.replace("_", "-") if guess and "-" in key else guess  # in the file's own spelling
            hint = f" (did you mean {shown!r}?)" if shown else ""
            raise click.BadParameter(f"unknown key {key!r} in {path}{hint}", ctx=ctx, param=_param)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[FILE_SETTINGS] = settings
    ctx.meta[CONFIG_PATH] = path
    return path


def settings_from(
    file_settings: dict[str, Any], *, config_path: Path | None = None, **flags: object
) -> Settings:
    """Settings from the config file, then ``REBASER_*`` variables, then flags; a bad value is one line, naming
    where it came from (the flag, the variable, or the key in ``config_path``)."""
    sources = {name: f"{name!r} in {config_path or 'the config file'}" for name in file_settings}
    values = dict(file_settings)
    for name in Settings.model_fields:
        raw = os.environ.get(f"REBASER_{name.upper()}")
        if raw is not None:
            values[name], sources[name] = raw, f"REBASER_{name.upper()}"
    for name, value in flags.items():
        if value is not None:
            values[name], sources[name] = value, f"--{name.replace('_', '-')}"
    try:
        return Settings.model_validate(values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(map(str, e["loc"]))
            message = e["msg"].removeprefix("Value error, ")
            source = sources.get(str(e["loc"][0])) if e["loc"] else None
            if not e["loc"]:
                problems.append(message)
            else:
                problems.append(
                    f"{where}: {message} (got {e['input']!r}{f' from {source}' if source else ''})"
                )
        raise click.ClickException("bad setting: " + "; ".join(problems)) from None


FILE_SETTINGS = "rebaser.file_settings"
CONFIG_PATH = "rebaser.config_path"
_F = TypeVar("_F", bound=Callable[..., Any])
_TUNABLE = Settings.model_fields


def tunable(name: str, type_: type[Any] | click.ParamType[Any], help_text: str) -> Callable[[_F], _F]:
    """A flag for a ``Settings`` field: its default and its ``REBASER_*`` variable shown in ``--help``."""
    return click.option(
        f"--{name.replace('_', '-')}",
        name,
        type=type_,
        default=_TUNABLE[name].default,
        envvar=f"REBASER_{name.upper()}",
        show_envvar=True,
        help=help_text,
    )
