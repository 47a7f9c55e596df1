"""Tensor-parallel head layout of the SwiftKV attention (vLLM's Llama rule), without vLLM."""

import pytest
import torch

from swiftkv.vllm.parallel import RankHeads, rank_heads, replicate_kv_heads


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "expected"),
    [
        (4, 2, 1, RankHeads(4, 2, 1)),
        (4, 2, 2, RankHeads(2, 1, 1)),
        (8, 2, 4, RankHeads(2, 1, 2)),  # fewer KV heads than ranks: each KV head on 2 ranks
        (9, 3, 3, RankHeads(3, 1, 1)),  # SmolLM2's 9 heads / 3 KV heads
        (4, 1, 2, RankHeads(2, 1, 2)),
    ],
)
def test_heads_per_rank(heads, kv, tp, expected):
    assert rank_heads(heads, kv, tp) == expected


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "message"),
    [
        (9, 3, 2, "tensor_parallel_size=2 does not divide num_attention_heads=9; expected one of [1, 3, 9]"),
        (12, 3, 2, "tensor_parallel_size=2 does not divide num_key_value_heads=3"),
        (12, 3, 4, "tensor_parallel_size=4 is neither a divisor nor a multiple of num_key_value_heads=3"),
        (12, 6, 4, "tensor_parallel_size=4 does not divide num_key_value_heads=6"),
    ],
)
def test_a_tp_that_does_not_divide_the_heads_is_one_clear_error(heads, kv, tp, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rank_heads(heads, kv, tp)


def test_replicated_kv_projection_gives_each_rank_the_head_its_queries_use():
    heads, kv, tp, head_dim, hidden = 8, 2, 4, 3, 5
    layout = rank_heads(heads, kv, tp)
    weight = torch.arange(kv * head_dim * hidden, dtype=torch.float32).view(kv * head_dim, hidden)
    bias = torch.arange(kv * head_dim, dtype=torch.float32)
    expanded = replicate_kv_heads(weight, head_dim, layout.kv_replicas)
    expanded_bias = replicate_kv_heads(bias, head_dim, layout.kv_replicas)
    assert expanded.shape[0] == layout.kv_rows(tp) * head_dim
    per_rank = expanded.shape[0] // tp  # what a column-parallel layer hands each rank
    for rank in range(tp):
        first_query = rank * layout.q
        needed = first_query // (heads // kv)  # the KV head that rank's queries use unsharded
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        assert torch.equal(expanded[rows], weight[needed * head_dim : (needed + 1) * head_dim])
        assert torch.equal(expanded_bias[rows], bias[needed * head_dim : (needed + 1) * head_dim])
    assert replicate_kv_heads(weight, head_dim, 1) is weight


def test_cpu_thread_binding_gives_each_rank_its_own_cpus():
    from swiftkv.vllm.env import thread_binding

    assert thread_binding([0, 1], 1) == "0,1"
    assert thread_binding([0, 1], 2) == "0|1"
    assert thread_binding([0, 1, 2, 3, 4], 2) == "0,1|2,3"
    with pytest.raises(ValueError, match="tensor_parallel_size=4 needs at least 4 CPUs"):
        thread_binding([0, 1], 4)


def test_serve_reads_the_tensor_parallel_size_from_vllm_options():
    from swiftkv.vllm.serve import tensor_parallel_size

    assert tensor_parallel_size(["--port", "1"]) == 1
    assert tensor_parallel_size(["--tensor-parallel-size", "2"]) == 2
    assert tensor_parallel_size(["-tp=4"]) == 4
