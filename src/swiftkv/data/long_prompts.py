"""Long prompts with short answers, SwiftKV's own workload (RAG, summarisation), built from chats.

Two kinds, alternating:
  passages  several passages, one of which answers the question that follows them (the passage is the
            assistant reply that question once got; the others are replies to other questions), then the
            question: retrieval-augmented answering;
  document  consecutive replies joined into one document, then a request to summarise it.

Each prompt is `min_tokens`..`max_tokens` long as the tokenizer counts its text. Errors in a student's
approximated K/V grow with the prompt, and the eval's own chat prompts are short, so this is where a
SwiftKV user meets them. Deterministic: the same chats give the same prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from .chat import Messages, first_user_index
from .tokens import Document, answered_documents, prompt_ids

LONG_PROMPT_TOKENS = (
    1000,
    2000,
)  # text tokens of a long prompt: the eval's measure, the training mix's range
CHATS_PER_ROUND = 256  # chats read at a time to build the training mix's long prompts from
PASSAGES_HEAD = "Answer the question using the passages below."
DOCUMENT_TAIL = "Summarise the document above in a few sentences."
PASSAGE_TOKENS = (40, 400)  # a passage or document piece: a real paragraph or more, never one huge reply


def exchanges(conversations: list[Messages]) -> Iterator[tuple[str, str]]:
    """(first user question, the reply to it) of each conversation that has both."""
    for messages in conversations:
        first = first_user_index(messages)
        if first is None or first + 1 >= len(messages) or messages[first + 1]["role"] != "assistant":
            continue
        question, reply = messages[first]["content"].strip(), messages[first + 1]["content"].strip()
        if question and reply:
            yield question, reply


def long_prompts(
    conversations: list[Messages],
    count: int,
    count_tokens: Callable[[str], int],
    min_tokens: int = 1000,
    max_tokens: int = 2000,
) -> list[Messages]:
    """`count` single-turn prompts (alternately passages + question, document + summary request)."""
    pieces = [
        (q, r)
        for q, r in exchanges(conversations)
        if PASSAGE_TOKENS[0] <= count_tokens(r) <= PASSAGE_TOKENS[1] and count_tokens(q) <= 200
    ]
    prompts, cursor = [], 0
    while len(prompts) < count and cursor < len(pieces):
        build = passages_prompt if len(prompts) % 2 == 0 else document_prompt
        text, cursor = build(pieces, cursor, len(prompts), count_tokens, min_tokens, max_tokens)
        if text is not None:
            prompts.append([{"role": "user", "content": text}])
    return prompts


def passages_prompt(pieces, cursor: int, index: int, count_tokens, min_tokens: int, max_tokens: int):
    """Passages from `pieces[cursor:]` until `min_tokens`, the first piece's reply among them at a
    position that varies with `index`, then that piece's question."""
    question, answer = pieces[cursor]
    others, used = [], count_tokens(PASSAGES_HEAD) + count_tokens(question) + count_tokens(answer)
    cursor += 1
    while used < min_tokens and cursor < len(pieces):
        reply = pieces[cursor][1]
        cursor += 1
        if used + count_tokens(reply) <= max_tokens:
            others.append(reply)
            used += count_tokens(reply)
    if used < min_tokens:
        return None, cursor
    where = index // 2 % (len(others) + 1)
    texts = [*others[:where], answer, *others[where:]]
    body = "\n\n".join(f"Passage {i + 1}:\n{text}" for i, text in enumerate(texts))
    return f"{PASSAGES_HEAD}\n\n{body}\n\nQuestion: {question}", cursor


def document_prompt(pieces, cursor: int, index: int, count_tokens, min_tokens: int, max_tokens: int):
    """Replies from `pieces[cursor:]` joined into one document of `min_tokens`.., then the request."""
    parts, used = [], count_tokens(DOCUMENT_TAIL)
    while used < min_tokens and cursor < len(pieces):
        reply = pieces[cursor][1]
        cursor += 1
        if used + count_tokens(reply) <= max_tokens:
            parts.append(reply)
            used += count_tokens(reply)
    if used < min_tokens:
        return None, cursor
    return "\n\n".join(parts) + f"\n\n{DOCUMENT_TAIL}", cursor


def long_prompt_documents(
    examples: Iterator, tokenizer, tokens: int, replies, max_prompt_tokens: int
) -> list[Document]:
    """Training documents of long prompts built from the next chats of `examples` (rounds of
    CHATS_PER_ROUND), each answered by `replies` (a `swiftkv.replies.ReplyCache`), until `tokens`.
    A prompt's ids, chat template included, are at most `max_prompt_tokens`; only the answer is a
    target, and the document is packed whole (never cut from its prompt)."""
    count_tokens = text_counter(tokenizer)
    template = len(prompt_ids(tokenizer, [{"role": "user", "content": "x"}])) - count_tokens("x")
    text_range = (LONG_PROMPT_TOKENS[0], min(LONG_PROMPT_TOKENS[1], max_prompt_tokens - template))
    if text_range[1] <= text_range[0]:
        raise ValueError(
            f"long prompts of {LONG_PROMPT_TOKENS[0]}+ tokens do not fit {max_prompt_tokens} prompt "
            f"tokens; expected a context of at least {LONG_PROMPT_TOKENS[0] + template + 1} prompt tokens"
        )
    documents: list[Document] = []
    while tokens > 0:
        chats = [e for e in itertools.islice(examples, CHATS_PER_ROUND) if isinstance(e, list)]
        if not chats:
            break
        prompts = [
            (p, prompt_ids(tokenizer, p)) for p in long_prompts(chats, len(chats), count_tokens, *text_range)
        ]
        kept = [(p, i) for p, i in prompts if len(i) <= max_prompt_tokens]
        for start in range(0, len(kept), replies.batch):
            tokens = answered_documents(
                kept[start : start + replies.batch], replies, tokens, documents, whole=True
            )
    return documents


def text_counter(tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
