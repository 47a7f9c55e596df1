"""Token documents -> packed training blocks, and the seeded train / held-out split of `--data`.

Documents (`swiftkv.data.tokens`) are packed back to back into fixed-length blocks;
position ids restart at 0 at each document start, and the model's causal mask (transformers detects
packed sequences from position ids when no attention mask is given) keeps attention inside each
document. A document that does not fit in the rest of a block continues in the next block, its
positions restarting at 0 there (the continuation is seen without its earlier context, by both
teacher and student, so the distillation target stays consistent).

The loss mask of a block is aligned with the *shifted* targets: position t carries the teacher's
distribution over token t+1, so it is trained iff token t+1 is a target token of the same document.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from .chat import Example, read_source
from .tokens import Document, tokenize


@dataclass
class Blocks:
    """Packed blocks, all [num_blocks, seq_len]."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor  # bool: position t is trained (token t+1 is a target of the same document)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index) -> Blocks:
        return Blocks(self.input_ids[index], self.position_ids[index], self.loss_mask[index])

    def to(self, device: torch.device) -> Blocks:
        return Blocks(self.input_ids.to(device), self.position_ids.to(device), self.loss_mask.to(device))

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()


# --------------------------------------------------------------------------------------------------
# Packing and splitting
# --------------------------------------------------------------------------------------------------


def pack(documents: Iterable[Document], seq_len: int, max_blocks: int | None = None) -> Blocks:
    """Documents back to back in blocks of `seq_len` (the last partial block is dropped)."""
    ids, targets, starts = [], [], []
    limit = None if max_blocks is None else max_blocks * seq_len
    for document in documents:
        ids += document.ids
        targets += document.is_target
        starts += [True] + [False] * (len(document.ids) - 1)
        if limit is not None and len(ids) >= limit:
            break
    usable = (len(ids) // seq_len) * seq_len if limit is None else min(limit, (len(ids) // seq_len) * seq_len)
    if usable == 0:
        empty = torch.zeros(0, seq_len, dtype=torch.long)
        return Blocks(empty, empty.clone(), empty.bool())
    input_ids = torch.tensor(ids[:usable]).view(-1, seq_len)
    position_ids = positions_from_starts(torch.tensor(starts[:usable]).view(-1, seq_len))
    is_target = torch.tensor(targets[:usable]).view(-1, seq_len)
    return Blocks(input_ids, position_ids, shifted_loss_mask(is_target, position_ids))


def positions_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """Positions counting from 0 at each document start and at each block start (a document cut by
    the block boundary continues at position 0)."""
    starts = starts.clone()
    starts[:, 0] = True
    index = torch.arange(starts.shape[1]).expand_as(starts)
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start


def shifted_loss_mask(is_target: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Position t is trained iff token t+1 is a target and continues the same document."""
    mask = torch.zeros_like(is_target)
    same_document = position_ids[:, 1:] == position_ids[:, :-1] + 1
    mask[:, :-1] = is_target[:, 1:] & same_document
    return mask


def split_documents(examples: Iterable[Example | None], tokenizer, seed: int, heldout_tokens: int,
                    train_tokens: int, replies=None, human_share: float = 0.0,
                    shuffle_window: int = 50_000) -> tuple[list[Document], list[Document]]:
    """Held-out and train documents, disjoint, chosen deterministically from `seed`: the first
    `shuffle_window` examples are shuffled, then held-out documents are taken first, train next,
    each until its token budget is met. Only as many examples as needed are tokenized. With
    `replies` (a `teacher_data.ReplyCache`), train documents are the examples' first prompts answered
    by the teacher (`human_share` of the train tokens stay the data's own conversations, taken after
    the teacher's prompts); the held-out documents stay the data's own, so every recipe is measured
    alike."""
    examples = list(itertools.islice(examples, shuffle_window))
    random.Random(seed).shuffle(examples)
    rest = iter(examples)
    heldout = take_documents(rest, tokenizer, heldout_tokens)
    if replies is not None:
        from ..distill.teacher_data import teacher_documents

        taught = teacher_documents(rest, tokenizer, round(train_tokens * (1 - human_share)), replies)
        human_tokens = train_tokens - sum(len(d.ids) for d in taught)
        return heldout, taught + (take_documents(rest, tokenizer, human_tokens) if human_share else [])
    return heldout, take_documents(rest, tokenizer, train_tokens)


def take_documents(examples: Iterator, tokenizer, tokens: int) -> list[Document]:
    """Tokenized documents from `examples` until they hold `tokens` tokens."""
    documents = []
    while tokens > 0:
        example = next(examples, StopIteration)
        if example is StopIteration:
            break
        document = tokenize(tokenizer, example)
        if document is not None:
            documents.append(document)
            tokens -= len(document.ids)
    return documents


def load_blocks(spec: str, tokenizer, seq_len: int, train_tokens: int, heldout_tokens: int,
                seed: int, replies=None, human_share: float = 0.0) -> tuple[Blocks, Blocks]:
    """(train, held-out) packed blocks from `--data`; train blocks shuffled with `seed`."""
    heldout_docs, train_docs = split_documents(read_source(spec), tokenizer, seed, heldout_tokens, train_tokens,
                                               replies, human_share)
    if not heldout_docs and not train_docs:
        raise ValueError(f"--data {spec!r} has no usable examples: it is empty, or no chat has an assistant "
                         "turn (the distillation loss covers assistant tokens only)")
    train = pack(train_docs, seq_len, max_blocks=max(1, train_tokens // seq_len))
    heldout = pack(heldout_docs, seq_len, max_blocks=max(1, heldout_tokens // seq_len))
    if len(train) == 0 or len(heldout) == 0:
        raise ValueError(f"--data {spec!r} yields too few tokens for one {seq_len}-token train block and one "
                         "held-out block; use more data or a smaller --seq-len")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    return train.select(order), heldout
