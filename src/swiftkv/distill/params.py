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

from .trainer import trained_parameters


def save_swiftkv_params(model: torch.nn.Module, folder: str | os.PathLike, base: str,
                        dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the trained SwiftKV tensors of `model` (a few MB) and their geometry into `folder`;
    each file is written beside its final name and then renamed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(dtype).contiguous() for name, p in trained_parameters(model).items()}
    if not tensors:
        raise ValueError("the model has no SwiftKV parameters (q/k/v_proj_swiftkv, norm_swiftkv) to save")
    spec = {"base": base, "num_key_value_layers": model.config.num_key_value_layers,
            "key_value_group_size": model.config.key_value_group_size}
    tmp = folder / f".swiftkv.safetensors.tmp-{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / "swiftkv.safetensors")
    tmp_json = folder / f".swiftkv.json.tmp-{os.getpid()}"
    tmp_json.write_text(json.dumps(spec, indent=2) + "\n")
    os.replace(tmp_json, folder / "swiftkv.json")
    return folder
