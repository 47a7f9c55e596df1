"""Qwen2: q/k/v carry a bias, o_proj and the MLP none. The published Snowflake format `qwen2_swiftkv`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen2Config

from ..config import SwiftKVConfigMixin
from .family import VLLM_MODELS, Family


@strict
class Qwen2SwiftKVConfig(SwiftKVConfigMixin, Qwen2Config):
    """Qwen2Config + SwiftKV keys (`SwiftKVConfigMixin`)."""

    model_type = "qwen2_swiftkv"


def qkv_biases(config) -> dict[str, bool]:
    """Qwen2's rule: q/k/v always carry a bias, o_proj and the MLP never."""
    return {"qkv_bias": True, "o_bias": False, "mlp_bias": False}


FAMILY = Family(
    "qwen2", Qwen2SwiftKVConfig, "Qwen2", f"{VLLM_MODELS}.qwen2:Qwen2DecoderLayer", biases=qkv_biases
)
