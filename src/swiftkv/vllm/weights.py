"""Checkpoint names (Snowflake / ArcticTraining format, ours full or trimmed) -> vLLM parameters.

The checkpoint keeps transformers' names; the vLLM model packs q/k/v and gate/up like vLLM's Llama,
packs every AcrossKV group's k/v_proj_swiftkv into one `kv_proj_swiftkv`, and owns layers < N in
`model.early` and layers >= N in `model.late`. The later layers' original q/k/v (and Qwen3's q/k
norms; dead weight in published checkpoints, absent from trimmed ones) are skipped, never allocated.
Qwen3's `q_norm_swiftkv` goes to its later layer, each owner's `k_norm_swiftkv` to its group's row
of `model.early.k_norm_swiftkv`. An MoE layer's experts (`<mlp>.experts.{e}.gate_proj/up_proj/down_proj`,
Mixtral's `w1/w3/w2`, or transformers' fused 3-D tensors) go to that layer's fused-MoE module, whose own
loader maps them through vLLM's expert-params mapping (and splits them over tensor-parallel ranks);
routers, shared experts and their gates are plain parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from ..model.config import head_dim_of
from .parallel import replicate_kv_heads

LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
PACKED = {  # checkpoint module -> (vLLM module, shard id)
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),  # Qwen2-MoE's shared expert
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
}
EXPERTS = ".experts."  # in a parameter name: under an MoE layer's fused-MoE module (vLLM's MoERunner)
TOP_LEVEL = {
    "model.embed_tokens": "model.early.embed_tokens",
    "model.norm_swiftkv": "model.early.norm_swiftkv",
    "model.norm": "model.late.norm",
    "lm_head": "lm_head",
}
SKIP = object()  # a checkpoint tensor the vLLM model deliberately does not hold
TEACHER_ONLY = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
)

Route = tuple[str, "str | int | None"]


def split_suffix(name: str) -> tuple[str, str]:
    module, _, suffix = name.rpartition(".")
    return module, suffix


def route_layer(config, layer: int, module: str, suffix: str) -> Route | object:
    n = config.num_key_value_layers
    if module.endswith("rotary_emb"):
        return SKIP
    if layer < n:
        packed, shard = PACKED.get(module, (module, None))
        return f"model.early.layers.{layer}.{packed}.{suffix}", shard
    if module in TEACHER_ONLY:
        return SKIP  # the teacher's q/k/v (and q/k norms) of a later layer: unused by the SwiftKV path
    if module in ("self_attn.k_proj_swiftkv", "self_attn.v_proj_swiftkv", "self_attn.k_norm_swiftkv"):
        group, groups = config.group_of(layer), config.num_kv_groups
        if not config.is_kv_owner(layer):
            raise ValueError(
                f"checkpoint has {module} for layer {layer}, which does not own its AcrossKV group "
                f"(owner: layer {config.kv_owner(layer)}, key_value_group_size={config.key_value_group_size})"
            )
        if module == "self_attn.k_norm_swiftkv":
            return f"model.early.k_norm_swiftkv.{suffix}", group
        shard = group if module.startswith("self_attn.k") else groups + group
        return f"model.early.kv_proj_swiftkv.{suffix}", shard
    packed, shard = PACKED.get(module, (module, None))
    return f"model.late.layers.{layer - n}.{packed}.{suffix}", shard


def route(config, name: str) -> Route | object:
    """Where checkpoint tensor `name` goes: (parameter name, shard id) or SKIP."""
    module, suffix = split_suffix(name)
    if module == "lm_head" and config.tie_word_embeddings:
        return SKIP
    if module in TOP_LEVEL:
        return f"{TOP_LEVEL[module]}.{suffix}", None
    match = LAYER_NAME.match(name)
    if match is None:
        raise ValueError(f"unexpected tensor {name!r} in the SwiftKV checkpoint: expected model.*, lm_head.*")
    layer = int(match.group(1))
    if layer >= config.num_hidden_layers:
        raise ValueError(
            f"tensor {name!r} names layer {layer}, but the config has {config.num_hidden_layers} layers"
        )
    module, suffix = split_suffix(match.group(2))
    return route_layer(config, layer, module, suffix)


def load_experts(model: torch.nn.Module, name: str, param_name: str, tensor: torch.Tensor) -> set[str]:
    """Checkpoint tensor `name`, one expert's (`...<mlp>.experts.<rest>`), into its layer's fused-MoE module,
    through that module's own `load_weights` (vLLM's expert-params mapping); returns the model parameters it
    set (none on a rank that holds no share of that expert, under expert parallelism)."""
    module_name, _, rest = param_name.partition(EXPERTS)
    runner_name = f"{module_name}.experts"
    try:
        runner = model.get_submodule(runner_name)
    except AttributeError:
        raise ValueError(
            f"checkpoint tensor {name!r} is an expert's, but this model has no MoE block at {module_name!r}"
        ) from None
    return {f"{runner_name}.{loaded}" for loaded in runner.load_weights([(rest, tensor)])}


def load_swiftkv_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Load checkpoint tensors into `model` (a SwiftKVForCausalLM); returns the parameters set."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # routing needs no vLLM

    params = dict(model.named_parameters())
    replicas = model.model.heads.kv_replicas  # tp > KV heads: each KV head is held by several ranks
    loaded: set[str] = set()
    for name, tensor in weights:
        target = route(model.config, name)
        if target is SKIP:
            continue
        param_name, shard = target
        if ".kv_proj_swiftkv." in param_name:
            tensor = replicate_kv_heads(tensor, head_dim_of(model.config), replicas)
        if EXPERTS in param_name:
            loaded |= load_experts(model, name, param_name, tensor)
            continue
        if param_name not in params:
            raise ValueError(
                f"checkpoint tensor {name!r} maps to {param_name!r}, which this model does not have"
            )
        param = params[param_name]
        if shard is None:
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        else:
            param.weight_loader(param, tensor, shard)
        loaded.add(param_name)
    return loaded
