"""Attention that reads grouped K/V heads in place: transformers' sdpa copies them on a CPU.

With a mask, transformers' `sdpa` repeats each K/V head for its query heads (`repeat_kv`) before calling
torch's SDPA, since CUDA's fused kernels take grouped heads only without a mask. On a CPU that copy is
most of a decode step: SmolLM2 (9 query heads over 3 K/V heads), 64 rows over a 529-slot static cache,
spent 68% of its time in the copies, and the attention itself ran 26 ms per layer with them against
1.5 ms with SDPA's own `enable_gqa` (bit-identical outputs). `GROUPED_SDPA` is that path, registered
with transformers under its own name (with sdpa's masks), and `attention_for` picks it on a CPU.

The static reply writer uses it (2.5 replies/s against 1.2 with the copies, 64 rows of ~465-token
prompts, bf16, AMX Xeon, 2 threads). Distillation keeps transformers' sdpa: its packed 1024-token
blocks are compute-bound, and the grouped path measured no faster there (471 vs 489 tok/s, N = 22).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "swiftkv_grouped_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **_,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract ([B, H, S, D] in, [B, S, H, D] out), with the K/V
    heads passed as they are: SDPA groups the query heads over them."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' sdpa: causal by flag only for a prompt without a mask (a decode step's one query
    # sees every slot; a given mask already holds causality).
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def attention_for(device: torch.device | str) -> str:
    """The attention implementation for models on `device`: grouped SDPA on a CPU; transformers' sdpa
    elsewhere (CUDA's fused kernels take a mask only with the heads repeated)."""
    return GROUPED_SDPA if torch.device(device).type == "cpu" else "sdpa"
