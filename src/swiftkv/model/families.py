"""The model families SwiftKV supports: one registry, read by conversion, loading, the package's
exports and Auto registration, the auto_map shim written into every folder, the error messages and
the vLLM plugin. A new Llama-like family is one entry here plus its config class (`model.config`):
the entry's traits build its transformers classes (`modeling.swiftkv_causal_lm`) and tell the one vLLM
model class (`swiftkv.vllm.model`) how to serve it.

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

from collections.abc import Callable
from dataclasses import dataclass, field

from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)

from .config import (
    DeepseekV2SwiftKVConfig,
    DeepseekV3SwiftKVConfig,
    LlamaSwiftKVConfig,
    MixtralSwiftKVConfig,
    Qwen2MoeSwiftKVConfig,
    Qwen2SwiftKVConfig,
    Qwen3MoeSwiftKVConfig,
    Qwen3SwiftKVConfig,
)
from .mla import SwiftKVLatentAttentionMixin, SwiftKVLatentModelMixin
from .modeling import swiftkv_causal_lm


def sliding_window_refusal(config) -> str | None:
    """Why a source with a sliding window cannot become SwiftKV (None: it can). The SwiftKV layers
    attend over one K/V per group computed for every token; a window that cuts the context would
    need its own masks in the HF model, the vLLM holders and the calibration, which nothing here
    implements, so such a model is refused rather than served with full attention (different math)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if window is None or (
        getattr(config, "use_sliding_window", True) is False and "sliding_attention" not in layer_types
    ):
        return None
    context = getattr(config, "max_position_embeddings", None)
    if context is not None and window >= context:
        return None  # a window at least as long as the context never cuts anything
    return (
        f"it uses sliding-window attention (sliding_window={window}, max_position_embeddings={context}); "
        "SwiftKV here supports full attention only. A checkpoint whose config sets sliding_window to null "
        "(e.g. Mistral-7B-v0.2 and later) converts"
    )


def config_biases(config) -> dict[str, bool]:
    """Llama's rule: `attention_bias` on q/k/v and o_proj, `mlp_bias` on the MLP."""
    attention = bool(getattr(config, "attention_bias", False))
    return {"qkv_bias": attention, "o_bias": attention, "mlp_bias": bool(getattr(config, "mlp_bias", False))}


def qkv_biases(config) -> dict[str, bool]:
    """Qwen2's rule: q/k/v always carry a bias, o_proj and the MLP never."""
    return {"qkv_bias": True, "o_bias": False, "mlp_bias": False}


QWEN3_ATTENTION_BIAS_HELP = (
    "this {model_type} config sets attention_bias=true: transformers' Qwen3 then adds a bias to q/k/v and "
    "o_proj, but vLLM's own Qwen3 layer (which serves the early layers) has no o_proj bias, so vLLM would compute "
    "another model. Published Qwen3 checkpoints use attention_bias=false; serve this one with transformers "
    "(swiftkv generate/eval) instead"
)


def no_biases(config) -> dict[str, bool]:
    """Qwen3's rule on vLLM (Qwen3-MoE's too): no biases; a config with attention_bias is refused
    (QWEN3_ATTENTION_BIAS_HELP)."""
    if getattr(config, "attention_bias", False):
        raise ValueError(QWEN3_ATTENTION_BIAS_HELP.format(model_type=getattr(config, "model_type", "qwen3")))
    return {"qkv_bias": False, "o_bias": False, "mlp_bias": False}


QWEN2_MOE_QKV_BIAS_HELP = (
    "this qwen2_moe_swiftkv config sets qkv_bias=false, but vLLM's own Qwen2-MoE layer (which serves the early "
    "layers) always adds q/k/v biases. Published Qwen2-MoE checkpoints use qkv_bias=true; serve this one with "
    "transformers (swiftkv generate/eval) instead"
)


def qwen2_moe_biases(config) -> dict[str, bool]:
    """Qwen2-MoE's rule on vLLM: Qwen2's (q/k/v biases only); a config without them is refused."""
    if not getattr(config, "qkv_bias", True):
        raise ValueError(QWEN2_MOE_QKV_BIAS_HELP)
    return qkv_biases(config)


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


