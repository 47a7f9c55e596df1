"""Command-line options generated from settings dataclasses, so each setting is declared once: its
name, type, default and help live on the dataclass field; argparse only reads them.

A field's metadata may carry `help`, `key` (its name outside the dataclass: the option's and
`given_values`' key), `flag` (a different option name), `choices`, `parse` (a
converter, e.g. token counts like `1M`), `repeat=True` (the option may be given several times; the
setting holds a tuple of the values) and `cli=False` (not an option). A bool setting is a switch:
`--NAME` when it defaults to False, `--no-NAME` when it defaults to True. Options default to None on
the command line so that "not given" stays distinguishable from "given the default": presets
(e.g. distillation recipes) fill what the user left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from ..dtypes import DTYPE_CHOICES
from ..settings import key_of
from ..sources import SMOLLM2_ALIAS


def option_name(field: dataclasses.Field) -> str:
    """--KEY, or --no-KEY for a setting that is on by default (the option switches it off)."""
    prefix = "--no-" if field.default is True else "--"
    return field.metadata.get("flag", prefix + key_of(field).replace("_", "-"))


def base_type(field: dataclasses.Field, owner: type) -> type:
    """int, float, str or bool from an annotation such as `int | None`."""
    hint = typing.get_type_hints(owner)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_dataclass_options(
    parser: argparse.ArgumentParser,
    settings_class: type,
    skip: tuple[str, ...] = (),
    dest_prefix: str = "",
) -> None:
    """One option per field of `settings_class` (except `skip` and fields with metadata cli=False), its
    default shown in --help; the parsed value stays None when the option is not given. `dest_prefix` keeps
    a class's values apart from another's of the same field name on one parser (read them back with
    `given_values(..., dest_prefix)`)."""
    for field in dataclasses.fields(settings_class):
        if field.name in skip or not field.metadata.get("cli", True):
            continue
        kind = base_type(field, settings_class)
        help_text = field.metadata.get("help", "")
        default = field.default
        if kind is bool:  # a switch: --NAME turns an off setting on, --no-NAME an on setting off
            action = "store_false" if field.default is True else "store_true"
            parser.add_argument(
                option_name(field),
                dest=dest_prefix + key_of(field),
                action=action,
                default=None,
                help=help_text,
            )
            continue
        if default not in (None, dataclasses.MISSING, False, ""):
            help_text = f"{help_text} (default: {default})".strip()
        parser.add_argument(
            option_name(field),
            dest=dest_prefix + key_of(field),
            default=None,
            action="append" if field.metadata.get("repeat") else "store",
            type=field.metadata.get("parse", kind),
            choices=field.metadata.get("choices"),
            help=help_text.replace("%", "%%"),
        )


def given_values(args: argparse.Namespace, settings_class: type, dest_prefix: str = "") -> dict[str, Any]:
    """The settings the user gave on the command line (options left out are absent), by key (`key_of`)."""
    names = {key_of(f) for f in dataclasses.fields(settings_class) if f.metadata.get("cli", True)}
    values = {k.removeprefix(dest_prefix): v for k, v in vars(args).items() if k.startswith(dest_prefix)}
    return {k: repeated(v) for k, v in values.items() if k in names and v is not None}


def repeated(value):
    """A repeatable option's values (a list) as the setting holds them: one value as itself, several as a
    tuple; any other option's value unchanged."""
    if not isinstance(value, list):
        return value
    return value[0] if len(value) == 1 else tuple(value)


def source_help() -> str:
    return (
        f"HF folder, .gguf file, alias ({SMOLLM2_ALIAS}, {SMOLLM2_ALIAS}-swiftkv50, ...) or Hub repo id "
        "(org/name, from the Hugging Face cache or downloaded into it)"
    )


def add_revision_option(parser) -> None:
    """`--revision` of a command that opens its one model itself (its settings, if any, hold no source)."""
    parser.add_argument(
        "--revision", help="the model's revision (branch, tag or commit) when it is a Hub repo id"
    )


def add_dtype_option(parser) -> None:
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="compute dtype (default auto: bf16 where the hardware has it natively, else fp32)",
    )
