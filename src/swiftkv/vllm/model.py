"""SwiftKV as a vLLM model (Llama, which also serves converted Mistral checkpoints; Qwen2; Qwen3; and the
Mixture-of-Experts Qwen3-MoE, Qwen2-MoE and Mixtral, whose later layers run vLLM's own MoE blocks),
following the shape of vLLM's Gemma3n fast prefill.

    forward(input_ids, positions)
      early   (compiled): embedding, layers < N, s = norm_swiftkv(h_N), K/V of every AcrossKV group
                          (Qwen3: each group's K through its k_norm_swiftkv, per head, before RoPE)
      glue    (eager)   : write each group's K/V into its holder cache for ALL tokens; pick the rows
                          that need logits from the fast-prefill attention metadata
      late    (compiled): layers >= N and the final norm on those rows only
      glue    (eager)   : scatter them back into a full-size hidden-state tensor

Prompt tokens that need no logits therefore stop after layer N-1 (plus one small K/V matmul), which
is the SwiftKV prefill saving. The data-dependent row selection stays outside the compiled graphs:
with one graph around everything, vLLM's trace-once compilation baked the selection in and
produced garbage.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable

import torch
from torch import nn
from torch.profiler import record_function
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention.attention import unified_kv_cache_update
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

from ..model.config import head_dim_of, is_swiftkv
from ..model.families import Family, family_of
from .layers import (
    GroupHeadRMSNorm,
    KVHolder,
    LaterAttentionSpec,
    MlpFactory,
    SwiftKVLaterLayer,
    holder_prefix,
    later_mlp_factory,
    make_rope,
)
from .parallel import RankHeads, rank_heads
from .weights import load_swiftkv_weights

FAST_PREFILL_HELP = (
    "SwiftKV on vLLM needs the engine argument kv_sharing_fast_prefill=True (CLI: --kv-sharing-fast-prefill): "
    "without it prompt tokens would run every layer (no SwiftKV saving). The swiftkv vLLM plugin switches it on "
    "when it is loaded; pass it explicitly if you disabled plugins."
)


def require_fast_prefill(vllm_config: VllmConfig) -> None:
    if not vllm_config.cache_config.kv_sharing_fast_prefill:
        raise ValueError(FAST_PREFILL_HELP)


PIPELINE_HELP = (
    "SwiftKV on vLLM does not support pipeline parallelism (pipeline_parallel_size={}): the later "
    "layers read the K/V that layer N's output produces, across any stage boundary. Use "
    "tensor_parallel_size to spread the model over devices, with pipeline_parallel_size=1"
)


def require_one_pipeline_stage(vllm_config: VllmConfig) -> None:
    stages = vllm_config.parallel_config.pipeline_parallel_size
    if stages != 1:
        raise ValueError(PIPELINE_HELP.format(stages))


def require_swiftkv_config(config) -> None:
    if not is_swiftkv(config):
        raise ValueError(
            f"{getattr(config, 'model_type', '?')} config has no num_key_value_layers: this folder is not a SwiftKV "
            "checkpoint (convert it with `swiftkv convert`)"
        )
    if not getattr(config, "swiftkv", True):
        # The teacher path of a SwiftKV checkpoint is the base model: serve the base model instead.
        raise ValueError(
            "config.swiftkv is false: vLLM serves only the SwiftKV (student) path; set swiftkv=true"
        )
    config.check_swiftkv_geometry()


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})
class SwiftKVEarly(nn.Module):
    """Embedding, layers < N, and every AcrossKV group's K (RoPE'd) and V from norm_swiftkv(h_N)."""

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        make_layer=None,
        kv_bias: bool = False,
        heads: RankHeads,
        qk_norm: bool = False,
    ):
        super().__init__()
        config = vllm_config.model_config.hf_config
        n, groups, head_dim = config.num_key_value_layers, config.num_kv_groups, head_dim_of(config)
        tp = vllm_config.parallel_config.tensor_parallel_size
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config
        )
        self.layers = nn.ModuleList([make_layer(f"{prefix}.layers.{i}") for i in range(n)])
        self.norm_swiftkv = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # All groups' K then all groups' V in one matmul: shard g = K of group g, shard groups+g = V.
        # Each shard is split over the ranks (KV heads replicated first where tp > KV heads).
        self.kv_proj_swiftkv = MergedColumnParallelLinear(
            config.hidden_size,
            [heads.kv_rows(tp) * head_dim] * (2 * groups),
            bias=kv_bias,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.kv_proj_swiftkv",
        )
        self.k_norm_swiftkv = GroupHeadRMSNorm(groups, head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary_emb = make_rope(config)
        self.keys_size = groups * heads.kv * head_dim  # this rank's K of every group

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        s, h_n = self.norm_swiftkv(hidden, residual)  # fused add: h_N is the residual stream entering N
        kv, _ = self.kv_proj_swiftkv(s)
        keys, values = kv.split([self.keys_size, self.keys_size], dim=-1)
        if self.k_norm_swiftkv is not None:
            keys = self.k_norm_swiftkv(keys)
        keys, _ = self.rotary_emb(positions, keys, None)  # every group's K heads rotated in one call
        return h_n, keys, values


@support_torch_compile(dynamic_arg_dims={"positions": 0, "hidden_states": 0})
class SwiftKVLate(nn.Module):
    """Layers >= N and the final norm, on whichever rows the glue passes in."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", make_layer=None):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.layers = nn.ModuleList([make_layer(i) for i in config.later_layers])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        out, _ = self.norm(hidden_states, residual)
        return out


