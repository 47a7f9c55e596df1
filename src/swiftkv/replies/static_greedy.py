"""Batched greedy replies with a static KV cache: the replies stage's `static` engine.

transformers' `generate` keeps a cache that grows by concatenation and rebuilds its masks and positions
every step, so a small model on a GPU spends its steps launching kernels (52 replies/s measured on an H100
at 1,024 rows). Here a batch is prefilled once into a preallocated cache (transformers' `StaticCache`),
and every decode step then has the same shapes: one new token per row, one fixed attention mask (a slot
not written yet is hidden by causality, not by the mask), positions counted per row from the left padding.

On CUDA every batch decodes over one shared cache (`SharedCache`: a fixed number of rows, slots for the
longest prompt plus the reply, reset between batches; a short batch is filled up with copies of its last
prompt). The decode step then has one shape and reads one set of cache addresses for the whole run, so it
is compiled once and captured once as a CUDA graph (`torch.compile`, mode "reduce-overhead"), where a cache
per batch would re-record the graph every batch and recompile for every new width. If compiling fails,
the step runs eagerly and the reason is printed. On a CPU it runs eagerly over a cache of each batch's own
width (attention there costs per slot). Its attention reads the grouped K/V heads in place on both
(`model.attention`). Equal to `generate`'s greedy replies, token for token, in fp32
(tests/test_replies.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, StaticCache

from ..data.tokens import MAX_PROMPT_TOKENS, Reply
from ..generation import left_padded, length_batches
from ..model.attention import attention_for
from ..model.config import is_swiftkv

Step = Callable[..., torch.Tensor]  # (model, ids, positions, cache, cache_position, mask) -> next ids


def decode_step(model, ids, positions, cache, cache_position, mask) -> torch.Tensor:
    """One greedy token per row, the cache updated in place."""
    logits = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        cache_position=cache_position,
        use_cache=True,
        logits_to_keep=1,
    ).logits
    return logits[:, -1].argmax(-1)


@dataclass
class SharedCache:
    """One static KV cache of `rows` x `slots` that every batch decodes over, reset between batches."""

    rows: int
    slots: int
    cache: StaticCache

    @classmethod
    def for_model(cls, model, rows: int, slots: int) -> SharedCache:
        return cls(rows, slots, StaticCache(config=model.config, max_cache_len=slots))

    def take(self, rows: int, slots: int) -> StaticCache:
        """The cache, reset, for a batch of `rows` that needs `slots`."""
        if rows != self.rows or slots > self.slots:
            raise ValueError(
                f"a batch of {rows} rows x {slots} slots does not fit the shared cache ({self.rows} x {self.slots})"
            )
        self.cache.reset()
        return self.cache


def static_greedy_batch(
    model,
    prompts: list[list[int]],
    max_tokens: int,
    eos_token_id: int,
    step: Step = decode_step,
    shared: SharedCache | None = None,
) -> list[Reply]:
    """Greedy replies of `prompts`, left-padded into one batch: each stops at its end-of-turn id (kept) or
    after `max_tokens`. The batch decodes over the `shared` cache when given (its slots past the batch's
    are never written, so causality hides them), else over a cache of its own width."""
    rows, width = len(prompts), max(len(p) for p in prompts)
    device = model.device
    needed = width + max_tokens
    if shared is None:
        slots, cache = needed, StaticCache(config=model.config, max_cache_len=needed)
    else:
        slots, cache = shared.slots, shared.take(rows, needed)
    ids, padding = left_padded(prompts, width, eos_token_id, device)
    mask = torch.ones(rows, slots, dtype=torch.long, device=device)
    mask[:, :width] = padding
    positions = (padding.cumsum(-1) - 1).clamp(min=0)
    tokens = torch.full((rows, max_tokens), eos_token_id, dtype=torch.long, device=device)
    with torch.no_grad():
        token = decode_step(model, ids, positions, cache, torch.arange(width, device=device), mask)
        last, done = positions[:, -1:], torch.zeros(rows, dtype=torch.bool, device=device)
        for t in range(max_tokens):
            token = torch.where(done, eos_token_id, token)
            tokens[:, t] = token
            done |= token == eos_token_id
            if t == max_tokens - 1 or bool(done.all()):
                break
            last = last + 1
            token = step(model, token[:, None], last, cache, torch.tensor([width + t], device=device), mask)
    return [Reply.of_row(row, eos_token_id) for row in tokens.tolist()]


def in_length_order(prompts: list[list[int]], rows: int, write: Callable[[list[list[int]]], list[Reply]]):
    """`write` over batches of `rows` prompts sorted by length (so a batch pads little); the replies come
    back in the prompts' order."""
    replies: dict[int, Reply] = {}
    for chunk in length_batches([len(p) for p in prompts], rows):
        replies.update(zip(chunk, write([prompts[i] for i in chunk]), strict=True))
    return [replies[i] for i in range(len(prompts))]


def compiled_step(device: torch.device, compile_step: bool = True) -> Step:
    """The decode step as CUDA graphs on a GPU (falling back to the eager step, with the reason printed,
    the first time the compiled one fails); the eager step elsewhere, or when not `compile_step`."""
    if device.type != "cuda" or not compile_step:
        return decode_step
    compiled = torch.compile(decode_step, mode="reduce-overhead", fullgraph=False)
    state = {"step": compiled}

    def step(*args):
        if state["step"] is compiled:
            try:
                return compiled(*args)
            except Exception as error:  # noqa: BLE001 - any compile failure: the eager step still writes
                print(
                    f"static engine: compiled decode step failed ({error!r}); running it eagerly",
                    file=sys.stderr,
                    flush=True,
                )
                state["step"] = decode_step
        return state["step"](*args)

    return step


def static_generator(
    folder: Path,
    max_tokens: int,
    dtype,
    eos_token_id: int,
    rows: int,
    device: str,
    share_cache: bool | None = None,
    compile_step: bool = True,
):
    """`replies.Generate` of the plain model in `folder`: batches of `rows` prompts, sorted by length so
    a batch pads little, decoding over one shared cache where `share_cache` (default: on CUDA), with the
    decode step compiled on CUDA unless not `compile_step`."""
    model = (
        AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attention_for(device))
        .to(device)
        .eval()
    )
    if is_swiftkv(model):
        raise ValueError(
            f"{folder}: the static engine writes with plain models; use --reply-engine vllm or hf"
        )
    step = compiled_step(model.device, compile_step)
    share = model.device.type == "cuda" if share_cache is None else share_cache
    shared: SharedCache | None = None

    def write(batch: list[list[int]]) -> list[Reply]:
        nonlocal shared
        if not share:
            return static_greedy_batch(model, batch, max_tokens, eos_token_id, step)
        needed = max(map(len, batch)) + max_tokens
        if shared is None or needed > shared.slots:  # a longer prompt than any before: a larger cache
            shared = None  # the old cache is freed before the new one is allocated
            shared = SharedCache.for_model(model, rows, max(needed, MAX_PROMPT_TOKENS + max_tokens))
        filled = batch + [batch[-1]] * (rows - len(batch))  # the same rows every batch
        return static_greedy_batch(model, filled, max_tokens, eos_token_id, step, shared)[: len(batch)]

    return lambda prompts: in_length_order(prompts, rows, write)
