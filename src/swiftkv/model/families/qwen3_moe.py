"""Qwen3-MoE: Qwen3's attention (its per-head norms, no biases) over transformers' MoE blocks, whose routers and
experts stay the source's, saved in the source's expert layout."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3MoeConfig

from ..config import SwiftKVConfigMixin
from .family import VLLM_MODELS, Family, moe_source_refusal
from .qwen3 import no_biases


@strict
class Qwen3MoeSwiftKVConfig(SwiftKVConfigMixin, Qwen3MoeConfig):
    """Qwen3MoeConfig + SwiftKV keys (`SwiftKVConfigMixin`); Qwen3's attention, so the student
    carries q_norm_swiftkv / k_norm_swiftkv as qwen3_swiftkv does."""

    model_type = "qwen3_moe_swiftkv"


FAMILY = Family(
    "qwen3_moe",
    Qwen3MoeSwiftKVConfig,
    "Qwen3Moe",
    f"{VLLM_MODELS}.qwen3_moe:Qwen3MoeDecoderLayer",
    biases=no_biases,
    qk_norm=True,
    vllm_moe=f"{VLLM_MODELS}.qwen3_moe:Qwen3MoeSparseMoeBlock",
    source_refusal=moe_source_refusal,
    checkpoint_layout="qwen3_moe",
)
