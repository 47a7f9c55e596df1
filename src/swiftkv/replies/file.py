"""The reply file: one JSONL record per reply (the prompt's key, the reply's ids, whether the writer
stopped; with the chat, a chat record `--data` reads), appended in the prompts' order and fsync'd, read back
with a torn last line cut off; and `ReplyCache`, the replies by prompt, which writes the missing ones."""

from __future__ import annotations

import json
import lzma
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from tqdm import tqdm

from ..data.tokens import Reply, prompt_key
from .vllm_engines import Stream

# Prompts the split's walk takes at a time. It decides which examples the written prompts consume, and so
# where --targets mixed takes its human chats from: the writing and the reading walk share it. vLLM is not
# bound to it (it is handed every pending prompt at once); transformers' generation answers one at a time.
WALK_BATCH = 64
# The replies appended together as they finish, in the prompts' order: at least this many, or what is ready
# after FLUSH_SECONDS. One fsync each.
FLUSH_RECORDS = 1024
FLUSH_SECONDS = 5.0

Generate = Callable[[list[list[int]]], list[Reply]]  # prompt token ids -> greedy replies
Prompt = tuple[list[int], list[dict] | None]  # a prompt's token ids and its chat (None: ids only)


def note_unwritten(
    written: Mapping[str, Reply],
    prompts: list[list[int]],
    chats: list[list[dict]] | None,
    into: dict[str, Prompt],
) -> list[str]:
    """The keys of `prompts`; each prompt whose reply is not `written` is noted in `into` (once)."""
    keys = [prompt_key(p) for p in prompts]
    for k, key in enumerate(keys):
        if key not in written:
            into.setdefault(key, (prompts[k], chats[k] if chats else None))
    return keys


def stream_of(generate: Generate, batch: int) -> Stream:
    """The replies of `generate` as they finish: its own stream (vLLM), or `batch` prompts per call."""
    if hasattr(generate, "stream"):
        return generate.stream

    def batches(prompts):
        for start in range(0, len(prompts), batch):
            yield from enumerate(generate(prompts[start : start + batch]), start)

    return batches


class Replies(Mapping[str, Reply]):
    """Replies by prompt key, the first of a repeated key kept. Each reply's ids are held packed (int32,
    4 bytes a token where a Python list takes ~36): a GPU-scale reply file holds ~10^9 tokens."""

    def __init__(self):
        self.packed: dict[str, tuple[array, bool]] = {}

    def __getitem__(self, key: str) -> Reply:
        ids, finished = self.packed[key]
        return Reply(ids.tolist(), finished)

    def __contains__(self, key: object) -> bool:
        return key in self.packed

    def __iter__(self) -> Iterator[str]:
        return iter(self.packed)

    def __len__(self) -> int:
        return len(self.packed)

    def add(self, replies: Mapping[str, Reply]) -> None:
        for key, reply in replies.items():
            if key not in self.packed:
                self.packed[key] = (array("i", reply.ids), reply.finished)


def read_replies(path: Path) -> Replies:
    """Complete records of `path`, read line by line; a torn last line (a kill mid-write) is cut off the
    file. A `.xz` file (the records' ids as kept in the repository) is read as it is."""
    if not path.is_file():
        return Replies()
    if path.suffix != ".xz":
        cut_torn_line(path)
    with lzma.open(path, "rb") if path.suffix == ".xz" else path.open("rb") as lines:
        return reply_records(lines, path)


def cut_torn_line(path: Path, chunk: int = 1 << 16) -> None:
    """Truncate `path` after its last newline, reading back from the end a chunk at a time."""
    size = keep = path.stat().st_size
    with path.open("rb") as handle:
        while keep > 0:
            start = max(0, keep - chunk)
            handle.seek(start)
            newline = handle.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
    if keep != size:
        os.truncate(path, keep)


def reply_records(lines: Iterable[bytes], path: Path) -> Replies:
    """The replies of a reply file's lines, by prompt key (the first of a repeated key)."""
    replies = Replies()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            replies.add({record["key"]: Reply(record["reply_ids"], record["finished"])})
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path}:{number}: not a teacher-reply record ({error}); delete the file to regenerate it"
            ) from error
    return replies


