"""DeepSeek-V2 and DeepSeek-V3: MoE families with multi-head latent attention (`latent_attention`: the SwiftKV
attention of `model.mla`, whose cache keeps each group's latent). DeepSeek-V2 is ArcticTraining's format;
DeepSeek-V3 names its tensors as V2 does. vLLM does not serve them (`vllm_blocker`)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import DeepseekV2Config, DeepseekV3Config

from ..config import SwiftKVConfigMixin
from ..mla import latent_init_tensors
from .family import Family, moe_source_refusal

# Multi-head latent attention (DeepSeek): ArcticTraining's deepseek_v2_swiftkv config is DeepSeek's own
# (remote-code) DeepseekV2Config plus the three keys, read by transformers 4.x. Its RoPE reads
# `rope_scaling["type"]` (not `rope_type`), so the legacy keys carry both.


class DeepSeekLegacyRopeMixin:
    """Saved configs also name a scaled RoPE's kind under `type`, which DeepSeek's own code reads."""

    def to_dict(self) -> dict:
        config = super().to_dict()
        scaling = config.get("rope_scaling")
        if scaling and "rope_type" in scaling:
            config["rope_scaling"] = {**scaling, "type": scaling["rope_type"]}
        return config


@strict
class DeepseekV2SwiftKVConfig(DeepSeekLegacyRopeMixin, SwiftKVConfigMixin, DeepseekV2Config):
    """DeepseekV2Config + SwiftKV keys (`SwiftKVConfigMixin`), in ArcticTraining's layout: later layers
    carry `q_proj_swiftkv` (or `q_a_proj_swiftkv`, `q_a_layernorm_swiftkv`, `q_b_proj_swiftkv` when
    q_lora_rank is set), group owners `kv_a_proj_with_mqa_swiftkv`, `kv_a_layernorm_swiftkv`,
    `kv_b_proj_swiftkv` (`model.mla`)."""

    model_type = "deepseek_v2_swiftkv"


@strict
class DeepseekV3SwiftKVConfig(DeepSeekLegacyRopeMixin, SwiftKVConfigMixin, DeepseekV3Config):
    """DeepseekV3Config + SwiftKV keys, with DeepSeek-V2's SwiftKV tensors (see DeepseekV2SwiftKVConfig)."""

    model_type = "deepseek_v3_swiftkv"


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


V2 = Family(
    "deepseek_v2",
    DeepseekV2SwiftKVConfig,
    "DeepseekV2",
    None,
    source_refusal=deepseek_v2_refusal,
    checkpoint_layout="deepseek_v2",
    latent_attention=True,
    init_tensors=latent_init_tensors,
    vllm_blocker=MLA_VLLM_BLOCKER,
)
V3 = Family(
    "deepseek_v3",
    DeepseekV3SwiftKVConfig,
    "DeepseekV3",
    None,
    source_refusal=moe_source_refusal,
    checkpoint_layout="deepseek_v3",
    latent_attention=True,
    init_tensors=latent_init_tensors,
    vllm_blocker=MLA_VLLM_BLOCKER,
)
