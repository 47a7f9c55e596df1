"""Tensor parallelism of the SwiftKV attention, by vLLM's own Llama rule (importable without vLLM).

Each rank holds `num_attention_heads / tp` query heads. KV heads are split the same way when there
are at least as many as ranks; with fewer (tp > KV heads) every rank holds one KV head and each
head is replicated on `tp / KV heads` consecutive ranks, so rank r's query heads still attend to
the KV head they use in the unsharded model (query head j uses KV head j // (heads / KV heads)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RankHeads:
    q: int  # query heads on one rank
    kv: int  # KV heads on one rank
    kv_replicas: int  # ranks holding a copy of each KV head (1: KV heads are split, not copied)

    def kv_rows(self, tp: int) -> int:
        """KV heads of the whole (padded) projection: what the column-parallel layer divides by tp."""
        return self.kv * tp


def rank_heads(num_heads: int, num_kv_heads: int, tp: int) -> RankHeads:
    if num_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide num_attention_heads={num_heads}; expected "
            f"one of {divisors(num_heads)}"
        )
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise ValueError(
                f"tensor_parallel_size={tp} does not divide num_key_value_heads={num_kv_heads}; "
                f"expected one of {divisors(num_kv_heads)} or a multiple of {num_kv_heads} that "
                f"divides {num_heads}"
            )
        return RankHeads(num_heads // tp, num_kv_heads // tp, 1)
    if tp % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size={tp} is neither a divisor nor a multiple of num_key_value_heads="
            f"{num_kv_heads}"
        )
    return RankHeads(num_heads // tp, 1, tp // num_kv_heads)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def replicate_kv_heads(tensor: torch.Tensor, head_dim: int, replicas: int) -> torch.Tensor:
    """A k/v projection's weight [kv_heads * head_dim, hidden] (or bias) with each head's rows
    repeated `replicas` times in place, so that splitting it over the ranks gives rank r the head
    r // replicas."""
    if replicas == 1:
        return tensor
    heads = tensor.shape[0] // head_dim
    return (
        tensor.reshape(heads, head_dim, *tensor.shape[1:])
        .repeat_interleave(replicas, dim=0)
        .reshape(heads * replicas * head_dim, *tensor.shape[1:])
    )
