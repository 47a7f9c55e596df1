"""The committed-weights format: only the trained SwiftKV tensors of a distilled model.

`<folder>/swiftkv.safetensors` holds `model.layers.{i}.self_attn.{q,k,v}_proj_swiftkv.weight` (+ bias)
and `model.norm_swiftkv.weight`; `<folder>/swiftkv.json` names the base model and the geometry.
`swiftkv.sources` rebuilds a complete SwiftKV folder from the base model plus these tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..modeling import swiftkv_parameters
from ..sources import atomic_file, write_atomic


def save_swiftkv_params(model: torch.nn.Module, folder: str | os.PathLike, base: str,
                        dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the trained SwiftKV tensors of `model` (a few MB) and their geometry into `folder`;
    each file is written beside its final name and then renamed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(dtype).contiguous() for name, p in swiftkv_parameters(model).items()}
    if not tensors:
        raise ValueError("the model has no SwiftKV parameters (q/k/v_proj_swiftkv, norm_swiftkv) to save")
    spec = {"base": base, "num_key_value_layers": model.config.num_key_value_layers,
            "key_value_group_size": model.config.key_value_group_size}
    with atomic_file(folder / "swiftkv.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    write_atomic(folder / "swiftkv.json", json.dumps(spec, indent=2) + "\n")
    return folder
