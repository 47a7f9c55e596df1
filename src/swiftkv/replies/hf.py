"""Greedy replies with transformers' `generate` (where vLLM is not installed): left-padded batches of
prompts sorted by length."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..data.tokens import Reply
from ..generation import left_padded
from .file import Generate
from .static_greedy import in_length_order


def hf_generator(
    folder: Path, max_tokens: int, dtype, eos_token_id: int, device: str | None = None
) -> Generate:
    """Greedy replies of the model in `folder` with transformers' `generate`: left-padded batches,
    sorted by length so a batch pads little. The same replies as vLLM's up to the numerics of the
    batch (tested equal to unbatched greedy generation in fp32)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()

    rows = HF_BATCH_CUDA if device.startswith("cuda") else HF_BATCH
    return lambda prompts: in_length_order(
        prompts, rows, lambda batch: greedy_batch(model, batch, max_tokens, eos_token_id)
    )


HF_BATCH = 64  # prompts per transformers generate() call on CPU
# A GPU is launch-bound at small batches: wider batches, fewer decode steps in all. 1024 rows of
# prompts up to 1024 tokens + a 64-token reply hold a ~26 GB bf16 KV cache for a 135M model.
HF_BATCH_CUDA = 1024


def greedy_batch(model, prompts: list[list[int]], max_tokens: int, eos_token_id: int) -> list[Reply]:
    width = max(len(p) for p in prompts)
    ids, mask = left_padded(prompts, width, eos_token_id, model.device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
        )
    # generate pads a finished row with eos after its own
    return [Reply.of_row(row, eos_token_id) for row in out[:, width:].tolist()]
