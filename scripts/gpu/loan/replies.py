"""A loan's teacher replies as the reply file a CPU run reads: `python -m loan replies OUT --stage S --into F`.

A loan brings its replies back as token ids aligned with the staged prompts (OUT/replies.npz.xz), not keyed.
Merged into a reply file (`key`, `reply_ids`, `finished` records, plain or .xz), they serve `swiftkv distill
--teacher-data F` on any machine and the next `python -m loan stage --replies F`, so no later run writes
them again. The file's own records are kept first and as they are (a reader takes the first
record of a key); the loan's replies to other prompts follow in the prompts' order."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from swiftkv.data.tokens import Reply, prompt_key
from swiftkv.files import atomic_file
from swiftkv.replies import read_replies, reply_record

from .stage import PROMPTS_FILE, REPLIES_FILE, STAGE_FILE, decode_ids, need, staged


def loan_replies(loan_out: Path, stage: Path) -> dict[str, Reply]:
    """The loan's replies by prompt key, the first of a repeated prompt kept. Each is read back as the
    writer made it (`Reply.of_row`: finished when it holds the end-of-turn id, which ends it)."""
    prompts = decode_ids(staged(stage, PROMPTS_FILE).read_bytes())
    replies = decode_ids(need(loan_out / REPLIES_FILE, "python -m loan run").read_bytes())
    if len(replies) > len(prompts):
        raise ValueError(
            f"{loan_out / REPLIES_FILE} holds {len(replies)} replies but {stage} stages {len(prompts)} prompts; "
            "expected the stage the loan ran on"
        )
    eos = json.loads(staged(stage, STAGE_FILE).read_text())["tokenizer_eos"]
    keyed: dict[str, Reply] = {}
    for prompt, ids in zip(prompts, replies, strict=False):
        keyed.setdefault(prompt_key(prompt), Reply.of_row(ids, eos))
    return keyed


def merge_loan_replies(loan_out: Path, stage: Path, into: Path) -> dict:
    """`into` rewritten (atomically; xz-compressed when its name ends in .xz) with the loan's replies to
    the prompts it does not answer appended; counts of what it held, what was added, and how many of the
    loan's replies to prompts it already answered differ from its own (those are kept as they were)."""
    held = read_replies(into)
    loan = loan_replies(loan_out, stage)
    added = {key: reply for key, reply in loan.items() if key not in held}
    differing = sum(1 for key, reply in loan.items() if key in held and held[key] != reply)
    lines = "".join(
        json.dumps(reply_record(key, reply)) + "\n" for key, reply in {**held, **added}.items()
    ).encode("utf-8")
    with atomic_file(into) as tmp:
        tmp.write_bytes(lzma.compress(lines, preset=9) if into.suffix == ".xz" else lines)
    return {
        "held": len(held),
        "added": len(added),
        "kept_differing": differing,
        "replies": len(held) + len(added),
    }
