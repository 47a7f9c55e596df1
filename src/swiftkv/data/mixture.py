"""What `--data` reads: one or several sources, each whole or sampled to an exact count.

  --data SOURCE[:COUNT|:all]      given once or several times
  SOURCE   `sharegpt`, a JSONL / JSON / text file or folder, a `datasets.save_to_disk` folder (`chat`), or
           a dataset name that `datasets.load_dataset` finds (NAME, or NAME@SPLIT; default --data-split,
           train)
  COUNT    that many records (500000, 500k), drawn without replacement with the run's seed; asking
           for more than the source holds is an error naming both numbers. Without a count, or with
           `:all`, every record is read.

Several sources are interleaved in proportion to their counts (`chat.interleave`), so every stretch of
the stream, and with it the split's seeded window (`split.SHUFFLE_WINDOW`), holds them in proportion:
Snowflake's 3 x 500,000 mix is three `--data NAME:500000`. A value with commas (A,B:2,C) is the older
mix by weight of whole sources (`chat.mix_parts`).

Everything is checked (`check_data`) before a command loads a model: each source is opened and
counted, so a name that cannot be loaded or a count too large fails first.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..files import atomic_file
from ..settings import parse_count
from . import chat, sharegpt
from .schemas import Example, record_to_example

DataSpec = str | tuple[str, ...]  # one --data value, or several
ALL = "all"
DEFAULT_SPLIT = "train"
COUNT_PATTERN = re.compile(r"\d+(\.\d+)?[kKmM]?")
PATH_SUFFIXES = (".jsonl", ".json", *chat.TEXT_SUFFIXES)  # a missing file, not a dataset name
SPLIT_HELP = "the split of a --data dataset name given without @SPLIT"
DATA_HELP = (
    f"{chat.DATA_HELP}, or a dataset name that datasets.load_dataset finds (NAME or NAME@SPLIT); "
    "each optionally :COUNT (records sampled with the run's seed) or :all, and --data repeated to mix sources"
)


@dataclass(frozen=True)
class Part:
    """One --data value: a source and how many of its records (None: all)."""

    source: str
    count: int | None = None


@dataclass(frozen=True)
class Records:
    """One source's records: how many there are (counted on demand), and its examples, all of them in
    the source's order or those at sorted indices."""

    size: Callable[[], int]
    examples: Callable[[list[int] | None], Iterator[Example | None]]


def parse_part(text: str, option: str = "--data") -> Part:
    """`SOURCE`, `SOURCE:COUNT` or `SOURCE:all` (a path that exists is a source whatever its characters)."""
    source, mark, tail = text.rpartition(":")
    if Path(text).exists() or not (mark and source):
        return Part(text)
    if tail == ALL:
        return Part(source)
    if not COUNT_PATTERN.fullmatch(tail):
        return Part(text)
    count = parse_count(tail)
    if count < 1:
        raise ValueError(f"{option} {text!r}: a count of {count}; expected at least 1 record, or :{ALL}")
    return Part(source, count)


def parts_of(spec: DataSpec, option: str = "--data") -> list[Part] | None:
    """The parts of a --data setting; None for a comma mix by weight (read by `chat.read_source`)."""
    values = (spec,) if isinstance(spec, str) else tuple(spec)
    if len(values) == 1 and len(chat.mix_parts(values[0], single=(chat.SHAREGPT_ALIAS,))) > 1:
        return None
    return [parse_part(value, option) for value in values]


def check_data(spec: DataSpec, option: str = "--data", split: str = DEFAULT_SPLIT) -> None:
    """Open and count every source of `spec`, so a missing file, a dataset that cannot be loaded or a
    count over a source's size fails before any model loads."""
    parts = parts_of(spec, option)
    if parts is None:
        chat.check_source(spec, option)
        return
    for part in parts:
        records = open_records(part.source, option, split)
        if part.count is not None:
            check_count(part, records.size(), option)


def check_count(part: Part, size: int, option: str) -> None:
    if part.count > size:
        raise ValueError(
            f"{option} {part.source}:{part.count}: asks for {part.count:,} records, but the source holds "
            f"{size:,}; expected a count of at most {size:,}, or {part.source}:{ALL} for every record"
        )


