"""Mixtral: Llama's attention over MoE blocks (`block_sparse_moe`, experts `w1/w3/w2`)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import MixtralConfig

from ..config import SwiftKVConfigMixin
from .family import VLLM_MODELS, Family, moe_source_refusal


@strict
class MixtralSwiftKVConfig(SwiftKVConfigMixin, MixtralConfig):
    """MixtralConfig + SwiftKV keys (`SwiftKVConfigMixin`); Llama's attention."""

    model_type = "mixtral_swiftkv"


FAMILY = Family(
    "mixtral",
    MixtralSwiftKVConfig,
    "Mixtral",
    f"{VLLM_MODELS}.mixtral:MixtralDecoderLayer",
    vllm_moe=f"{VLLM_MODELS}.mixtral:MixtralMoE",
    moe_attribute="block_sparse_moe",
    source_refusal=moe_source_refusal,
    checkpoint_layout="mixtral",
)
