"""Building blocks of the vLLM SwiftKV model that vLLM's own Llama/Qwen2/Qwen3 do not have.

* `KVHolder`: an attention module with no weights that owns one AcrossKV group's KV cache. Every
  later layer of the group attends over it through `kv_sharing_target_layer_name`, so vLLM allocates
  one cache per group instead of one per layer.
* `SwiftKVLaterLayer`: a decoder layer i >= N. Its attention projects only the query
  (`q_proj_swiftkv`, then Qwen3's per-head `q_norm_swiftkv`); K/V were written to the group's holder
  cache from norm_swiftkv(h_N).
* `GroupHeadRMSNorm`: Qwen3's `k_norm_swiftkv` of every AcrossKV group at once, per head.
* `later_mlp_factory`: the MLP of a later layer, the family's own vLLM block: vLLM's MoE block (router,
  shared expert, experts through vLLM's fused MoE) on an MoE family's sparse layers, LlamaMLP otherwise.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from vllm.config import CacheConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaMLP
from vllm.model_executor.models.utils import extract_layer_index

from ..model.config import head_dim_of, is_sparse_layer
from ..model.families import Family
from .parallel import RankHeads


def holder_prefix(model_prefix: str, owner: int) -> str:
    """Module path of the holder of the group owned by layer `owner`. The owner's index is the only
    integer in the name, so vLLM (which orders caches by the integer in a layer name) sees one
    distinct index per cache: early layers 0..N-1, holders N, N+G, ..."""
    return f"{model_prefix}.swiftkv_cache.{owner}"


def make_rope(config):
    return get_rope(
        head_dim_of(config),
        max_position=getattr(config, "max_position_embeddings", 8192),
        rope_parameters=getattr(config, "rope_parameters", None),
        is_neox_style=True,
    )


def rank_attention(
    config,
    heads: RankHeads,
    cache_config: CacheConfig | None,
    quant_config: QuantizationConfig | None,
    prefix: str,
    **options,
) -> Attention:
    """vLLM's attention over this rank's heads: a holder's, which owns a group's cache, or a later layer's,
    which reads it (`kv_sharing_target_layer_name`)."""
    head_dim = head_dim_of(config)
    return Attention(
        heads.q,
        head_dim,
        head_dim**-0.5,
        num_kv_heads=heads.kv,
        cache_config=cache_config,
        quant_config=quant_config,
        prefix=prefix,
        **options,
    )


class KVHolder(nn.Module):
    """Owns the KV cache of one AcrossKV group. Never called: the model writes its cache with
    `unified_kv_cache_update` and the group's layers read it as KV-sharing layers."""

    def __init__(
        self,
        config,
        heads: RankHeads,
        cache_config: CacheConfig | None,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ):
        super().__init__()
        self.attn = rank_attention(config, heads, cache_config, quant_config, f"{prefix}.attn")


class GroupHeadRMSNorm(nn.Module):
    """One RMSNorm over head_dim per AcrossKV group (Qwen3's k_norm_swiftkv of each group owner),
    applied to every group's K heads at once: x [tokens, groups * heads * head_dim], where each group's
    heads are contiguous (the layout of `kv_proj_swiftkv`'s K shards on every rank). The weights are
    per head dimension, so tensor parallelism (which splits heads) keeps all of them on every rank.
    Computed as vLLM's RMSNorm: in fp32, cast back, then scaled."""

    def __init__(self, groups: int, head_dim: int, eps: float):
        super().__init__()
        self.eps, self.head_dim = eps, head_dim
        self.weight = nn.Parameter(torch.ones(groups, head_dim))
        self.weight.weight_loader = self.load_group

    @staticmethod
    def load_group(param: nn.Parameter, tensor: torch.Tensor, group: int) -> None:
        param.data[group].copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = self.weight.shape[0]
        heads = x.view(x.shape[0], groups, -1, self.head_dim)
        normed = heads.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed.to(x.dtype) * self.weight[None, :, None, :]).view(x.shape)


@dataclass(frozen=True)
class LaterAttentionSpec:
    """What every later layer's query-only attention is built from (each adds its prefix and holder)."""

    config: object  # the model's HF config
    heads: RankHeads
    cache_config: object
    quant_config: object
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool = False


