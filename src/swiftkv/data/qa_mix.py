"""Train prompts shaped like the long-prompt QA workload, mixed among a source's chats.

`with_passage_qa` passes a `--data` stream through and, among its chats, puts prompts of several passages
plus a question whose answer one passage holds (`data.passage_qa`: a made-up fact inserted in one passage,
decoys of the same kind in others). The passages are prose assistant replies of the chats that came before
in the same stream, so the prompts come from the train side of whatever split the stream is: ShareGPT's
reader (`data.chat.read_sharegpt`) yields the evaluation's held-out records as None, and None contributes
nothing. A prompt is a single user turn with no reply: the reply writer (the teacher) answers it, as it
answers every train prompt.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from .chat import Example
from .passage_qa import Passage, build_item, is_prose, qa_messages, take_passages
from .tokens import prompt_ids

QA_PROMPT_TOKENS = (1000, 1800)  # prompt tokens of a train QA prompt, chat template included
QA_PASSAGE_TOKENS = (50, 400)
QA_DECOYS = 3


def check_share(share: float) -> float:
    if not 0 <= share < 1:
        raise ValueError(f"passage-QA share {share}: expected a share of the prompts in [0, 1)")
    return share


def with_passage_qa(
    examples: Iterable[Example | None],
    tokenizer,
    share: float,
    seed: int = 0,
    token_range: tuple[int, int] = QA_PROMPT_TOKENS,
) -> Iterator[Example | None]:
    """`examples` with passage-QA prompts among them, `share` of the examples yielded that are not None (each
    as soon as enough passages have passed to fill it); each passage serves one prompt. Deterministic from
    `seed`."""
    check_share(share)
    rng = random.Random(f"passage-qa-{seed}")
    pool: list[Passage] = []
    credit, made = 0.0, 0

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_tokens(passages: list[str], question: str) -> int:
        return len(prompt_ids(tokenizer, qa_messages(passages, question)))

    for index, example in enumerate(examples):
        yield example
        if share == 0 or example is None:  # a skipped example (a held-out record) is no prompt
            continue
        pool += chat_passages(example, index, count_tokens)
        credit += share / (1 - share)  # QA prompts per other example
        while credit >= 1:
            chosen = take_passages(pool, prompt_tokens, token_range, room=15 * (2 + QA_DECOYS))
            if chosen is None:
                break  # wait for more chats
            item = build_item(chosen, QA_DECOYS, rng, f"train-qa-{made}")
            if prompt_tokens(item["passages"], item["question"]) <= token_range[1]:
                yield qa_messages(item["passages"], item["question"])
                credit, made = credit - 1, made + 1


def chat_passages(example: Example | None, index: int, count_tokens) -> list[Passage]:
    """The prose assistant replies of a chat that fit a passage (none from a text, or a skipped example)."""
    if not isinstance(example, list):
        return []
    return [
        Passage(m["content"].strip(), f"example {index}, turn {turn}")
        for turn, m in enumerate(example)
        if m["role"] == "assistant"
        and is_prose(m["content"])
        and QA_PASSAGE_TOKENS[0] <= count_tokens(m["content"]) <= QA_PASSAGE_TOKENS[1]
    ]