def reply_record(key: str, reply: Reply) -> dict:
    """A reply file's record of one reply, as `read_replies` reads it back."""
    return {"key": key, "reply_ids": reply.ids, "finished": reply.finished}


def append_replies(
    path: Path, records: dict[str, Reply], chats: dict[str, list[dict]] | None = None, tokenizer=None
) -> None:
    """Append `records`; with their prompt `chats` and a tokenizer, each line is also a chat record
    (`messages`: the prompt, then the reply as text) that `--data` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for key, reply in records.items():
            record = reply_record(key, reply)
            if chats and key in chats and tokenizer is not None:
                text = tokenizer.decode(reply.ids, skip_special_tokens=True)
                record = {"messages": [*chats[key], {"role": "assistant", "content": text}], **record}
            handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class ReplyCache:
    """The writer's replies by prompt, generated on demand and kept in a JSONL file."""

    def __init__(self, path: Path, generate: Generate, tokenizer=None):
        self.path = path
        self.generate = generate
        self.tokenizer = tokenizer  # decodes the replies into the chat records (None: ids only)
        self.batch = getattr(generate, "batch", WALK_BATCH)  # prompts the walk takes at a time
        self.replies = read_replies(path)
        self.generated = 0

    def get(self, prompts: list[list[int]], chats: list[list[dict]] | None = None) -> list[Reply]:
        missing: dict[str, Prompt] = {}
        keys = note_unwritten(self.replies, prompts, chats, missing)
        if missing:
            self.write(missing, stream_of(self.generate, self.batch))
        return [self.replies[k] for k in keys]

    def write(self, pending: dict[str, Prompt], stream: Stream, description: str | None = None) -> None:
        """Generate the replies of `pending` (key -> prompt) all at once and append them in its order as
        they finish: whatever is ready in order every FLUSH_RECORDS replies or FLUSH_SECONDS, fsync'd."""
        if self.path.suffix == ".xz":
            raise ValueError(
                f"{self.path} lacks {len(pending)} of the replies asked for, and a .xz reply file is only read; "
                "decompress it (xz -dk) and pass the .jsonl to write the rest into it"
            )
        keys = list(pending)
        finished: dict[int, Reply] = {}
        written = ready = 0
        flushed_at = time.monotonic()
        progress = Progress(len(keys), description)
        for index, reply in stream([pending[key][0] for key in keys]):
            finished[index] = reply
            progress.update(len(pending[keys[index]][0]), len(reply.ids))
            while ready in finished:
                ready += 1
            due = ready - written >= FLUSH_RECORDS or time.monotonic() - flushed_at >= FLUSH_SECONDS
            if due and ready > written:
                self.append({keys[i]: finished.pop(i) for i in range(written, ready)}, pending)
                written, flushed_at = ready, time.monotonic()
        progress.close()
        if ready != len(keys):
            raise RuntimeError(f"the engine gave {len(finished) + written} of {len(keys)} replies")
        self.append({keys[i]: finished.pop(i) for i in range(written, ready)}, pending)

    def append(self, replies: dict[str, Reply], pending: dict[str, Prompt]) -> None:
        chats = {key: pending[key][1] for key in replies if pending[key][1] is not None}
        append_replies(self.path, replies, chats, self.tokenizer)
        self.replies.add(replies)
        self.generated += len(replies)


class Progress:
    """A bar over one walk's pending prompts: prompts/s and the time left (tqdm's), prompt and reply
    tokens/s. None as the description: no bar (a walk's few prompts, or a test)."""

    def __init__(self, total: int, description: str | None):
        self.bar = tqdm(
            total=total, desc=description, unit="prompt", disable=description is None, mininterval=2
        )
        self.start = time.monotonic()
        self.tokens = [0, 0]

    def update(self, prompt_tokens: int, reply_tokens: int) -> None:
        self.tokens[0] += prompt_tokens
        self.tokens[1] += reply_tokens
        seconds = max(time.monotonic() - self.start, 1e-9)
        rates = f"prompt {self.tokens[0] / seconds:,.0f} tok/s, reply {self.tokens[1] / seconds:,.0f} tok/s"
        self.bar.set_postfix_str(rates, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