class SwiftKVLaterAttention(nn.Module):
    """Query-only attention of a later layer: q_proj_swiftkv (+ q_norm_swiftkv per head for Qwen3),
    RoPE, attention over the holder cache."""

    def __init__(self, spec: LaterAttentionSpec, prefix: str, holder_attn_name: str):
        super().__init__()
        config, heads, cache_config, quant_config = (
            spec.config,
            spec.heads,
            spec.cache_config,
            spec.quant_config,
        )
        qkv_bias, o_bias, qk_norm = spec.qkv_bias, spec.o_bias, spec.qk_norm
        head_dim = head_dim_of(config)
        self.head_dim = head_dim
        self.q_norm_swiftkv = RMSNorm(head_dim, eps=config.rms_norm_eps) if qk_norm else None
        # The projections take the global sizes (vLLM shards them); the attention runs this rank's heads.
        self.q_proj_swiftkv = ColumnParallelLinear(
            config.hidden_size,
            config.num_attention_heads * head_dim,
            bias=qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.q_proj_swiftkv",
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * head_dim,
            config.hidden_size,
            bias=o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = make_rope(config)
        self.attn = rank_attention(
            config,
            heads,
            cache_config,
            quant_config,
            f"{prefix}.attn",
            kv_sharing_target_layer_name=holder_attn_name,
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, _ = self.q_proj_swiftkv(hidden_states)
        if self.q_norm_swiftkv is not None:  # per head, before RoPE (as vLLM's Qwen3Attention)
            q = self.q_norm_swiftkv(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
        q, _ = self.rotary_emb(positions, q, None)
        out, _ = self.o_proj(self.attn(q, None, None))
        return out


def build_moe_block(block_class: type, vllm_config, prefix: str) -> nn.Module:
    """vLLM's MoE block of a family, built the way vLLM's own decoder layer builds it: Qwen3-MoE's takes the
    vllm_config, Qwen2-MoE's the model config, Mixtral's the expert counts and sizes."""
    config, quant_config = vllm_config.model_config.hf_config, vllm_config.quant_config
    parameters = inspect.signature(block_class).parameters
    if "vllm_config" in parameters:
        return block_class(vllm_config=vllm_config, prefix=prefix)
    if "config" in parameters:
        return block_class(config=config, quant_config=quant_config, prefix=prefix)
    return block_class(
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        quant_config=quant_config,
        prefix=prefix,
    )


MlpFactory = Callable[[int, str], tuple[str, nn.Module]]


def later_mlp_factory(family: Family, vllm_config) -> MlpFactory:
    """`(layer, layer prefix) -> (attribute, MLP)` of the later layers: the family's vLLM MoE block
    (`Family.vllm_moe`) on sparse layers, held as `Family.moe_attribute`; else vLLM's LlamaMLP as `mlp`
    (gate_up_proj, down_proj, the config's activation: the dense MLP of every family, Qwen-MoE's dense
    layers included). The attribute is the name the checkpoint gives the layer's MLP, so its tensors
    route there by name."""
    config, quant_config = vllm_config.model_config.hf_config, vllm_config.quant_config
    block_class = None
    if family.vllm_moe is not None:
        module, name = family.vllm_moe.split(":")
        block_class = getattr(importlib.import_module(module), name)
    mlp_bias = family.biases(config)["mlp_bias"]

    def make_mlp(layer: int, prefix: str) -> tuple[str, nn.Module]:
        if block_class is not None and is_sparse_layer(config, layer):
            attribute = family.moe_attribute
            return attribute, build_moe_block(block_class, vllm_config, f"{prefix}.{attribute}")
        dense = LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            config.hidden_act,
            quant_config,
            bias=mlp_bias,
            prefix=f"{prefix}.mlp",
        )
        return "mlp", dense

    return make_mlp


class SwiftKVLaterLayer(nn.Module):
    """Decoder layer i >= N: the teacher's layer math with the query-only SwiftKV attention. Its MLP comes
    from `make_mlp(i, prefix)` (`later_mlp_factory`), built after the attention, and is held under the
    checkpoint's name for it."""

    def __init__(self, spec: LaterAttentionSpec, prefix: str, holder_attn_name: str, make_mlp: MlpFactory):
        super().__init__()
        config = spec.config
        self.self_attn = SwiftKVLaterAttention(spec, f"{prefix}.self_attn", holder_attn_name)
        self.mlp_attribute, mlp = make_mlp(extract_layer_index(prefix), prefix)
        self.add_module(self.mlp_attribute, mlp)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return getattr(self, self.mlp_attribute)(hidden_states), residual
