"""What one kind of attention computes and keeps per token, for the FLOP model (`swiftkv.flops`) and the memory
plan (`distill.measure.plan`): a family names its kind (`Family.attention`); grouped-query attention's counts are
here, multi-head latent attention's beside its model (`mla.LATENT_ATTENTION`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import head_dim_of


@dataclass(frozen=True)
class AttentionCounts:
    # Multiply-accumulates x 2 per token of the query, K/V and output projections: {"q", "kv", "o"}
    projection_flops: Callable[[object], dict[str, int]]
    # QK^T and AV FLOPs of one query token over `keys` keys, one layer: (config, keys) -> FLOPs
    score_flops: Callable[[object, float], float]
    # Values per token an AcrossKV group keeps for its layers' backward
    group_kv_values: Callable[[object], int]
    # FLOPs per token of a low-rank query's second factor, whose gradient reaches layer N's input too (0: none)
    query_second_factor_flops: Callable[[object], int] = lambda config: 0


def grouped_projection_flops(config) -> dict[str, int]:
    """q_proj to every query head, k/v_proj to every K/V head, o_proj back to the hidden width."""
    head_dim = head_dim_of(config)
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    hidden = config.hidden_size
    return {"q": 2 * hidden * q, "kv": 2 * 2 * hidden * kv, "o": 2 * q * hidden}


GROUPED_QUERY_ATTENTION = AttentionCounts(
    projection_flops=grouped_projection_flops,
    score_flops=lambda config, keys: 2 * 2 * config.num_attention_heads * head_dim_of(config) * keys,
    group_kv_values=lambda config: (
        2 * config.num_key_value_heads * head_dim_of(config)
    ),  # K and V of each head
)
