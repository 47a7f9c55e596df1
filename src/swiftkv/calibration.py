"""Calibration for conversion: teacher activations on a few thousand tokens, and how well a converted
student reproduces the teacher's K/V and next-token predictions on held-out tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .corpus import iter_sharegpt, iter_text_files

BLOCK_LEN = 512


@dataclass
class TeacherStats:
    """Teacher activations over all calibration tokens (rows = tokens)."""

    h_n: torch.Tensor  # residual stream entering layer N, [tokens, hidden]
    keys: dict[int, torch.Tensor]  # later layer -> pre-RoPE K, [tokens, kv_heads * head_dim]
    values: dict[int, torch.Tensor]


def iter_documents(tokenizer, source: str) -> Iterator[list[int]]:
    """Token ids of each document: `sharegpt` (chat-templated), a .jsonl of `messages`, or text files."""
    if source == "sharegpt":
        for messages in iter_sharegpt():
            yield tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        return
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"--calib-data {source!r}: expected 'sharegpt', a .jsonl chat file, "
                                "or a text file/folder")
    if path.suffix == ".jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=False)
        return
    for text in iter_text_files(path):
        yield tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]


def token_blocks(tokenizer, source: str, fit_tokens: int, eval_tokens: int,
                 block_len: int = BLOCK_LEN) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Disjoint fit and held-out blocks of `block_len` tokens, packed from consecutive documents."""
    wanted = -(-fit_tokens // block_len) + -(-eval_tokens // block_len)
    blocks, buffer = [], []
    for ids in iter_documents(tokenizer, source):
        buffer.extend(ids[: 4 * block_len])  # cap very long documents so the sample stays varied
        while len(buffer) >= block_len and len(blocks) < wanted:
            blocks.append(torch.tensor(buffer[:block_len]))
            buffer = buffer[block_len:]
        if len(blocks) == wanted:
            break
    if len(blocks) < 2:
        raise ValueError(f"--calib-data {source!r} yielded {len(blocks)} blocks of {block_len} tokens; "
                         "expected at least 2 (one to fit, one held out)")
    n_fit = max(1, min(len(blocks) - 1, -(-fit_tokens // block_len)))
    return blocks[:n_fit], blocks[n_fit:]


@torch.no_grad()
def teacher_stats(teacher, blocks: list[torch.Tensor], num_key_value_layers: int, desc: str) -> TeacherStats:
    """Run the teacher and record h_N and every later layer's pre-RoPE K/V through hooks."""
    layers = teacher.model.layers
    later = range(num_key_value_layers, len(layers))
    h_n, keys, values = [], {j: [] for j in later}, {j: [] for j in later}
    hooks = [layers[num_key_value_layers].register_forward_pre_hook(
        lambda _m, args, _kw: h_n.append(args[0].flatten(0, 1).float()), with_kwargs=True)]
    for j in later:
        attention = layers[j].self_attn
        hooks.append(attention.k_proj.register_forward_hook(record_into(keys[j])))
        hooks.append(attention.v_proj.register_forward_hook(record_into(values[j])))
    try:
        for block in tqdm(blocks, desc=desc, leave=False):
            teacher(block[None], logits_to_keep=1)
    finally:
        for hook in hooks:
            hook.remove()
    return TeacherStats(torch.cat(h_n), {j: torch.cat(v) for j, v in keys.items()},
                        {j: torch.cat(v) for j, v in values.items()})


def record_into(store: list):
    return lambda _module, _inputs, output: store.append(output.flatten(0, 1).float())


@torch.no_grad()
def kv_relative_error(model, stats: TeacherStats) -> dict[str, list[float]]:
    """Per later layer: ||K_student - K_teacher|| / ||K_teacher|| (and V), pre-RoPE, held-out tokens."""
    config = model.config
    s = model.model.norm_swiftkv(stats.h_n.to(model.dtype))
    errors = {"k": [], "v": []}
    for j in config.later_layers:
        owner = model.model.layers[config.kv_owner(j)].self_attn
        for name, targets in (("k", stats.keys), ("v", stats.values)):
            predicted = getattr(owner, f"{name}_proj_swiftkv")(s).float()
            errors[name].append(float((predicted - targets[j]).norm() / targets[j].norm()))
    return errors


@torch.no_grad()
def agreement(model, blocks: list[torch.Tensor]) -> tuple[float, float]:
    """Teacher-forced top-1 agreement and mean KL(teacher || student) per token. Teacher and student
    share layers < N exactly, so those run once."""
    same, kl, count = 0, 0.0, 0
    for block in blocks:
        early = model.model.embed_and_early(input_ids=block[None])
        teacher = model.lm_head(model.model.norm(model.model.late(early, student=False))).float()[0]
        student = model.lm_head(model.model.norm(model.model.late(early, student=True))).float()[0]
        same += int((teacher.argmax(-1) == student.argmax(-1)).sum())
        log_t, log_s = F.log_softmax(teacher, -1), F.log_softmax(student, -1)
        kl += float((log_t.exp() * (log_t - log_s)).sum())
        count += len(block)
    return same / count, kl / count
