"""The seeded train / held-out split of `--data`, seen by both stages that need it: `swiftkv replies`
(which prompts of the train part get written replies) and distill's packing (which documents train
and which are held out). Both walk the same examples in the same order, so a reply written by the
replies stage is exactly the one packing asks for."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .chat import Example
from .long_prompts import long_prompt_documents
from .qa_mix import qa_prompt_documents
from .tokens import Document, teacher_documents, tokenize, until_tokens

SHUFFLE_WINDOW = 50_000  # examples shuffled with the seed; the rest keep the source's order


def shuffled(examples: Iterable[Example | None], seed: int, shuffle_window: int = SHUFFLE_WINDOW) -> list:
    examples = list(itertools.islice(examples, shuffle_window))
    random.Random(seed).shuffle(examples)
    return examples


# What the long prompts are (`--long-kind`): built from the chats after the first prompts by one of these.
LONG_KINDS = {
    "chat": long_prompt_documents,  # passages + a question a chat asked, or a document + a summary request
    "passage-qa": qa_prompt_documents,  # passages + a question about a made-up fact: the long-QA eval's shape
}


@dataclass(frozen=True)
class LongMix:
    """The long prompts among the written replies (SwiftKV's own workload: a long prompt, a short answer)."""

    share: float  # of the written-reply train tokens
    max_prompt_tokens: int  # a long prompt's ids, chat template included, so that prompt + reply fit a block
    kind: str = "chat"  # a key of LONG_KINDS

    def documents(self, examples: Iterator, tokenizer, tokens: int, replies) -> list[Document]:
        return LONG_KINDS[self.kind](examples, tokenizer, tokens, replies, self.max_prompt_tokens)


def split_documents(
    examples: Iterable[Example | None],
    tokenizer,
    seed: int,
    heldout_tokens: int,
    train_tokens: int,
    replies=None,
    human_share: float = 0.0,
    long_mix: LongMix | None = None,
    shuffle_window: int = SHUFFLE_WINDOW,
    every_turn: bool = False,
    skip_tokens: int = 0,
) -> tuple[list[Document], list[Document]]:
    """Held-out and train documents, disjoint, chosen deterministically from `seed`: the first
    `shuffle_window` examples are shuffled, then held-out documents are taken first, train next,
    each until its token budget is met. Only as many examples as needed are tokenized. With
    `replies` (a `swiftkv.replies.ReplyCache`), train documents are the examples' first prompts (with
    `every_turn`, each user turn with its context) answered by the reply writer (`human_share` of the
    train tokens stay the data's own conversations, taken after the written prompts); with `long_mix`, its share of the written tokens are long prompts built from the
    chats after the first prompts (`data.long_prompts`, or `data.qa_mix` for passage QA). The held-out documents stay the data's own, so
    every recipe is measured alike. `skip_tokens` passes over the train documents that a split of
    `train_tokens=skip_tokens` holds (human chats, or written prompts: not with `human_share` or
    `long_mix`, whose documents interleave), so the train documents are the next ones."""
    if skip_tokens and (human_share or long_mix) and replies is not None:
        raise ValueError("skip_tokens passes over human chats or written prompts, not a mix of them")
    rest = iter(shuffled(examples, seed, shuffle_window))
    heldout = take_documents(rest, tokenizer, heldout_tokens)
    if replies is not None:
        written = written_tokens(train_tokens, human_share)
        long_tokens = round(written * long_mix.share) if long_mix else 0
        taught = teacher_documents(
            rest, tokenizer, written - long_tokens, replies, every_turn=every_turn, skip=skip_tokens
        )
        # The long prompts come from the examples after the written ones end, which guessed reply lengths
        # (`swiftkv.replies.stage.GuessedReplies`) move: they wait for a walk with every written reply known.
        if long_tokens and not getattr(replies, "guessed", False):
            long = long_mix.documents(rest, tokenizer, long_tokens, replies)
            taught = spread(long, among=taught)
        human_tokens = train_tokens - sum(len(d.ids) for d in taught)
        return heldout, taught + (take_documents(rest, tokenizer, human_tokens) if human_share else [])
    take_documents(rest, tokenizer, skip_tokens)
    return heldout, take_documents(rest, tokenizer, train_tokens)


def written_tokens(train_tokens: int, human_share: float) -> int:
    """The train tokens that come from written replies (`--targets mixed`: half)."""
    return round(train_tokens * (1 - human_share))


def take_documents(examples: Iterator, tokenizer, tokens: int) -> list[Document]:
    """Tokenized documents from `examples` until they hold `tokens` tokens."""
    documents = (d for e in examples if (d := tokenize(tokenizer, e)) is not None)
    return until_tokens(documents, tokens)


def spread(extra: list, among: list) -> list:
    """`extra` placed evenly among `among` (each after its share of them), in both lists' order: the
    packer fills the room a long document waits for with the short documents that follow it."""
    if not among:
        return list(extra)
    merged, done = [], 0
    for k, item in enumerate(extra):
        upto = (k + 1) * len(among) // (len(extra) + 1)
        merged += among[done:upto] + [item]
        done = upto
    return merged + among[done:]
