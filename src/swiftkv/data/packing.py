"""Token documents -> packed training blocks (the seeded train / held-out split is `swiftkv.data.split`).

Documents (`swiftkv.data.tokens`) are packed back to back into fixed-length blocks;
position ids restart at 0 at each document start, and the model's causal mask (transformers detects
packed sequences from position ids when no attention mask is given) keeps attention inside each
document. A document that does not fit in the rest of a block continues in the next block, its
positions restarting at 0 there (the continuation is seen without its earlier context, by both
teacher and student, so the distillation target stays consistent). A long prompt with its answer is
marked `whole` and starts a block instead, so its answer is always trained after the whole prompt.

The loss mask of a block is aligned with the *shifted* targets: position t carries the teacher's
distribution over token t+1, so it is trained iff token t+1 is a target token of the same document.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .mixture import DEFAULT_SPLIT, DataSpec, read_data
from .split import LongMix, split_documents
from .tokens import Document


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
    """Documents back to back in blocks of `seq_len` (the last partial block is dropped). A `whole`
    document is never cut: when it does not fit the rest of a block it waits, the next documents fill
    that rest (the one that reaches the block's end loses its tail), and it starts the next block. With
    no such documents to fill it (the input ends, or MAX_WAITING whole ones queue up), the rest of the
    block is filler that nothing attends to or trains on."""
    packed = Packed(seq_len)
    waiting: list[Document] = []  # whole documents waiting for room
    limit = None if max_blocks is None else max_blocks * seq_len
    for document in documents:
        if document.whole and len(document.ids) > seq_len:
            raise ValueError(
                f"a whole document of {len(document.ids)} tokens cannot fit a {seq_len}-token block"
            )
        if document.whole and len(document.ids) > packed.room():
            waiting.append(document)
            if len(waiting) > MAX_WAITING:
                packed.place(waiting)
        else:
            packed.add(document, cut_at_block_end=bool(waiting))
        while waiting and len(waiting[0].ids) <= packed.room():
            packed.add(waiting.pop(0))
        if limit is not None and len(packed.ids) >= limit:
            break
    if limit is None or len(packed.ids) < limit:
        packed.place(waiting)
    return packed.blocks(limit)


MAX_WAITING = 4  # whole documents queued before a block is closed with filler to place them
FILLER_ID = 0  # any id: a filler is its own document (positions restart), never a target


class Packed:
    """Token ids, target flags and document starts, appended document by document. Kept as packed arrays
    (6 bytes a token, where Python lists take ~40): a GPU-scale run packs ~10^9 tokens in one process."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self.ids = array("i")  # int32: every tokenizer's vocabulary fits
        self.targets = array("b")
        self.starts = array("b")

    def room(self) -> int:
        """Tokens left in the current block (a full block at a boundary)."""
        return self.seq_len - len(self.ids) % self.seq_len

    def place(self, whole: list[Document]) -> None:
        """Each of `whole` from where it fits: the rest of a block it does not fit becomes filler."""
        while whole:
            if len(whole[0].ids) > self.room():
                room = self.room()
                self.add(Document([FILLER_ID] * room, [False] * room))
            self.add(whole.pop(0))

    def add(self, document: Document, cut_at_block_end: bool = False) -> None:
        length = min(len(document.ids), self.room()) if cut_at_block_end else len(document.ids)
        self.ids.extend(document.ids[:length])
        self.targets.extend(document.is_target[:length])
        self.starts.extend([True] + [False] * (length - 1))

    def blocks(self, limit: int | None) -> Blocks:
        seq_len = self.seq_len
        whole_blocks = (len(self.ids) // seq_len) * seq_len
        usable = whole_blocks if limit is None else min(limit, whole_blocks)
        if usable == 0:
            empty = torch.zeros(0, seq_len, dtype=torch.long)
            return Blocks(empty, empty.clone(), empty.bool())
        input_ids = torch.frombuffer(self.ids, dtype=torch.int32)[:usable].long().view(-1, seq_len)
        starts = torch.frombuffer(self.starts, dtype=torch.int8)[:usable].bool().view(-1, seq_len)
        is_target = torch.frombuffer(self.targets, dtype=torch.int8)[:usable].bool().view(-1, seq_len)
        position_ids = positions_from_starts(starts)
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


def load_blocks(
    spec: DataSpec,
    tokenizer,
    seq_len: int,
    train_tokens: int,
    heldout_tokens: int,
    seed: int,
    replies=None,
    human_share: float = 0.0,
    long_mix: LongMix | None = None,
    every_turn: bool = False,
    passes: int = 1,
    skip_tokens: int = 0,
    split: str = DEFAULT_SPLIT,
) -> tuple[Blocks, Blocks]:
    """(train, held-out) packed blocks from `--data`: `passes` over the train blocks of `train_tokens`,
    each in its own seeded order (`in_passes`), after the `skip_tokens` an earlier stage trained on;
    `split`: the split of a dataset name given without @SPLIT."""
    heldout_docs, train_docs = split_documents(
        read_data(spec, seed, split=split),
        tokenizer,
        seed,
        heldout_tokens,
        train_tokens,
        replies,
        human_share,
        long_mix,
        every_turn=every_turn,
        skip_tokens=skip_tokens,
    )
    if not heldout_docs and not train_docs:
        raise ValueError(
            f"--data {spec!r} has no usable examples: it is empty, or no chat has an assistant "
            "turn (the distillation loss covers assistant tokens only)"
        )
    train = pack(train_docs, seq_len, max_blocks=max(1, train_tokens // seq_len))
    heldout = pack(heldout_docs, seq_len, max_blocks=max(1, heldout_tokens // seq_len))
    if len(train) == 0 or len(heldout) == 0:
        raise ValueError(
            f"--data {spec!r} yields too few tokens for one {seq_len}-token train block and one "
            "held-out block; use more data or a smaller --seq-len"
        )
    return in_passes(train, passes * len(train), seed), heldout


def in_passes(blocks: Blocks, wanted: int, seed: int) -> Blocks:
    """`wanted` blocks: passes over `blocks`, pass k in the order of `randperm(seed + k)`, so that more
    steps than the data holds see every block once per pass, never in the same order twice."""
    passes = max(1, -(-wanted // len(blocks)))
    orders = [
        torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed + k)) for k in range(passes)
    ]
    return blocks.select(torch.cat(orders)[:wanted])