def read_data(
    spec: DataSpec, seed: int = 0, option: str = "--data", split: str = DEFAULT_SPLIT
) -> Iterator[Example | None]:
    """The examples of a --data setting (None marks an example to skip, kept so seeded orders hold);
    `split`: the split of a dataset name given without @SPLIT (--data-split)."""
    parts = parts_of(spec, option)
    if parts is None:
        yield from chat.read_source(spec, option)
        return
    check_data(spec, option, split)
    streams, weights = [], []
    for part in parts:
        records = open_records(part.source, option, split)
        indices = None if part.count is None else sampled(part, records.size(), seed)
        streams.append(records.examples(indices))
        weights.append(len(indices) if indices is not None else (records.size() if len(parts) > 1 else 1))
    yield from streams[0] if len(streams) == 1 else chat.interleave(streams, weights)


def sampled(part: Part, size: int, seed: int) -> list[int]:
    """`part.count` record indices of `size`, drawn with the run's seed alone (so the same records given
    by another path, or as JSONL instead of a saved dataset, give the same sample), in the source's order."""
    return sorted(random.Random(seed).sample(range(size), part.count))


def picked(examples: Iterable, indices: list[int] | None) -> Iterator:
    """The items of `examples` at the sorted `indices` (all of them for None)."""
    if indices is None:
        yield from examples
        return
    wanted = iter(indices)
    target = next(wanted, None)
    for index, example in enumerate(examples):
        if target is None:
            return
        if index == target:
            yield example
            target = next(wanted, None)


# --------------------------------------------------------------------------------------------------
# Opening one source
# --------------------------------------------------------------------------------------------------


def open_records(source: str, option: str = "--data", split: str = DEFAULT_SPLIT) -> Records:
    path = Path(source)
    if source == chat.SHAREGPT_ALIAS:
        sharegpt.sharegpt_file()
        return Records(lambda: sharegpt.HELDOUT_START, lambda indices: picked(chat.read_sharegpt(), indices))
    if path.is_dir() and chat.is_dataset_folder(path):
        return dataset_records(chat.loaded_dataset_folder(path), str(path))
    if path.exists():
        chat.check_source(source, option)
        return Records(
            lambda: local_size(path), lambda indices: picked(chat.read_source(source, option), indices)
        )
    if path.suffix in PATH_SUFFIXES or source.startswith((".", "/", "~")):
        chat.check_source(source, option)  # a missing file: its own error
    name, _, named_split = source.partition("@")
    return dataset_records(loaded_by_name(name, named_split or split, option), source)


def local_size(path: Path) -> int:
    """The records of a local source that is not a `datasets` folder: lines, array items or files."""
    if path.suffix == ".jsonl":
        with path.open("rb") as lines:
            return sum(1 for line in lines if line.strip())
    if path.suffix == ".json":
        return sum(1 for _ in sharegpt.iter_json_array(path))
    return sum(1 for _ in chat.read_text_files(path))


def dataset_records(dataset, where: str) -> Records:
    def examples(indices: list[int] | None) -> Iterator[Example | None]:
        chosen = dataset if indices is None else dataset.select(indices)
        positions = range(len(dataset)) if indices is None else indices
        for index, record in zip(positions, chosen, strict=True):
            yield record_to_example(record, f"{where}[{index}]")

    return Records(lambda: len(dataset), examples)


def loaded_by_name(name: str, split: str, option: str):
    """`datasets.load_dataset(name, split=split)`, or one error naming the dataset and, offline, the
    setting that keeps the hub out of reach."""
    import datasets

    try:
        return datasets.load_dataset(name, split=split)
    except Exception as error:  # datasets raises many kinds (not found, offline, no such split, ...)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{option} {name}@{split}: not a file or folder here, and datasets.load_dataset({name!r}, "
            f"split={split!r}) failed ({reason}). With HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) only a "
            "dataset already in the datasets cache loads: load it once online, or save_to_disk it and pass "
            f"the folder"
        ) from error


def write_examples(spec: DataSpec, out: Path, seed: int = 0, split: str = DEFAULT_SPLIT) -> int:
    """The examples of `spec` as a JSONL file of `{"messages": [...]}` / `{"text": ...}` records (those
    with nothing to learn from left out), written to a temp file and renamed; returns how many."""
    check_data(spec, split=split)
    written = 0
    with atomic_file(out) as tmp, tmp.open("w", encoding="utf-8") as lines:
        for example in read_data(spec, seed, split=split):
            if example is not None:
                record = {"text": example} if isinstance(example, str) else {"messages": example}
                lines.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
    return written