def moe_source_refusal(config) -> str | None:
    """Why an MoE source cannot become SwiftKV: a sliding window (as for the dense families) or
    quantized experts."""
    return sliding_window_refusal(config) or quantized_experts_refusal(config)


def deepseek_v2_refusal(config) -> str | None:
    """Why a DeepSeek-V2 source cannot become SwiftKV: an MoE refusal, or a routing that transformers' model
    computes otherwise than DeepSeek's own code (which ArcticTraining's deepseek_v2_swiftkv runs): DeepSeek's
    gate renormalises the top-k weights when norm_topk_prob is set (instead of scaling them), and makes only
    every moe_layer_freq-th layer sparse; transformers' DeepseekV2 does neither. Published DeepSeek-V2
    checkpoints set norm_topk_prob=false and moe_layer_freq=1."""
    why = moe_source_refusal(config)
    if why:
        return why
    if getattr(config, "norm_topk_prob", False) and (getattr(config, "num_experts_per_tok", 1) or 1) > 1:
        return (
            "it sets norm_topk_prob=true: DeepSeek's own DeepSeek-V2 code renormalises the top-k expert weights "
            "then, transformers' DeepseekV2 scales them by routed_scaling_factor instead, so the two compute "
            "different models; SwiftKV converts DeepSeek-V2 configs with norm_topk_prob=false (as published)"
        )
    if (getattr(config, "moe_layer_freq", 1) or 1) != 1:
        return (
            f"it sets moe_layer_freq={config.moe_layer_freq}: transformers' DeepseekV2 makes every layer from "
            "first_k_dense_replace on an MoE layer and ignores it; SwiftKV converts moe_layer_freq=1 (as published)"
        )
    return None


MLA_VLLM_BLOCKER = (
    "vLLM's multi-head latent attention (MLA) cannot share a KV cache across layers (its MLA attention layers "
    'and backends raise "KV sharing is not supported for MLA"), and SwiftKV\'s later layers read their '
    "AcrossKV group's shared cache. What would lift it: serving the later layers through vLLM's non-MLA "
    "attention path with decompressed K/V (the standard Attention takes kv_sharing_target_layer_name), or MLA "
    "kernels that read a shared latent cache"
)


@dataclass(frozen=True)
class Family:
    """One family's traits. Its transformers classes are transformers' own `<display>...` classes of
    `base_type` with the SwiftKV parts mixed in (built here, as `model_class`)."""

    base_type: str  # transformers model_type of the family's plain model, e.g. "llama"
    config_class: type  # its SwiftKV config (model_type "<base>_swiftkv")
    display: str  # the family's name in messages and docs, and its transformers class prefix
    vllm_layer: str | None  # "module:Class" of vLLM's decoder layer for the early layers; None: not served
    # "module:Class" of vLLM's MoE block that the later layers' sparse layers build (None: vLLM's LlamaMLP, as
    # the dense families and an MoE family's dense layers), held as the layer's `moe_attribute`: the name its
    # checkpoints and vLLM's own decoder layer give it (Mixtral: block_sparse_moe).
    vllm_moe: str | None = None
    moe_attribute: str = "mlp"
    biases: Callable[[object], dict[str, bool]] = config_biases  # which vLLM projections carry a bias
    qk_norm: bool = False  # q/k normalised per head before RoPE (Qwen3): the student carries its own norms
    other_sources: tuple[str, ...] = ()  # further plain model_types converted into this family
    source_refusal: Callable[[object], str | None] = sliding_window_refusal
    checkpoint_layout: str | None = None  # MoE: the base type whose expert layout it saves
    latent_attention: bool = False  # multi-head latent attention (DeepSeek): the SwiftKV attention of `mla`
    vllm_blocker: str | None = None  # why vLLM cannot serve the family, whatever the plugin builds
    model_class: type = field(init=False)  # its SwiftKV causal LM

    def __post_init__(self):
        mixins = (
            (SwiftKVLatentAttentionMixin, SwiftKVLatentModelMixin) if self.latent_attention else (None, None)
        )
        model = swiftkv_causal_lm(self.display, self.base_type, self.config_class, self.qk_norm, *mixins)
        object.__setattr__(self, "model_class", model)

    @property
    def swiftkv_type(self) -> str:
        return self.config_class.model_type

    @property
    def architecture(self) -> str:
        return self.model_class.__name__

    @property
    def source_types(self) -> tuple[str, ...]:
        return (self.base_type, *self.other_sources)

    @property
    def experts(self) -> bool:
        """Whether its layers hold Mixture-of-Experts blocks (routers and experts, kept frozen)."""
        return self.checkpoint_layout is not None

    @property
    def vllm_refusal(self) -> str | None:
        """Why the vLLM plugin cannot serve this family (None: it can). Every family is served today; a
        family entry without a vLLM decoder layer is refused by this one message; a family vLLM itself
        cannot serve (`vllm_blocker`) names why and what would lift it."""
        if self.vllm_blocker is not None:
            return (
                f"{self.architecture} ({self.swiftkv_type}) cannot be served on vLLM: {self.vllm_blocker}. Run it "
                "with transformers instead (swiftkv generate / swiftkv eval)"
            )
        if self.vllm_layer is not None:
            return None
        return (
            f"{self.architecture} ({self.swiftkv_type}) cannot be served on vLLM: the plugin has no vLLM "
            "decoder layer for this family. Run it with transformers instead (swiftkv generate / swiftkv eval); "
            f"vLLM serves {', '.join(f.swiftkv_type for f in FAMILIES.values() if f.vllm_layer is not None)}"
        )


