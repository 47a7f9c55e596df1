"""The `--data` grammar of convert (calibration), distill and eval: every source yields examples,
each a chat (`messages`: [{"role": "system" | "user" | "assistant", "content": str}, ...]) or a
plain text (str).

  sharegpt        the offline ShareGPT wheel, training part (the held-out records are never read
                  as data; they stay in the stream as None so seeded shuffles keep their order)
  FILE.jsonl      one record per line, of any layout of `schemas.LAYOUTS` (chat messages, ShareGPT, OpenOrca,
                  Alpaca, prompt/response, ..., or {"text": ...})
  FILE.json       a JSON array of such records
  FILE.txt/.md/.rst, or a FOLDER of them   plain text, one example per file
  FOLDER          a `datasets.save_to_disk` folder of such records
  A,B:2,C         several of the above interleaved by weight (`mix_parts`, `interleave` below)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import sharegpt
from .schemas import Example, Messages, record_to_example

SHAREGPT_ALIAS = "sharegpt"
TEXT_SUFFIXES = (".txt", ".md", ".rst")
DATA_HELP = (
    "'sharegpt', a .jsonl/.json chat or text file, a .txt/.md/.rst file or folder, a datasets.save_to_disk "
    "folder, or several of them interleaved by weight (A,B:2,C)"
)


def first_user_index(messages: Messages) -> int | None:
    return next((i for i, m in enumerate(messages) if m["role"] == "user"), None)


def from_first_user(messages: Messages) -> Messages | None:
    """The conversation from its first user turn on (a reply with no question before it is not a
    chat turn to judge)."""
    first = first_user_index(messages)
    return None if first is None else messages[first:]


def first_user_prompt(messages: Messages) -> Messages | None:
    """The conversation up to and including its first user turn: the prompt a model answers (None
    when there is no user turn or it is empty)."""
    first = first_user_index(messages)
    if first is None or not messages[first]["content"].strip():
        return None
    return messages[: first + 1]


def read_jsonl(path: Path) -> Iterator[Example | None]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
            yield record_to_example(record, f"{path}:{number}")


def read_json_array(path: Path) -> Iterator[Example | None]:
    for index, record in enumerate(sharegpt.iter_json_array(path)):
        yield record_to_example(record, f"{path}[{index}]")


def utf8_error(path: Path) -> ValueError:
    """A one-line error naming the line and byte offset of the first invalid UTF-8 in `path` (the
    decoder's own message names neither the file nor the place)."""
    offset = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return ValueError(
                    f"{path}:{number}: invalid UTF-8 (byte 0x{line[error.start]:02x} at byte offset "
                    f"{offset + error.start}); expected UTF-8 encoded JSON"
                )
            offset += len(line)
    return ValueError(f"{path}: invalid UTF-8; expected UTF-8 encoded JSON")


def read_text_files(path: Path) -> Iterator[str]:
    """One example per text file (a file, or every *.txt / *.md / *.rst below a folder, sorted)."""
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    )
    for file in files:
        yield file.read_text(encoding="utf-8", errors="replace")


