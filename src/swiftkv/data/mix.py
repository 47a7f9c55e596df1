"""`--data A,B:2,C`: several sources read as one, interleaved by weight, as Snowflake's recipes mix
OpenOrca, AceMath and lmsys-chat. Each part is any single `--data` value (a chat JSONL, a `datasets`
folder, `sharegpt`, ...), optionally followed by `:WEIGHT` (a positive number, default 1).

The interleaving is deterministic and smooth: the next example comes from the source that is furthest
behind its share (`taken / weight` smallest; the earlier source on a tie), so `A,B:2` reads A, B, B, A, B,
B, ... and every stretch of the stream holds the sources in proportion. When a source runs out the others
go on in their own proportions, so no example of any source is dropped. The split's seeded shuffle (the
first `split.SHUFFLE_WINDOW` examples) and its held-out part then see the mixed stream as one source."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

SEPARATOR = ","
WEIGHT_MARK = ":"


def mix_parts(spec: str, single: Iterable[str] = ()) -> list[tuple[str, float]]:
    """The (source, weight) parts of a `--data` value; one part with weight 1 when it names one source
    (`single`: names that are one source whatever their characters, e.g. the `sharegpt` alias; a path
    that exists is one too, so a file whose name holds a comma still reads as itself)."""
    if spec in single or Path(spec).exists() or SEPARATOR not in spec and WEIGHT_MARK not in spec:
        return [(spec, 1.0)]
    return [weighted(part.strip(), spec) for part in spec.split(SEPARATOR)]


def weighted(part: str, spec: str) -> tuple[str, float]:
    """`SOURCE:WEIGHT` -> (SOURCE, WEIGHT); a part whose tail is not a number is a source of weight 1."""
    if not part:
        raise ValueError(f"--data {spec!r}: an empty source between commas; expected A,B:2,C")
    source, mark, tail = part.rpartition(WEIGHT_MARK)
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
    """The items of `streams` interleaved by `weights` (see the module docstring)."""
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