class SwiftKVModel(nn.Module):
    """`early` + eager glue + `late`. `make_early_layer(prefix)` builds vLLM's own decoder layer,
    `make_later_mlp(layer, prefix)` a later layer's MLP (`layers.later_mlp_factory`)."""

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str,
        make_early_layer,
        make_later_mlp: MlpFactory,
        bias: dict[str, bool],
        qk_norm: bool = False,
    ):
        super().__init__()
        from vllm.compilation.backends import (
            set_model_tag,  # importing it at module level breaks tests (as gemma3n)
        )

        config = vllm_config.model_config.hf_config
        require_swiftkv_config(config)
        require_fast_prefill(vllm_config)
        require_one_pipeline_stage(vllm_config)
        self.config = config
        cache, quant = vllm_config.cache_config, vllm_config.quant_config
        self.heads = heads = rank_heads(
            config.num_attention_heads,
            config.num_key_value_heads,
            vllm_config.parallel_config.tensor_parallel_size,
        )
        owners = config.kv_owners
        # Holders first: vLLM walks attention layers in construction order and restricts only the
        # trailing run of KV-sharing layers to the logits rows, so the holders must precede them.
        self.swiftkv_cache = nn.ModuleDict(
            {str(o): KVHolder(config, heads, cache, quant, holder_prefix(prefix, o)) for o in owners}
        )
        holder_name = {o: h.attn.layer_name for o, h in zip(owners, self.swiftkv_cache.values(), strict=True)}

        later = LaterAttentionSpec(config, heads, cache, quant, bias["qkv_bias"], bias["o_bias"], qk_norm)

        def make_late_layer(i: int) -> nn.Module:
            return SwiftKVLaterLayer(
                later, f"{prefix}.layers.{i}", holder_name[config.kv_owner(i)], make_later_mlp
            )

        with set_model_tag("swiftkv_early"):
            self.early = SwiftKVEarly(
                vllm_config=vllm_config,
                prefix=prefix,
                make_layer=make_early_layer,
                kv_bias=bias["qkv_bias"],
                heads=heads,
                qk_norm=qk_norm,
            )
        with set_model_tag("swiftkv_late"):
            self.late = SwiftKVLate(vllm_config=vllm_config, prefix=prefix, make_layer=make_late_layer)
        self.holder_names = list(holder_name.values())
        self.kv_shape = (config.num_kv_groups, heads.kv, head_dim_of(config))  # this rank's share
        self.last_attn_name = self.late.layers[-1].self_attn.attn.layer_name

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.early.embed_tokens(input_ids)

    def logits_rows(self) -> tuple[torch.Tensor | None, int | None]:
        """Rows that need logits in this step (padded, and how many are real), or (None, None) when
        the whole batch must run the later layers (dummy/profile runs)."""
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict) or self.last_attn_name not in metadata:
            return None, None
        layer_metadata = metadata[self.last_attn_name]
        return (
            getattr(layer_metadata, "logits_indices_padded", None),
            getattr(layer_metadata, "num_logits_indices", None),
        )

    def write_group_caches(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Each group's K/V into its holder's cache, for every token of the step. The CPU kernel needs
        [tokens, kv_heads, head_dim] views (2-D input crashes it)."""
        keys = keys.view(keys.shape[0], *self.kv_shape)
        values = values.view(values.shape[0], *self.kv_shape)
        for group, name in enumerate(self.holder_names):
            unified_kv_cache_update(keys[:, group], values[:, group], name)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The named ranges let `swiftkv bench --profile` (swiftkv/bench/profile.py) split the step's time;
        # with no profiler running they cost about a microsecond each.
        rows, num_rows = self.logits_rows()
        with record_function("swiftkv:early"):
            h_n, keys, values = self.early(input_ids, positions, inputs_embeds)
        with record_function("swiftkv:kv-write"):
            self.write_group_caches(keys, values)
        if num_rows is None and rows is not None:  # metadata without a count: every row given is real
            num_rows = rows.shape[0]
        if rows is None or num_rows == h_n.shape[0]:
            # Dummy runs, and decode-only steps: every row needs logits. vLLM's logits indices are
            # increasing, so as many of them as rows means all rows in order; no gather needed.
            with record_function("swiftkv:late"):
                return self.late(positions, h_n)
        with record_function("swiftkv:rows"):
            late_positions, late_input = positions[rows], h_n[rows]
        with record_function("swiftkv:late"):
            late = self.late(late_positions, late_input)
        with record_function("swiftkv:rows"):
            # Rows that need no logits keep h_N: vLLM reads hidden states only at the logits rows.
            return h_n.index_copy(0, rows[:num_rows].long(), late[:num_rows])


def early_layer_factory(family: Family, vllm_config: VllmConfig):
    """`prefix -> layer`: vLLM's own decoder layer of the family (`Family.vllm_layer`). Llama's and
    Qwen3-MoE's take the whole vllm_config; Qwen2's, Qwen3's, Qwen2-MoE's and Mixtral's take the model
    config, cache config and quantization config."""
    module, name = family.vllm_layer.split(":")
    layer_class = getattr(importlib.import_module(module), name)
    if "vllm_config" in inspect.signature(layer_class).parameters:
        return lambda prefix: layer_class(vllm_config=vllm_config, prefix=prefix)
    config = vllm_config.model_config.hf_config
    return lambda prefix: layer_class(
        config, vllm_config.cache_config, vllm_config.quant_config, prefix=prefix
    )


class SwiftKVForCausalLM(nn.Module):
    """vLLM causal LM around SwiftKVModel, for every family: its registry entry (`model.families`) says
    which vLLM decoder layer the early part uses, which MLP block the later layers build, which projections
    carry biases and whether q/k are normalised per head. The plugin registers this class under each family's architecture name."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        family = family_of(config.model_type)
        model_prefix = f"{prefix}.model" if prefix else "model"
        self.model = SwiftKVModel(
            vllm_config=vllm_config,
            prefix=model_prefix,
            make_early_layer=early_layer_factory(family, vllm_config),
            make_later_mlp=later_mlp_factory(family, vllm_config),
            bias=family.biases(config),
            qk_norm=family.qk_norm,
        )
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.lm_head" if prefix else "lm_head",
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.early.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=getattr(config, "logit_scale", 1.0))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # intermediate_tensors is always None: one pipeline stage (require_one_pipeline_stage)
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_swiftkv_weights(self, weights)
