"""Questions over passages, answered from one of them: SwiftKV's workload (a long prompt, a short answer)
with a gold answer to score.

The passages are prose from chats (ShareGPT assistant replies); a made-up fact ("The access code for the
Delta archive is 4471.") is inserted into one of them, and the question asks for it. Decoys, the same kind
of fact about other names ("... for the Echo archive is 8812."), go into other passages, so the answer has
to be read from the right place, not guessed from the kind of question. The facts are invented, so no
model knows them beforehand, and an answer that appears anywhere in the chat text is drawn again.

`qa_messages` is the one prompt of such an item: the evaluation's long-prompt QA (`evaluate.long_qa`)
asks it, and training prompts built the same way would match it. Deterministic: the same passages and
seed give the same items.
"""

from __future__ import annotations

import functools
import json
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .chat import Messages

# The shipped evaluation sets (`swiftkv eval --long-qa default`), defined here so that training prompts can be
# kept disjoint from them (`shares_text_with_eval`) without the data layer importing the evaluation.
SHIPPED_SETS_DIR = Path(__file__).parents[1] / "evaluate" / "qa_sets"
QA_INSTRUCTION = (
    "Answer the question using only the passages below. Reply with the answer alone, in a few words."
)
PEOPLE_FIRST = ["Maria", "Tomas", "Aiko", "Kwame", "Elena", "Ravi", "Ingrid", "Mateo", "Leila", "Oskar"]
PEOPLE_LAST = ["Okafor", "Lindqvist", "Tanaka", "Moreau", "Haddad", "Novak", "Castillo", "Brennan", "Iyer"]
CITIES = ["Rotterdam", "Valparaiso", "Gdansk", "Mombasa", "Halifax", "Busan", "Tangier", "Antwerp", "Hobart"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
COLORS = ["crimson", "teal", "amber", "violet", "olive", "maroon", "turquoise", "ivory", "indigo"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]
NAMES = [
    "Alpha", "Bravo", "Delta", "Echo", "Foxtrot", "Hotel", "Juliet", "Kilo", "Lima", "Oscar", "Sierra",
    "Tango", "Yankee", "Zulu", "Cobalt", "Falcon", "Granite", "Harbor", "Juniper", "Lantern", "Meridian",
    "Nimbus", "Orchid", "Pioneer", "Quartz", "Saffron", "Thistle", "Willow",
]  # fmt: skip
# The names of training prompts' facts (`data.qa_mix`): none of the evaluation's, so no fact sentence of an
# evaluation item ever appears in a training prompt.
TRAIN_NAMES = [
    "Acorn", "Beacon", "Cedar", "Dune", "Ember", "Fjord", "Glacier", "Heron", "Iris", "Jasper", "Kestrel",
    "Lotus", "Maple", "Nova", "Onyx", "Pebble", "Quill", "Raven", "Summit", "Topaz", "Umber", "Vega",
    "Walnut", "Zephyr", "Aurora", "Bramble", "Cinder", "Drift",
]  # fmt: skip


@dataclass(frozen=True)
class FactKind:
    """A kind of made-up fact: its sentence, its question (both about `{name}`) and how a value is drawn."""

    sentence: str  # with {name} and {value}
    question: str  # with {name}
    value: Callable[[random.Random], str]


def person(rng: random.Random) -> str:
    return f"{rng.choice(PEOPLE_FIRST)} {rng.choice(PEOPLE_LAST)}"


def room(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHK')}{rng.randint(100, 499)}"


FACT_KINDS = (
    FactKind(
        "The access code for the {name} archive is {value}.",
        "What is the access code for the {name} archive?",
        lambda rng: str(rng.randint(1000, 9999)),
    ),
    FactKind("The {name} project is led by {value}.", "Who leads the {name} project?", person),
    FactKind(
        "The {name} team meets every {value}.",
        "On which day does the {name} team meet?",
        lambda rng: rng.choice(WEEKDAYS),
    ),
    FactKind(
        "The {name} shipment left from the port of {value}.",
        "From which port did the {name} shipment leave?",
        lambda rng: rng.choice(CITIES),
    ),
    FactKind(
        "The {name} prototype was painted {value}.",
        "What color was the {name} prototype painted?",
        lambda rng: rng.choice(COLORS),
    ),
    FactKind("The {name} server is kept in room {value}.", "In which room is the {name} server kept?", room),
    FactKind(
        "The {name} workshop will be held in {value}.",
        "In which month will the {name} workshop be held?",
        lambda rng: rng.choice(MONTHS),
    ),
    FactKind(
        "The budget of the {name} study is {value} dollars.",
        "What is the budget of the {name} study, in dollars?",
        lambda rng: str(rng.randint(11, 99) * 100),
    ),
)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, punctuation removed, the articles a/an/the removed, whitespace
    collapsed. Gold answers and model answers are compared in this form."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def contains_answer(answer: str, gold: str) -> bool:
    """The normalised gold appears in the normalised answer as whole words ("4471" is not in "44712")."""
    gold = normalize_answer(gold)
    return bool(gold) and f" {gold} " in f" {normalize_answer(answer)} "


def answer_f1(answer: str, golds: Sequence[str]) -> float:
    """SQuAD's F1: the overlap of normalised words between the answer and a gold (precision and recall
    harmonised), the best over the accepted golds."""
    words = normalize_answer(answer).split()
    best = 0.0
    for gold in golds:
        gold_words = normalize_answer(gold).split()
        common = sum((Counter(words) & Counter(gold_words)).values())
        if common:
            precision, recall = common / len(words), common / len(gold_words)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def qa_messages(passages: Sequence[str], question: str) -> Messages:
    """The single user turn that asks `question` over `passages` (numbered, in order)."""
    body = "\n\n".join(f"Passage {i + 1}:\n{text.strip()}" for i, text in enumerate(passages))
    return [{"role": "user", "content": f"{QA_INSTRUCTION}\n\n{body}\n\nQuestion: {question}"}]


@dataclass(frozen=True)
class Passage:
    text: str
    source: str  # where the text comes from (e.g. a ShareGPT record and turn)


def is_prose(text: str) -> bool:
    """Plain English text: no code block, almost only ASCII (the tokenizer's length targets assume it)."""
    return "```" not in text and sum(ch.isascii() for ch in text) >= 0.98 * len(text)


def insert_sentence(text: str, sentence: str, rng: random.Random) -> str:
    """`sentence` after a sentence end of `text` chosen by `rng` (or at its end), formatting kept."""
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", text)] + [len(text.rstrip())]
    at = rng.choice(ends)
    return f"{text[:at]} {sentence}{text[at:]}"


def draw_facts(
    kind: FactKind,
    count: int,
    taken_text: str,
    rng: random.Random,
    tries: int = 100,
    names: Sequence[str] = NAMES,
) -> list[tuple[str, str]] | None:
    """`count` (name, value) pairs of `kind`, names from `names`, all names and all values different, no
    value already in `taken_text` (the passages' own words), so one passage alone answers the question; None
    when `tries` draws do not find them (text that already names most of the kind's values)."""
    names = rng.sample(list(names), count)
    facts, values = [], set()
    for _ in range(tries):
        value = kind.value(rng)
        if value not in values and not contains_answer(taken_text, value):
            values.add(value)
            facts.append((names[len(facts)], value))
        if len(facts) == count:
            return facts
    return None


def build_item(
    passages: list[Passage], decoys: int, rng: random.Random, item_id: str, names: Sequence[str] = NAMES
) -> dict:
    """One item over `passages`: the fact in one of them, up to `decoys` same-kind facts about other names in
    others, the question about the first fact; the facts' names are drawn from `names`."""
    texts = [p.text for p in passages]
    decoys = min(decoys, len(texts) - 1)
    for kind in rng.sample(FACT_KINDS, len(FACT_KINDS)):
        facts = draw_facts(kind, 1 + decoys, "\n".join(texts), rng, names=names)
        if facts is not None:
            break
    else:
        raise ValueError(f"{item_id}: its passages already name the values of every kind of fact")
    holders = rng.sample(range(len(texts)), 1 + decoys)  # holders[0] holds the answer
    for (name, value), where in zip(facts, holders, strict=True):
        texts[where] = insert_sentence(texts[where], kind.sentence.format(name=name, value=value), rng)
    name, value = facts[0]
    return {
        "id": item_id,
        "passages": texts,
        "question": kind.question.format(name=name),
        "answer": value,
        "source": "; ".join(p.source for p in passages),
        "answer_passage": holders[0] + 1,
    }


def build_items(
    pool: list[Passage],
    count: int,
    prompt_tokens: Callable[[list[str], str], int],
    token_range: tuple[int, int],
    decoys: int,
    seed: str,
    prefix: str,
) -> tuple[list[dict], list[Passage]]:
    """`count` items whose prompts (`prompt_tokens(passages, question)`, chat template included) fall in
    `token_range`, each over passages taken in order from `pool` (each passage used once); returns the items
    and the passages left. Raises if the pool runs out first."""
    rng = random.Random(seed)
    items, rest = [], list(pool)
    while len(items) < count:
        chosen = take_passages(rest, prompt_tokens, token_range, room=15 * (2 + decoys))
        if chosen is None:
            raise ValueError(
                f"{prefix}: the passages ran out after {len(items)} of {count} items of "
                f"{token_range[0]}-{token_range[1]} prompt tokens"
            )
        item = build_item(chosen, decoys, rng, f"{prefix}-{len(items):03d}")
        if token_range[0] <= prompt_tokens(item["passages"], item["question"]) <= token_range[1]:
            items.append(item)
    return items, rest


def take_passages(
    rest: list[Passage], prompt_tokens, token_range: tuple[int, int], room: int
) -> list[Passage] | None:
    """Passages popped from the front of `rest` until the prompt, with `room` tokens for the inserted facts
    and the question, reaches the range's lower end (a passage that would overshoot its upper end is
    skipped); None, with `rest` left as it was, when it runs out first."""
    chosen: list[Passage] = []
    skipped: list[Passage] = []
    while rest:
        passage = rest.pop(0)
        size = prompt_tokens([p.text for p in [*chosen, passage]], "")
        if size + room > token_range[1]:
            skipped.append(passage)
            continue
        chosen.append(passage)
        if size + room >= token_range[0]:
            rest[:0] = skipped
            return chosen
    rest[:0] = chosen + skipped  # nothing taken: `rest` as it was
    return None


# --------------------------------------------------------------------------------------------------
# Disjointness from the shipped evaluation sets
# --------------------------------------------------------------------------------------------------
# The sets' passages are replies of the held-out ShareGPT records, which no training run reads; but ShareGPT
# repeats conversations across records (of the 420 passages of the shipped sets, 49 have most of their
# sentences in train records too), so a training passage is also checked sentence by sentence.

MIN_SENTENCE_CHARS = 30  # shorter sentences ("Thank you!") are too common to identify a passage


def text_sentences(text: str) -> set[str]:
    """The normalised sentences and lines of `text` long enough to identify it."""
    pieces = (normalize_answer(piece) for piece in re.split(r"(?<=[.!?])\s+|\n+", text))
    return {piece for piece in pieces if len(piece) >= MIN_SENTENCE_CHARS}


@functools.cache
def eval_sentences(folder: Path = SHIPPED_SETS_DIR) -> frozenset[str]:
    """Every identifying sentence of the passages of the evaluation sets in `folder` (its *.jsonl files)."""
    sentences: set[str] = set()
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                passages = json.loads(line)["passages"]
                for passage in [passages] if isinstance(passages, str) else passages:
                    sentences |= text_sentences(passage)
    return frozenset(sentences)


def shares_text_with_eval(text: str, folder: Path = SHIPPED_SETS_DIR) -> bool:
    """Whether `text` holds a sentence of an evaluation set's passage (so it must not train)."""
    return not text_sentences(text).isdisjoint(eval_sentences(folder))
