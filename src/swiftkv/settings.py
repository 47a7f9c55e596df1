"""Settings are dataclasses, declared once: each field carries its default, type and help, and the
command line is generated from them (`swiftkv.cli.options`). This module holds the two helpers the
declarations share, so library code does not depend on the command line."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field


def setting(default, help: str, **metadata):  # noqa: A002 - mirrors argparse's keyword
    """A dataclass field with its --help text; metadata may add `key`, `flag`, `choices`, `parse`, `cli=False`."""
    return field(default=default, metadata={"help": help, **metadata})


def key_of(field: dataclasses.Field) -> str:
    """A setting's name outside its dataclass (metadata `key`; by default its field name): its option's name
    without dashes and its key in records, so that fields of one name in two sections stay apart."""
    return field.metadata.get("key", field.name)


def parse_count(text: str) -> int:
    """`1M`, `250k`, `65536` -> int."""
    units = {"k": 1_000, "m": 1_000_000}
    try:
        if text[-1:].lower() in units:
            return int(float(text[:-1]) * units[text[-1].lower()])
        return int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 65536, 250k, 1M)") from error
