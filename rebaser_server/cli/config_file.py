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

__all__ = ["FILE_SETTINGS", "load_config_file", "settings_from", "tunable"]


def load_config_file(ctx: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of option values (long names, ``-`` or ``_``) and ``Settings`` fields.

    Its values are defaults: a flag on the command line or a ``REBASER_*`` variable still wins over them."""
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
            defaults[by_flag[name]] = value
        elif name in Settings.model_fields:
            settings[name] = value
        else:
            raise click.BadParameter(f"unknown key {key!r} in {path}", ctx=ctx, param=_param)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[FILE_SETTINGS] = settings
    return path


def settings_from(file_settings: dict[str, Any], **flags: object) -> Settings:
    """Settings from the config file, then ``REBASER_*`` variables, then flags; a bad value is one line."""
    values = dict(file_settings)
    values.update(
        {
            name: raw
            for name in Settings.model_fields
            if (raw := os.environ.get(f"REBASER_{name.upper()}")) is not None
        }
    )
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(map(str, e["loc"]))
            message = e["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message} (got {e['input']!r})" if e["loc"] else message)
        raise click.ClickException("bad setting: " + "; ".join(problems)) from None


FILE_SETTINGS = "rebaser.file_settings"
_F = TypeVar("_F", bound=Callable[..., Any])
_TUNABLE = Settings.model_fields


def tunable(name: str, type_: type[Any], help_text: str) -> Callable[[_F], _F]:
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
