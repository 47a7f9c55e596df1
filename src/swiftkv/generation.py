"""Generation and prefill measurements on the transformers path."""

from __future__ import annotations

import statistics
import time

import torch

from .data.tokens import prompt_ids


def chat_input_ids(tokenizer, prompt: str, raw: bool = False) -> torch.Tensor:
    """[1, tokens] ids of one user turn rendered with the model's chat template (or raw text)."""
    if raw:
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    return torch.tensor([prompt_ids(tokenizer, [{"role": "user", "content": prompt}])])


def left_padded(
    prompts: list[list[int]], width: int, pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of `prompts` left-padded to `width` with `pad_id`: a batch's replies then
    start at the same column."""
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def length_batches(
    lengths: list[int], rows: int, tokens: int | None = None, order: list | None = None
) -> list[list[int]]:
    """Indices of items of `lengths` in batches, taken in the order of `order` (default: the lengths), smallest
    first: at most `rows` a batch and, with `tokens`, at most that many in a batch padded to its longest (an
    item longer alone goes alone)."""
    batches: list[list[int]] = []
    longest = 0  # of the newest batch
    for index in sorted(range(len(lengths)), key=(order or lengths).__getitem__):
        batch = batches[-1] if batches else None
        padded = max(longest, lengths[index]) * (len(batch) + 1) if batch else 0
        if batch is None or len(batch) == rows or (tokens is not None and padded > tokens):
            batches.append([index])
            longest = lengths[index]
        else:
            batch.append(index)
            longest = max(longest, lengths[index])
    return batches


@torch.no_grad()
def generate_text(
    model, tokenizer, input_ids: torch.Tensor, max_new_tokens: int, streamer=None, **model_kwargs
) -> str:
    """Greedy continuation of `input_ids`, decoded without special tokens (`model_kwargs`, e.g.
    `swiftkv=False`, reach the model's forward)."""
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        streamer=streamer,
        pad_token_id=tokenizer.pad_token_id,
        **model_kwargs,
    )
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)


@torch.no_grad()
def prefill(model, input_ids: torch.Tensor):
    """One prefill step as `generate` runs it: fill the KV cache, logits for the last position only."""
    return model(input_ids, use_cache=True, logits_to_keep=1)


def median_prefill_seconds(models: dict, input_ids: torch.Tensor, repeats: int = 3) -> dict[str, float]:
    """Median prefill time per model. Runs alternate between the models so that load from other
    processes on the machine hits all of them alike and the ratio stays meaningful."""
    for model in models.values():
        prefill(model, input_ids[:, :64])  # warm-up
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            started = time.perf_counter()
            prefill(model, input_ids)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def kv_cache_bytes(cache) -> int:
    """Bytes held by the K/V tensors of a transformers cache (unfilled slots hold none)."""
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total