def is_dataset_folder(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def loaded_dataset_folder(folder: Path):
    """A `save_to_disk` folder's dataset (of a DatasetDict, its train split, else its first)."""
    import datasets

    dataset = datasets.load_from_disk(str(folder))
    if isinstance(dataset, datasets.DatasetDict):
        dataset = dataset["train"] if "train" in dataset else next(iter(dataset.values()))
    return dataset


def read_hf_dataset(folder: Path) -> Iterator[Example | None]:
    for index, record in enumerate(loaded_dataset_folder(folder)):
        yield record_to_example(record, f"{folder}[{index}]")


def read_sharegpt() -> Iterator[Messages | None]:
    for index, record in enumerate(sharegpt.iter_json_array(sharegpt.sharegpt_file())):
        yield sharegpt.messages_of(record) if index < sharegpt.HELDOUT_START else None


# --------------------------------------------------------------------------------------------------
# Several sources as one: `--data A,B:2,C`
# --------------------------------------------------------------------------------------------------
# As Snowflake's recipes mix OpenOrca, AceMath and lmsys-chat. Each part is any single `--data` value (a
# chat JSONL, a `datasets` folder, `sharegpt`, ...), optionally followed by `:WEIGHT` (a positive number,
# default 1). The interleaving is deterministic and smooth: the next example comes from the source that is
# furthest behind its share (`taken / weight` smallest; the earlier source on a tie), so `A,B:2` reads A, B,
# B, A, B, B, ... and every stretch of the stream holds the sources in proportion. When a source runs out the
# others go on in their own proportions, so no example of any source is dropped. The split's seeded shuffle
# and its held-out part then see the mixed stream as one source.

MIX_SEPARATOR = ","
MIX_WEIGHT_MARK = ":"


def mix_parts(spec: str, single: Iterable[str] = ()) -> list[tuple[str, float]]:
    """The (source, weight) parts of a `--data` value; one part with weight 1 when it names one source
    (`single`: names that are one source whatever their characters, e.g. the `sharegpt` alias; a path
    that exists is one too, so a file whose name holds a comma still reads as itself)."""
    if spec in single or Path(spec).exists() or MIX_SEPARATOR not in spec and MIX_WEIGHT_MARK not in spec:
        return [(spec, 1.0)]
    return [weighted(part.strip(), spec) for part in spec.split(MIX_SEPARATOR)]


def weighted(part: str, spec: str) -> tuple[str, float]:
    """`SOURCE:WEIGHT` -> (SOURCE, WEIGHT); a part whose tail is not a number is a source of weight 1."""
    if not part:
        raise ValueError(f"--data {spec!r}: an empty source between commas; expected A,B:2,C")
    source, mark, tail = part.rpartition(MIX_WEIGHT_MARK)
    try:
        weight = float(tail) if mark else None
    except ValueError:
        weight = None
    if weight is None:
        return part, 1.0
    if not weight > 0 or not source:
        raise ValueError(
            f"--data {spec!r}: {part!r} needs a source and a positive weight, e.g. chats.jsonl:2"
        )
    return source, weight


def interleave(streams: list[Iterator], weights: list[float]) -> Iterator:
    """The items of `streams` interleaved by `weights` (see the comment above)."""
    live = list(range(len(streams)))
    taken = [0] * len(streams)
    while live:
        pick = min(live, key=lambda i: (taken[i] / weights[i], i))
        try:
            item = next(streams[pick])
        except StopIteration:
            live.remove(pick)
            continue
        taken[pick] += 1
        yield item


def check_source(spec: str, option: str = "--data") -> None:
    """Raise FileNotFoundError when a `--data` value names nothing to read, so a command can tell
    before it loads a model (`read_source` reads lazily)."""
    parts = mix_parts(spec, single=(SHAREGPT_ALIAS,))
    if len(parts) > 1:
        for part, _ in parts:
            check_source(part, option)
        return
    spec = parts[0][0]  # one source (a weight alone changes nothing)
    if spec == SHAREGPT_ALIAS:
        sharegpt.sharegpt_file()
    elif not Path(spec).exists():
        raise FileNotFoundError(f"{option} {spec!r}: no such file or folder; expected {DATA_HELP}")


def read_source(spec: str, option: str = "--data") -> Iterator[Example | None]:
    """The examples of a `--data` value (None marks an example that is to be skipped)."""
    check_source(spec, option)
    parts = mix_parts(spec, single=(SHAREGPT_ALIAS,))
    if len(parts) > 1:
        yield from interleave([read_source(part, option) for part, _ in parts], [w for _, w in parts])
        return
    spec = parts[0][0]
    if spec == SHAREGPT_ALIAS:
        yield from read_sharegpt()
        return
    path = Path(spec)
    if path.is_dir():
        yield from read_hf_dataset(path) if is_dataset_folder(path) else read_text_files(path)
    elif path.suffix in (".jsonl", ".json"):
        records = read_jsonl(path) if path.suffix == ".jsonl" else read_json_array(path)
        try:
            yield from records
        except UnicodeDecodeError:
            raise utf8_error(path) from None
    elif path.suffix in TEXT_SUFFIXES:
        yield from read_text_files(path)
    else:
        raise ValueError(f"{option} {spec!r}: unknown file type {path.suffix!r}; expected {DATA_HELP}")
