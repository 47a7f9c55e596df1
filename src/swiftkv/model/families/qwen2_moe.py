"""Qwen2-MoE: Qwen2's attention (q/k/v biases) over MoE blocks with a shared expert."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen2MoeConfig

from ..config import SwiftKVConfigMixin
from .family import VLLM_MODELS, Family, moe_source_refusal
from .qwen2 import qkv_biases


@strict
class Qwen2MoeSwiftKVConfig(SwiftKVConfigMixin, Qwen2MoeConfig):
    """Qwen2MoeConfig + SwiftKV keys (`SwiftKVConfigMixin`); Qwen2's attention (q/k/v biases)."""

    model_type = "qwen2_moe_swiftkv"


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


FAMILY = Family(
    "qwen2_moe",
    Qwen2MoeSwiftKVConfig,
    "Qwen2Moe",
    f"{VLLM_MODELS}.qwen2_moe:Qwen2MoeDecoderLayer",
    biases=qwen2_moe_biases,
    vllm_moe=f"{VLLM_MODELS}.qwen2_moe:Qwen2MoeSparseMoeBlock",
    source_refusal=moe_source_refusal,
    checkpoint_layout="qwen2_moe",
)
