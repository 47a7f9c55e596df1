"""Long-prompt QA: does the student still answer correctly from the passages in its prompt?

A SwiftKV student rebuilds a prompt token's later-layer K/V from one earlier layer, and a short answer must
read the passages through those K/V. Each item is passages plus a question (`data.passage_qa.qa_messages`);
both models answer greedily in a few tokens. Scored per item:
  correct      the normalised gold (SQuAD normalisation: lowercase, no punctuation, no a/an/the, collapsed
               whitespace) appears in the normalised answer as whole words; an item may accept several golds;
  exact_match  the normalised answer equals a normalised gold;
  f1           SQuAD's F1: the overlap of normalised words with the best gold (`passage_qa.answer_f1`);
  identical    the two models' answers are the same tokens.
Correctness is paired against the teacher (difference, paired standard error, McNemar's p) and so is its
agreement (both right or both wrong). Answers are cached per model like the other greedy measures.

A set is a JSONL file, one object per line: `passages` (a list of strings, or one string), `question` (a
string), `answer` (a string or a list of accepted strings); `id` (a string) is optional, other keys are
ignored. `default` is the shipped pair of sets (`qa_sets/`, about 200 and 1,500 prompt tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..data.passage_qa import SHIPPED_SETS_DIR, answer_f1, contains_answer, normalize_answer, qa_messages
from ..data.tokens import prompt_ids
from .chat import greedy_answers
from .pair import STUDENT, TEACHER, ModelPair
from .stats import paired_comparison, paired_hits, paired_mean, same_per_item
from .store import ResultStore

DEFAULT_SETS_DIR = SHIPPED_SETS_DIR
DEFAULT_SETS = ("passages-200", "passages-1500")
MATCH = "normalised gold contained in the normalised answer (whole words)"
FIELDS = (
    "passages (a list of strings, or one string), question (a string), answer (a string or a list of strings)"
)


@dataclass(frozen=True)
class QAItem:
    item_id: str
    passages: tuple[str, ...]
    question: str
    answers: tuple[str, ...]  # accepted gold answers

    @property
    def messages(self) -> list[dict]:
        return qa_messages(self.passages, self.question)


def qa_sets(spec: str, limit: int = 0) -> dict[str, list[QAItem]]:
    """The sets `--long-qa` names: `default` (the shipped sets) or one JSONL file; each cut to its first
    `limit` items (0: all). Every file is read and checked here, before any model loads."""
    paths = (
        [DEFAULT_SETS_DIR / f"{name}.jsonl" for name in DEFAULT_SETS] if spec == "default" else [Path(spec)]
    )
    sets = {path.stem: read_qa_file(path) for path in paths}
    return {name: items[:limit] if limit else items for name, items in sets.items()}


def read_qa_file(path: Path) -> list[QAItem]:
    """The items of a JSONL file (blank lines skipped); a bad line is one error naming its number."""
    if not path.is_file():
        raise FileNotFoundError(f"--long-qa: {path} is not a file; expected a JSONL file or 'default'")
    items = [
        parse_item(record, where, f"{path.stem}-{number}")
        for where, number, record in json_objects(path, FIELDS)
    ]
    if not items:
        raise ValueError(f"--long-qa: {path} holds no items; expected one JSON object per line with {FIELDS}")
    return items


def json_objects(path: Path, fields: str) -> list[tuple[str, int, dict]]:
    """Each non-blank line of a JSONL file as (where, its line number, the object); a line that is not a JSON
    object is one error naming it and the `fields` expected."""
    objects = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg}); expected an object with {fields}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: a JSON {type(record).__name__}; expected an object with {fields}")
        objects.append((where, number, record))
    return objects


def parse_item(record: dict, where: str, default_id: str) -> QAItem:
    item_id = record.get("id", default_id)
    if not isinstance(item_id, str):
        raise ValueError(f"{where}: field 'id' is {type(item_id).__name__}; expected a string")
    passages = strings(record, "passages", where, "a list of strings, or one string")
    question = strings(record, "question", where, "a string", lists=False)[0]
    answers = strings(record, "answer", where, "a string or a list of strings")
    for answer in answers:
        if not normalize_answer(answer):
            raise ValueError(f"{where}: answer {answer!r} is empty once normalised; expected words or digits")
    return QAItem(item_id, passages, question, answers)


def strings(record: dict, key: str, where: str, expected: str, lists: bool = True) -> tuple[str, ...]:
    """`record[key]` as a tuple of non-blank strings (one string, or a list of them where `lists`)."""
    if key not in record:
        raise ValueError(f"{where}: missing field {key!r}; expected {expected}")
    value = record[key]
    values = value if lists and isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        shown = "an empty list" if values == [] else f"{type(value).__name__} {json.dumps(value)[:60]}"
        raise ValueError(f"{where}: field {key!r} is {shown}; expected {expected}, not blank")
    return tuple(values)


def check_qa_context(tokenizer, sets: dict[str, list[QAItem]], max_length: int, new_tokens: int) -> None:
    """Every prompt and its answer must fit the model's context (checked before any scoring)."""
    for name, items in sets.items():
        for item in items:
            needed = len(prompt_ids(tokenizer, item.messages)) + new_tokens
            if needed > max_length:
                raise ValueError(
                    f"--long-qa {name}: item {item.item_id!r} needs {needed} tokens (prompt + "
                    f"--long-qa-tokens); the model's context is {max_length}"
                )


