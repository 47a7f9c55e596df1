"""What the Mixture-of-Experts families need beyond the dense ones: their experts' checkpoint layout, the
sources they refuse, and the MoE model types swiftkv has no family for, each with what blocks it.

SwiftKV changes only the attention of the later layers; routers and experts stay the source's. transformers
5 holds each layer's experts as fused 3-D parameters (`mlp.experts.gate_up_proj` [experts, 2I, H],
`mlp.experts.down_proj`), which it reads from, and writes back to, the per-expert tensors of the published
checkpoints through a conversion mapping looked up by model_type. A `<base>_swiftkv` type is not in that
table, and transformers skips the table for classes outside its own package unless the type was registered
by the user, so each MoE family registers its base type's mapping under its own type
(`register_checkpoint_layout`): its folders then hold the experts exactly as the source did.
"""

from __future__ import annotations

from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)


def register_checkpoint_layout(swiftkv_type: str, base_type: str) -> None:
    """Read and write `swiftkv_type` folders with `base_type`'s expert layout. Idempotent (the package may
    be imported through several paths in one process)."""
    mapping = get_checkpoint_conversion_mapping(base_type)
    if mapping is None:
        raise ValueError(f"transformers has no checkpoint conversion mapping for {base_type!r}")
    register_checkpoint_conversion_mapping(swiftkv_type, mapping, overwrite=True)


def quantized_experts_refusal(config) -> str | None:
    """Why a quantized MoE source cannot become SwiftKV (None: it is not quantized). Conversion runs the
    teacher in full precision and writes every expert back; a quantized checkpoint (FP8, AWQ, GPTQ, ...)
    would have to be dequantized and requantized, which nothing here does."""
    quantization = getattr(config, "quantization_config", None)
    if not quantization:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    method = method or getattr(quantization, "quant_method", None) or "unknown"
    return (
        f"its weights are quantized (quantization_config.quant_method={str(method)!r}), experts included "
        "(mlp.experts.*); SwiftKV converts unquantized checkpoints only: convert the bf16/fp32 release of "
        "this model"
    )


# MoE model types of transformers 5.19 that `convert` meets, with what the SwiftKV later-layer attention (one
# full-attention K/V per group, RoPE on all of head_dim, no sinks) or this package lacks for each.
UNSUPPORTED_MOE = {
    "gpt_oss": (
        "its attention has per-head attention sinks and alternates sliding-window (128) and full-attention "
        "layers; SwiftKV's later-layer attention has neither (one full-attention K/V per group, no sinks)"
    ),
    "olmoe": (
        "it normalises q and k over the whole projection (q_norm/k_norm of width hidden_size), not per head; "
        "SwiftKV's q/k norms are per head (Qwen3's)"
    ),
    "flex_olmo": "it normalises q and k over the whole projection (OLMoE's attention), not per head",
    "deepseek_v2": (
        "it uses multi-head latent attention (MLA: a compressed KV latent and a decoupled RoPE key), which "
        "needs its own SwiftKV projections (kv_a/kv_b); not supported yet"
    ),
    "deepseek_v3": (
        "it uses multi-head latent attention (MLA: a compressed KV latent and a decoupled RoPE key), which "
        "needs its own SwiftKV projections (kv_a/kv_b); not supported yet"
    ),
    "qwen3_next": (
        "three of every four layers are linear attention (Gated DeltaNet), which has no K/V cache to share"
    ),
    "qwen3_5_moe": "most of its layers are linear attention (Gated DeltaNet), which has no K/V cache to share",
    "minimax": "every other layer is linear (lightning) attention, which has no K/V cache to share",
    "jamba": "most of its layers are Mamba layers, which have no K/V cache to share",
    "llama4": (
        "its layers alternate chunked attention and RoPE-free (NoPE) global attention; SwiftKV's later "
        "layers attend over the full context with RoPE"
    ),
    "dbrx": "its attention fuses q/k/v in one clipped projection (Wqkv, clip_qkv)",
    "phimoe": "its layers normalise with LayerNorm (with bias), not RMSNorm",
    "glm4_moe": "its attention rotates only part of each head (partial_rotary_factor)",
    "granitemoe": (
        "its attention and residuals are scaled by multipliers (attention_multiplier, residual_multiplier)"
    ),
}


def unsupported_moe_reason(model_type: str) -> str | None:
    return UNSUPPORTED_MOE.get(model_type)
