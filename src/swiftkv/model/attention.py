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

On CUDA, SDPA's fused kernels take grouped heads only without a mask, and with `enable_gqa` and a mask it
falls to the math kernel, which repeats the heads itself. A decode step (one query per row) needs neither:
a row's query heads of one K/V head become that head's query rows ([B, kv, group, D]), an ordinary SDPA
call whose mask broadcasts over them. For the static writer at 1,024 rows x 1,088 slots that avoids ~77 GB of
copies per step (SmolLM2: 30 layers, 3 K/V heads repeated to 9). A prompt with a mask on CUDA goes to
transformers' sdpa (repeated heads, fused kernels): it is compute-bound and the copies are a small part.
On a CPU the folded decode measured no faster than `enable_gqa` (bf16, 64 rows), which stays there.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
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
    grouped = key.shape[1] != query.shape[1]
    if grouped and fused_kernels(query.device):
        if query.shape[2] == 1:
            return folded_decode(query, key, value, attention_mask, scaling), None
        if attention_mask is not None:
            return sdpa_attention_forward(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                is_causal=is_causal,
            )
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
        enable_gqa=grouped,
    )
    return out.transpose(1, 2).contiguous(), None


def folded_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """One query per row over grouped K/V heads, as [B, 1, H, D]: the query heads of each K/V head are
    its query rows, so SDPA reads every K/V head once and the [B, 1, 1, S] mask broadcasts over them."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    out = F.scaled_dot_product_attention(
        query.reshape(rows, kv_heads, heads // kv_heads, dim),
        key,
        value,
        attn_mask=attention_mask,
        scale=scaling,
    )
    return out.reshape(rows, 1, heads, dim)


def fused_kernels(device: torch.device) -> bool:
    """Whether `device`'s SDPA dispatches to fused kernels that take grouped heads only without a mask
    (CUDA); a CPU's SDPA takes them with one."""
    return device.type == "cuda"


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def attention_for(device: torch.device | str) -> str:
    """The attention implementation for the static writer's models on `device`: grouped SDPA on a CPU
    and on CUDA (there for its decode steps); transformers' sdpa elsewhere."""
    return GROUPED_SDPA if torch.device(device).type in ("cpu", "cuda") else "sdpa"