def score_answer(answer: str, golds: tuple[str, ...]) -> tuple[int, int]:
    """(correct, exact match) of one answer against the accepted golds."""
    correct = any(contains_answer(answer, gold) for gold in golds)
    exact = normalize_answer(answer) in {normalize_answer(gold) for gold in golds}
    return int(correct), int(exact)


def long_qa_agreement(
    pair: ModelPair,
    store: ResultStore,
    name: str,
    items: list[QAItem],
    new_tokens: int,
    progress: bool = True,
) -> dict:
    """One set answered by both models and scored (a `results.LongQA`)."""
    tokenizer = pair.tokenizer
    ids = [prompt_ids(tokenizer, item.messages) for item in items]
    tokens = greedy_answers(pair, store, ids, new_tokens, desc=f"long-QA {name}", progress=progress)
    texts = {
        role: [tokenizer.decode(answer, skip_special_tokens=True).strip() for answer in tokens[role]]
        for role in (TEACHER, STUDENT)
    }
    scores = {
        role: [score_answer(t, item.answers) for t, item in zip(texts[role], items, strict=True)]
        for role in texts
    }
    correct = {role: [c for c, _ in scores[role]] for role in scores}
    exact = {role: [e for _, e in scores[role]] for role in scores}
    f1 = {
        role: [answer_f1(t, item.answers) for t, item in zip(texts[role], items, strict=True)]
        for role in texts
    }
    identical = same_per_item(tokens[TEACHER], tokens[STUDENT])
    return summarize(items, ids, new_tokens, texts, correct, exact, identical, f1)


def summarize(
    items, ids, new_tokens: int, texts: dict, correct: dict, exact: dict, identical: list[int], f1: dict
) -> dict:
    """The paired numbers of one set from its per-item records (kept beside them)."""
    teacher, student = correct[TEACHER], correct[STUDENT]
    agree = same_per_item(teacher, student)
    return {
        "items": len(items),
        "new_tokens": new_tokens,
        "prompt_tokens_mean": sum(map(len, ids)) / len(ids),
        "match": MATCH,
        "paired": {
            # "agreement" of a correctness comparison: both right or both wrong
            "correct": paired_comparison(teacher, student, teacher, student),
            "exact_match": paired_comparison(exact[TEACHER], exact[STUDENT], exact[TEACHER], exact[STUDENT]),
            "f1": paired_hits(f1[TEACHER], f1[STUDENT]),  # its McNemar p: the sign test on per-item F1
        },
        "agreement_stderr": paired_mean(agree)[1],
        "both_right": sum(t and s for t, s in zip(teacher, student, strict=True)),
        "both_wrong": sum(not t and not s for t, s in zip(teacher, student, strict=True)),
        "identical_fraction": paired_mean(identical)[0],
        "identical_stderr": paired_mean(identical)[1],
        "item_ids": [item.item_id for item in items],
        "answers": texts,
        "correct": correct,
        "exact_match": exact,
        "f1": f1,
        "identical": identical,
    }