VLLM_MODELS = "vllm.model_executor.models"
FAMILIES = {
    f.base_type: f
    for f in (
        Family(
            "llama",
            LlamaSwiftKVConfig,
            "Llama",
            f"{VLLM_MODELS}.llama:LlamaDecoderLayer",
            other_sources=("mistral",),
        ),
        Family(
            "qwen2", Qwen2SwiftKVConfig, "Qwen2", f"{VLLM_MODELS}.qwen2:Qwen2DecoderLayer", biases=qkv_biases
        ),
        Family(
            "qwen3",
            Qwen3SwiftKVConfig,
            "Qwen3",
            f"{VLLM_MODELS}.qwen3:Qwen3DecoderLayer",
            biases=no_biases,
            qk_norm=True,
        ),
        Family(
            "qwen3_moe",
            Qwen3MoeSwiftKVConfig,
            "Qwen3Moe",
            f"{VLLM_MODELS}.qwen3_moe:Qwen3MoeDecoderLayer",
            biases=no_biases,
            qk_norm=True,
            vllm_moe=f"{VLLM_MODELS}.qwen3_moe:Qwen3MoeSparseMoeBlock",
            source_refusal=moe_source_refusal,
            checkpoint_layout="qwen3_moe",
        ),
        Family(
            "qwen2_moe",
            Qwen2MoeSwiftKVConfig,
            "Qwen2Moe",
            f"{VLLM_MODELS}.qwen2_moe:Qwen2MoeDecoderLayer",
            biases=qwen2_moe_biases,
            vllm_moe=f"{VLLM_MODELS}.qwen2_moe:Qwen2MoeSparseMoeBlock",
            source_refusal=moe_source_refusal,
            checkpoint_layout="qwen2_moe",
        ),
        Family(
            "mixtral",
            MixtralSwiftKVConfig,
            "Mixtral",
            f"{VLLM_MODELS}.mixtral:MixtralDecoderLayer",
            vllm_moe=f"{VLLM_MODELS}.mixtral:MixtralMoE",
            moe_attribute="block_sparse_moe",
            source_refusal=moe_source_refusal,
            checkpoint_layout="mixtral",
        ),
        Family(
            "deepseek_v2",
            DeepseekV2SwiftKVConfig,
            "DeepseekV2",
            None,
            source_refusal=deepseek_v2_refusal,
            checkpoint_layout="deepseek_v2",
            latent_attention=True,
            vllm_blocker=MLA_VLLM_BLOCKER,
        ),
        Family(
            "deepseek_v3",
            DeepseekV3SwiftKVConfig,
            "DeepseekV3",
            None,
            source_refusal=moe_source_refusal,
            checkpoint_layout="deepseek_v3",
            latent_attention=True,
            vllm_blocker=MLA_VLLM_BLOCKER,
        ),
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
    why = family_of(model_type).vllm_refusal if model_type in SUPPORTED_MODEL_TYPES else None
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
