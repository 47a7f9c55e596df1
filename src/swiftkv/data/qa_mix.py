"""Training prompts shaped like the long-prompt QA workload: `--long-share S --long-kind passage-qa`.

Each prompt is the evaluation's own prompt (`data.passage_qa.qa_messages`): several passages, a made-up fact
inserted in one of them and decoys of the same kind in others, then the question about the fact. The reply
writer (the teacher) answers it, and the student trains on that answer after the whole prompt, as on every
long prompt (`data.long_prompts`). The passages come from the train chats of the split, after its first
prompts:
  replies     prose assistant replies of 50-400 tokens;
  documents   what users pasted into long user turns (a turn of 200+ tokens of prose), cut at paragraph
              breaks into pieces of 50-400 tokens; a short request before the pasted text is left out.
Disjoint from the evaluation sets three ways: ShareGPT's reader never yields the held-out records they are
built from; a passage that holds any sentence of theirs is dropped (ShareGPT repeats conversations across
records); and the facts are about other names (`TRAIN_NAMES`). Deterministic: the same chats give the same
prompts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

from .chat import Example, Messages
from .long_prompts import CHATS_PER_ROUND, text_counter
from .passage_qa import (
    TRAIN_NAMES,
    Passage,
    build_item,
    is_prose,
    qa_messages,
    shares_text_with_eval,
    take_passages,
)
from .tokens import Document, answered_documents, prompt_ids

QA_PROMPT_TOKENS = (1000, 1800)  # prompt tokens of a training QA prompt, chat template included
QA_PASSAGE_TOKENS = (50, 400)
PASTED_DOCUMENT_TOKENS = 200  # a user turn this long, in prose, is a pasted document
QA_DECOYS = 3  # as the evaluation's ~1,500-token set
QA_SEED = "swiftkv-train-qa"


def qa_prompt_documents(
    examples: Iterator[Example | None],
    tokenizer,
    tokens: int,
    replies,
    max_prompt_tokens: int,
    token_range: tuple[int, int] = QA_PROMPT_TOKENS,
) -> list[Document]:
    """Training documents of QA prompts built from the next chats of `examples` (rounds of CHATS_PER_ROUND),
    each answered by `replies` (a `swiftkv.replies.ReplyCache`), until `tokens`. A prompt's ids, chat
    template included, are in `token_range` and at most `max_prompt_tokens`; only the answer is a target, and
    the document is packed whole."""
    token_range = (token_range[0], min(token_range[1], max_prompt_tokens))
    if token_range[1] <= token_range[0]:
        raise ValueError(
            f"passage-QA prompts of {token_range[0]}+ tokens do not fit {max_prompt_tokens} prompt tokens; "
            f"expected a context of at least {token_range[0] + 1} prompt tokens"
        )
    count_tokens = text_counter(tokenizer)
    prompts = qa_prompts(examples, tokenizer, count_tokens, token_range)
    documents: list[Document] = []
    while tokens > 0:
        batch = list(itertools.islice(prompts, replies.batch))
        if not batch:
            break
        tokens = answered_documents(batch, replies, tokens, documents, whole=True)
    return documents


def qa_prompts(
    examples: Iterator[Example | None],
    tokenizer,
    count_tokens: Callable[[str], int],
    token_range: tuple[int, int],
) -> Iterator[tuple[Messages, list[int]]]:
    """(prompt, its ids) of QA prompts over the passages of the next chats, read CHATS_PER_ROUND at a time;
    each passage serves one prompt."""
    rng = random.Random(QA_SEED)
    pool: list[Passage] = []
    made = 0

    def size(passages: list[str], question: str) -> int:
        return len(prompt_ids(tokenizer, qa_messages(passages, question)))

    for round_start in itertools.count(step=CHATS_PER_ROUND):
        chats = list(itertools.islice(examples, CHATS_PER_ROUND))
        if not chats:
            return
        for offset, example in enumerate(chats):
            pool += chat_passages(example, f"example {round_start + offset}", count_tokens)
        while (chosen := take_passages(pool, size, token_range, room=15 * (2 + QA_DECOYS))) is not None:
            item = build_item(chosen, QA_DECOYS, rng, f"train-qa-{made}", names=TRAIN_NAMES)
            messages = qa_messages(item["passages"], item["question"])
            ids = prompt_ids(tokenizer, messages)
            if len(ids) <= token_range[1]:
                made += 1
                yield messages, ids


def chat_passages(example: Example | None, where: str, count_tokens: Callable[[str], int]) -> list[Passage]:
    """The passages a chat gives: its prose assistant replies of passage size and the pieces of documents
    pasted into its user turns, none that shares a sentence with an evaluation set (a text, or a skipped
    example, gives none)."""
    if not isinstance(example, list):
        return []
    passages = []
    for turn, message in enumerate(example):
        text = message["content"].strip()
        if not is_prose(text):
            continue
        if message["role"] == "assistant":
            pieces = [text] if fits_passage(count_tokens(text)) else []
        elif message["role"] == "user" and count_tokens(text) >= PASTED_DOCUMENT_TOKENS:
            pieces = document_pieces(text, count_tokens)
        else:
            pieces = []
        passages += [
            Passage(piece, f"{where}, turn {turn}, {message['role']}")
            for piece in pieces
            if not shares_text_with_eval(piece)
        ]
    return passages


def fits_passage(tokens: int) -> bool:
    return QA_PASSAGE_TOKENS[0] <= tokens <= QA_PASSAGE_TOKENS[1]


def document_pieces(text: str, count_tokens: Callable[[str], int]) -> list[str]:
    """A pasted document cut at paragraph breaks into pieces of passage size (a paragraph too long for one
    is left out); a first paragraph too short to be a passage is the user's request, not the document."""
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    if len(paragraphs) > 1 and count_tokens(paragraphs[0]) < QA_PASSAGE_TOKENS[0]:
        paragraphs = paragraphs[1:]
    pieces, current = [], []
    for paragraph in paragraphs:
        joined = "\n\n".join([*current, paragraph])
        if count_tokens(joined) <= QA_PASSAGE_TOKENS[1]:
            current.append(paragraph)
            continue
        pieces.append("\n\n".join(current))
        current = [paragraph] if count_tokens(paragraph) <= QA_PASSAGE_TOKENS[1] else []
    pieces.append("\n\n".join(current))
    return [piece for piece in pieces if piece and fits_passage(count_tokens(piece))]
