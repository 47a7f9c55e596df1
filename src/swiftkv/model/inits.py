"""The reference inits of the SwiftKV attention tensors, from the teacher's weights by name (ArcticTraining's
"copy" and "mean"): the building block every family's init uses, and the init of grouped-query attention."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def mean_linear(
    name: str, sources: list[str], weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The mean of the linear layers (or norms) named `sources` (weight, and bias where they have one) as
    `name`."""
    out = {f"{name}.weight": torch.stack([weights[f"{s}.weight"] for s in sources]).mean(0)}
    if f"{sources[0]}.bias" in weights:
        out[f"{name}.bias"] = torch.stack([weights[f"{s}.bias"] for s in sources]).mean(0)
    return out


def grouped_init_tensors(
    config, weights: Mapping[str, torch.Tensor], average_group: bool
) -> dict[str, torch.Tensor]:
    """Grouped-query attention's init: q <- the layer's q_proj; k/v <- the owner's k/v_proj (`average_group`: the
    group's mean, the reference's "mean" init). Per-head q/k norms (Qwen3): q_norm_swiftkv <- q_norm;
    k_norm_swiftkv <- the group's mean k_norm under either init (the reference's; a group shares one K, so one
    norm)."""
    g = config.key_value_group_size
    params = {}
    for i in config.later_layers:
        prefix = f"model.layers.{i}.self_attn"
        params.update(mean_linear(f"{prefix}.q_proj_swiftkv", [f"{prefix}.q_proj"], weights))
        qk_norm = f"{prefix}.q_norm.weight" in weights
        if qk_norm:
            params[f"{prefix}.q_norm_swiftkv.weight"] = weights[f"{prefix}.q_norm.weight"].clone()
        if config.is_kv_owner(i):
            if qk_norm:
                norms = [weights[f"model.layers.{j}.self_attn.k_norm.weight"] for j in range(i, i + g)]
                params[f"{prefix}.k_norm_swiftkv.weight"] = torch.stack(norms).mean(0)
            members = range(i, i + g) if average_group else range(i, i + 1)
            for name in ("k_proj", "v_proj"):
                sources = [f"model.layers.{j}.self_attn.{name}" for j in members]
                params.update(mean_linear(f"{prefix}.{name}_swiftkv", sources, weights))
    return params
