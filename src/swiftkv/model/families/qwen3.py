"""Qwen3: q and k normalised per head before RoPE, so the student carries its own norms (`q_norm_swiftkv` per
later layer, `k_norm_swiftkv` per AcrossKV group owner), in the layout of ArcticTraining's qwen3 branch."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from ..config import SwiftKVConfigError, SwiftKVConfigMixin
from .family import VLLM_MODELS, Family

# A fork of ArcticTraining writes another layout under model_type qwen3_swiftkv: a `kv_sharing_map`
# and no k/v_proj_swiftkv. Loading it as this format would fill the missing projections randomly.
FORK_LAYOUT_KEYS = ("kv_sharing_map",)


@strict
class Qwen3SwiftKVConfig(SwiftKVConfigMixin, Qwen3Config):
    """Qwen3Config + SwiftKV keys (`SwiftKVConfigMixin`), in the layout of ArcticTraining's qwen3
    branch: later layers also carry `q_norm_swiftkv`, group owners `k_norm_swiftkv`. The fork layout
    (`kv_sharing_map`) is refused here, so no loader (transformers, vLLM) builds it with random weights."""

    model_type = "qwen3_swiftkv"

    def __post_init__(self, **kwargs):
        fork = [key for key in FORK_LAYOUT_KEYS if key in kwargs or getattr(self, key, None) is not None]
        if fork:
            raise SwiftKVConfigError(
                f"this qwen3_swiftkv config has {fork[0]!r}: it is the layout of a fork of ArcticTraining (KV "
                "sharing by map, no k_proj_swiftkv/v_proj_swiftkv), not the format swiftkv reads (ArcticTraining's "
                "qwen3 branch: q_proj_swiftkv + q_norm_swiftkv per later layer, k/v_proj_swiftkv + k_norm_swiftkv "
                "per AcrossKV group owner). It is refused rather than loaded with random K/V projections; convert "
                "the original Qwen3 model with `swiftkv convert` instead"
            )
        super().__post_init__(**kwargs)


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


FAMILY = Family(
    "qwen3",
    Qwen3SwiftKVConfig,
    "Qwen3",
    f"{VLLM_MODELS}.qwen3:Qwen3DecoderLayer",
    biases=no_biases,
    qk_norm=True,
)
