"""Distillation data: chat or text sources -> token documents with a target mask -> packed blocks.

A `Document` holds token ids and, per token, whether it is a training target (assistant tokens for
chat, every token for plain text). Documents are packed back to back into fixed-length blocks;
position ids restart at 0 at each document start, and the model's causal mask (transformers detects
packed sequences from position ids when no attention mask is given) keeps attention inside each
document. A document that does not fit in the rest of a block continues in the next block, its
positions restarting at 0 there (the continuation is seen without its earlier context, by both
teacher and student, so the distillation target stays consistent).

The loss mask of a block is aligned with the *shifted* targets: position t carries the teacher's
distribution over token t+1, so it is trained iff token t+1 is a target token of the same document.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..corpus import SHAREGPT_HELDOUT_START, SHAREGPT_ROLES, iter_json_array, sharegpt_file

SHAREGPT_ALIAS = "sharegpt"
TEXT_SUFFIXES = (".txt", ".md", ".rst")

Messages = list[dict]  # [{"role": "user" | "assistant" | "system", "content": str}, ...]


@dataclass
class Document:
    ids: list[int]
    is_target: list[bool]  # token i is a training target (predicted from position i - 1)


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
# Readers: every source yields either Messages (chat) or str (plain text)
# --------------------------------------------------------------------------------------------------


def sharegpt_turns(record: dict) -> Messages:
    """Every turn of a ShareGPT record (unknown speakers as user). Unlike `corpus.sharegpt_messages`
    it drops nothing: the shipped distilled weights were trained on exactly these documents."""
    turns = record.get("conversations") or []
    return [{"role": SHAREGPT_ROLES.get(t.get("from", ""), "user"), "content": t.get("value", "")}
            for t in turns if isinstance(t, dict)]


def read_jsonl(path: Path) -> Iterator[Messages | str]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
            yield record_to_example(record, f"{path}:{number}")


def record_to_example(record: dict, where: str) -> Messages | str:
    """A chat (`messages` or ShareGPT `conversations`) or a text (`text`) record."""
    if isinstance(record, dict):
        if isinstance(record.get("messages"), list):
            return [chat_message(m, where, i) for i, m in enumerate(record["messages"])]
        if isinstance(record.get("conversations"), list):
            return sharegpt_turns(record)
        if isinstance(record.get("text"), str):
            return record["text"]
    raise ValueError(f"{where}: expected a record with 'messages' (chat), 'conversations' (ShareGPT) or 'text'")


CHAT_ROLES = ("system", "user", "assistant")


def chat_message(message, where: str, index: int) -> dict:
    """One `messages` entry, checked: a role the chat template knows and text content."""
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        role = message.get("role") if isinstance(message, dict) else None
        raise ValueError(f"{where}: messages[{index}] has role {role!r}; expected one of {list(CHAT_ROLES)}")
    if not isinstance(message.get("content"), str):
        raise ValueError(f"{where}: messages[{index}] ({message['role']}) has content "
                         f"{message.get('content')!r}; expected a string")
    return {"role": message["role"], "content": message["content"]}


def read_text_folder(folder: Path) -> Iterator[str]:
    for path in sorted(p for p in folder.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()):
        yield path.read_text(encoding="utf-8", errors="replace")


def read_hf_dataset(folder: Path) -> Iterator[Messages | str]:
    import datasets

    dataset = datasets.load_from_disk(str(folder))
    if isinstance(dataset, datasets.DatasetDict):
        dataset = dataset["train"] if "train" in dataset else next(iter(dataset.values()))
    for index, record in enumerate(dataset):
        yield record_to_example(record, f"{folder}[{index}]")


def read_source(spec: str) -> Iterator[Messages | str]:
    """Examples of `--data`: `sharegpt`, a ShareGPT-style .json, a .jsonl, a text folder, or a
    `datasets.save_to_disk` folder."""
    if spec == SHAREGPT_ALIAS:
        # The records from SHAREGPT_HELDOUT_START on are the evaluation's held-out chats: they stay
        # in the stream as None (skipped by `tokenize`) so the seeded shuffle, and with it every
        # split made before this exclusion existed, stays the same.
        for index, record in enumerate(iter_json_array(sharegpt_file())):
            yield sharegpt_turns(record) if index < SHAREGPT_HELDOUT_START else None
        return
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"--data {spec!r}: no such file or folder; expected 'sharegpt', a .json/.jsonl "
                                "chat file, a folder of .txt/.md/.rst files, or a datasets.save_to_disk folder")
    if path.is_dir():
        is_dataset = (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
        yield from read_hf_dataset(path) if is_dataset else read_text_folder(path)
    elif path.suffix == ".jsonl":
        yield from read_jsonl(path)
    elif path.suffix == ".json":
        yield from (record_to_example(r, str(path)) for r in iter_json_array(path))
    elif path.suffix in TEXT_SUFFIXES:
        yield path.read_text(encoding="utf-8", errors="replace")
    else:
        raise ValueError(f"--data {spec!r}: unknown file type {path.suffix!r}; expected .json, .jsonl or a folder")


# --------------------------------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------------------------------


def assistant_char_spans(tokenizer, messages: Messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character span of each assistant turn (its content and the
    template's end-of-turn text, so the student also learns where to stop). Template-agnostic: the
    span is what rendering the turn adds after the generation prompt of the turns before it."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True) if k else ""
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


def tokenize(tokenizer, example: Messages | str | None) -> Document | None:
    """A document, or None for an example that cannot teach anything (excluded, empty, or a chat
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


def split_documents(examples: Iterable[Messages | str], tokenizer, seed: int, heldout_tokens: int,
                    train_tokens: int, replies=None, shuffle_window: int = 50_000) -> tuple[list[Document], list[Document]]:
    """Held-out and train documents, disjoint, chosen deterministically from `seed`: the first
    `shuffle_window` examples are shuffled, then held-out documents are taken first, train next,
    each until its token budget is met. Only as many examples as needed are tokenized. With
    `replies` (a `teacher_data.ReplyCache`), train documents are the examples' first prompts answered
    by the teacher; the held-out documents stay the data's own, so every recipe is measured alike."""
    examples = list(_take(examples, shuffle_window))
    random.Random(seed).shuffle(examples)
    rest = iter(examples)
    heldout = take_documents(rest, tokenizer, heldout_tokens)
    if replies is not None:
        from .teacher_data import teacher_documents

        return heldout, teacher_documents(rest, tokenizer, train_tokens, replies)
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


def _take(items: Iterable, n: int) -> Iterator:
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item


def load_blocks(spec: str, tokenizer, seq_len: int, train_tokens: int, heldout_tokens: int,
                seed: int, replies=None) -> tuple[Blocks, Blocks]:
    """(train, held-out) packed blocks from `--data`; train blocks shuffled with `seed`."""
    heldout_docs, train_docs = split_documents(read_source(spec), tokenizer, seed, heldout_tokens, train_tokens,
                                               replies)
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
