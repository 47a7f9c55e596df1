"""The model families SwiftKV supports, one file each (its config class, its rules and its `Family` entry), and
the registry over them: read by conversion, loading, the package's exports and Auto registration, the auto_map
shim written into every folder, the error messages and the vLLM plugin. A new Llama-like family is one file here
plus its line in `FAMILIES`: the entry's traits build its transformers classes (`modeling.swiftkv_causal_lm`)
and tell the one vLLM model class (`swiftkv.vllm.model`) how to serve it.

A family may accept several source model_types: Mistral checkpoints are Llama-shaped (same weight
names and math, their own `head_dim`), so they convert into the Llama family (`llama_swiftkv`) as
long as they use no sliding window (`source_refusal`).

The Mixture-of-Experts families (Qwen3-MoE, Qwen2-MoE, Mixtral) are transformers' MoE classes with the
same SwiftKV attention as their dense siblings (Qwen3's, Qwen2's, Llama's); routers and experts stay
the source's. They read and write their experts in the source's checkpoint layout (`checkpoint_layout`): transformers 5
holds each layer's experts as fused 3-D parameters (`mlp.experts.gate_up_proj` [experts, 2I, H]), which it
reads from, and writes back to, the per-expert tensors of the published checkpoints through a conversion
mapping looked up by model_type; a `<base>_swiftkv` type is not in that table (and transformers skips it for
classes outside its own package unless the user registered the type), so each MoE family registers its base
type's mapping under its own (`register_checkpoint_layout`). MoE types no family takes are refused naming
what blocks them (`UNSUPPORTED_MOE`).

DeepSeek-V2 and DeepSeek-V3 are MoE families with multi-head latent attention (`latent_attention`: the
SwiftKV attention of `model.mla`, whose cache keeps each group's latent). vLLM does not serve them
(`vllm_blocker`: its MLA attention cannot share a KV cache across layers)."""

from __future__ import annotations

from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)

from . import deepseek, llama, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe
from .family import Family

# The registry: every family, in the order the auto_map shim and the messages list them.
FAMILIES: dict[str, Family] = {
    f.base_type: f
    for f in (
        llama.FAMILY,
        qwen2.FAMILY,
        qwen3.FAMILY,
        qwen3_moe.FAMILY,
        qwen2_moe.FAMILY,
        mixtral.FAMILY,
        deepseek.V2,
        deepseek.V3,
    )
}
SOURCE_FAMILIES = {source: f for f in FAMILIES.values() for source in f.source_types}
BASE_MODEL_TYPES = tuple(SOURCE_FAMILIES)  # plain model_types that convert (llama, mistral, qwen2, ...)
# Those a GGUF file may hold: the dense ones (transformers' GGUF reader of MoE experts is not verified here).
GGUF_SOURCE_TYPES = tuple(t for t, f in SOURCE_FAMILIES.items() if not f.experts)
SUPPORTED_MODEL_TYPES = (*BASE_MODEL_TYPES, *(f.swiftkv_type for f in FAMILIES.values()))
ARCHITECTURES = tuple(f.architecture for f in FAMILIES.values())
SWIFTKV_CLASSES = tuple(cls for f in FAMILIES.values() for cls in (f.config_class, f.model_class))
FAMILY_NAMES = ", ".join(
    sorted(
        {name for f in FAMILIES.values() for name in (f.display, *(s.capitalize() for s in f.other_sources))}
    )
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


def register_checkpoint_layout(swiftkv_type: str, base_type: str) -> None:
    """Read and write `swiftkv_type` folders with `base_type`'s expert layout. Idempotent (the package may
    be imported through several paths in one process)."""
    mapping = get_checkpoint_conversion_mapping(base_type)
    if mapping is None:
        raise ValueError(f"transformers has no checkpoint conversion mapping for {base_type!r}")
    register_checkpoint_conversion_mapping(swiftkv_type, mapping, overwrite=True)


def unsupported(model_type) -> str:
    """The one message for a model_type no family takes; for a known MoE type it names what blocks it."""
    why = UNSUPPORTED_MOE.get(model_type)
    return (
        f"model_type {model_type!r} is not supported{f': {why}' if why else ''}; expected one of "
        f"{list(SUPPORTED_MODEL_TYPES)} ({FAMILY_NAMES} causal LMs)"
    )


def check_vllm_serves(config) -> None:
    """Refuse, with the family's reason, a SwiftKV config (or config.json as a dict) whose family the vLLM
    plugin cannot serve."""
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    why = vllm_refusal(family_of(model_type)) if model_type in SUPPORTED_MODEL_TYPES else None
    if why:
        raise ValueError(why)


def family_of(model_type: str) -> Family:
    """The family of a plain or SwiftKV model_type (a Mistral source is in the Llama family)."""
    if model_type.endswith("_swiftkv"):
        family = FAMILIES.get(model_type.removesuffix("_swiftkv"))
    else:
        family = SOURCE_FAMILIES.get(model_type)
    if family is None:
        raise ValueError(unsupported(model_type))
    return family


def vllm_refusal(family: Family) -> str | None:
    """Why the vLLM plugin cannot serve this family (None: it can). Every family is served today; a
    family entry without a vLLM decoder layer is refused by this one message; a family vLLM itself
    cannot serve (`vllm_blocker`) names why and what would lift it."""
    if family.vllm_blocker is not None:
        return (
            f"{family.architecture} ({family.swiftkv_type}) cannot be served on vLLM: {family.vllm_blocker}. Run it "
            "with transformers instead (swiftkv generate / swiftkv eval)"
        )
    if family.vllm_layer is not None:
        return None
    return (
        f"{family.architecture} ({family.swiftkv_type}) cannot be served on vLLM: the plugin has no vLLM "
        "decoder layer for this family. Run it with transformers instead (swiftkv generate / swiftkv eval); "
        f"vLLM serves {', '.join(served_types())}"
    )


def served_types() -> list[str]:
    return [f.swiftkv_type for f in FAMILIES.values() if f.vllm_layer is not None]
