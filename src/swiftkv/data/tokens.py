"""Chats and texts as token documents with a per-token target flag: the one definition of which
tokens a student is trained and judged on (distill's loss mask, eval's chat agreement).

For a chat the targets are each assistant turn's content and its end-of-turn token (the student also
learns where to stop), never the role header, and only for turns that answer a user turn. The spans
are found template-agnostically: an assistant turn is what rendering it adds after the generation
prompt of the turns before it; characters become tokens through the tokenizer's offsets. A plain
text is a target everywhere, with EOS appended.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .chat import Example, Messages, first_user_prompt


@dataclass
class Document:
    ids: list[int]
    is_target: list[bool]  # token i is a training target (predicted from position i - 1)
    # Packed whole, from a block start when it does not fit the rest of a block: a long prompt's answer
    # is only worth training on after the whole prompt (see `packing.pack`).
    whole: bool = False


def assistant_char_spans(tokenizer, messages: Messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character span of each assistant turn that follows a user turn.
    A turn whose rendering is not a prefix of the whole (an unusual template) is left out."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, answered = [], False
    for k, message in enumerate(messages):
        answered = answered or message["role"] == "user"
        if message["role"] != "assistant" or not answered:
            continue
        before = tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
        if text.startswith(upto) and upto.startswith(before):
            spans.append((len(before), len(upto)))
    return text, spans


def tokenize_chat(tokenizer, messages: Messages) -> Document:
    text, spans = assistant_char_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    is_target = [any(a <= start < b for a, b in spans) for start, _ in encoded["offset_mapping"]]
    return Document(list(encoded["input_ids"]), is_target)


def tokenize_text(tokenizer, text: str) -> Document:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        ids = [*ids, tokenizer.eos_token_id]
    return Document(list(ids), [True] * len(ids))


def tokenize(tokenizer, example: Example | None) -> Document | None:
    """A document, or None for an example that cannot teach anything (skipped, empty, or a chat
    without a non-empty assistant turn)."""
    if example is None:
        return None
    if isinstance(example, str):
        return tokenize_text(tokenizer, example) if example.strip() else None
    if not any(m["role"] == "assistant" and m["content"].strip() for m in example):
        return None
    document = tokenize_chat(tokenizer, example)
    return document if any(document.is_target) else None


# --------------------------------------------------------------------------------------------------
# Prompts and written replies (`--targets teacher|mixed`; the replies come from `swiftkv.replies`)
# --------------------------------------------------------------------------------------------------

MAX_PROMPT_TOKENS = 1024  # longer first turns are skipped (the reply would not fit a block)


@dataclass
class Reply:
    ids: list[int]  # the writer's tokens, its end-of-turn token included when it stopped by itself
    finished: bool

    @classmethod
    def of_row(cls, row: list[int], eos_token_id: int) -> Reply:
        """A batched greedy loop's row of reply tokens, padded with the end-of-turn id after a row stops:
        cut after its first one (kept), or whole when the row never stopped."""
        finished = eos_token_id in row
        return cls(row[: row.index(eos_token_id) + 1] if finished else row, finished)


def prompt_key(prompt_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:24]


def first_prompt(
    tokenizer, example, max_tokens: int = MAX_PROMPT_TOKENS
) -> tuple[Messages, list[int]] | None:
    """The chat up to its first user turn and its token ids with the generation prompt: what a model
    answers (None for plain text, a chat without a user turn, or a prompt over `max_tokens`)."""
    if not isinstance(example, list):
        return None  # plain text has no prompt to answer
    prompt = first_user_prompt(example)
    if prompt is None:
        return None
    ids = prompt_ids(tokenizer, prompt)
    return (prompt, ids) if len(ids) <= max_tokens else None


def turn_prompts(
    tokenizer, example, every_turn: bool = False, max_tokens: int = MAX_PROMPT_TOKENS
) -> list[tuple[Messages, list[int]]]:
    """The prompts a chat gives a reply writer: its first user turn, or (`every_turn`) each user turn
    with the conversation before it (the data's own earlier replies as context; the first is
    `first_prompt`'s), while the prompt fits `max_tokens`. More prompts per chat is how a small chat
    set feeds a long distillation."""
    if not every_turn:
        found = first_prompt(tokenizer, example, max_tokens)
        return [] if found is None else [found]
    chat = example if isinstance(example, list) else []
    prompts = []
    for end, message in enumerate(chat):
        if message["role"] != "user" or not message["content"].strip():
            continue
        ids = prompt_ids(tokenizer, chat[: end + 1])
        if len(ids) > max_tokens:
            break  # the later turns only add context
        prompts.append((chat[: end + 1], ids))
    return prompts


def prompt_ids(tokenizer, messages: Messages) -> list[int]:
    """The token ids a model answers `messages` from: the chat rendered up to the assistant's turn.
    The one prompt -> ids of swiftkv (written replies, eval's greedy answers, `swiftkv generate`)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids_of(tokenizer, example) -> list[int] | None:
    found = first_prompt(tokenizer, example)
    return None if found is None else found[1]


def teacher_documents(
    examples: Iterable,
    tokenizer,
    tokens: int,
    replies,
    batch: int | None = None,
    every_turn: bool = False,
    skip: int = 0,
) -> list[Document]:
    """Documents of prompt + written reply (only the reply is a target) until `tokens` are reached:
    the first user turn of each chat, or each user turn with its context (`every_turn`).
    `replies.get(prompt_ids, chats)` gives the replies (a `swiftkv.replies.ReplyCache`: it generates the
    missing ones, or refuses them when the replies stage has not run), `batch` prompts per call. With
    `skip`, the documents that a call with `tokens=skip` returns are passed over first, so a later stage
    trains on the prompts right after an earlier stage's, none of them seen before."""
    batch = batch or replies.batch
    prompts = (p for e in examples for p in turn_prompts(tokenizer, e, every_turn))
    chunks = iter(lambda: list(itertools.islice(prompts, batch)), [])
    documents = (d for chunk in chunks for d in reply_documents(chunk, replies))
    until_tokens(documents, skip)
    return until_tokens(documents, tokens)


def until_tokens(documents: Iterator[Document], tokens: int) -> list[Document]:
    """The next documents of `documents` until they hold `tokens` tokens (the last one may pass it)."""
    taken = []
    while tokens > 0 and (document := next(documents, None)) is not None:
        taken.append(document)
        tokens -= len(document.ids)
    return taken


def reply_documents(
    prompts: list[tuple[Messages, list[int]]], replies, whole: bool = False
) -> Iterator[Document]:
    """Prompt + written reply documents (only the reply is a target) for `prompts` ((chat, ids) pairs,
    one `replies.get` call), in their order; a prompt whose reply is empty gives none."""
    ids = [p for _, p in prompts]
    for prompt, reply in zip(ids, replies.get(ids, [chat for chat, _ in prompts]), strict=True):
        if reply.ids:
            yield Document(prompt + reply.ids, [False] * len(prompt) + [True] * len(reply.ids), whole)


def answered_documents(
    prompts: list[tuple[Messages, list[int]]],
    replies,
    tokens: int,
    documents: list[Document],
    whole: bool = False,
) -> int:
    """Append `reply_documents` of `prompts` to `documents` while `tokens` last; returns the tokens left."""
    taken = until_tokens(reply_documents(prompts, replies, whole), tokens)
    documents += taken
    return tokens - sum(len(d.ids) for d in taken)
