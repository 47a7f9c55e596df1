"""The sharded start of `--fsdp`: no process ever holds the whole model, only its own shards.

The student is built on the meta device (shapes, no memory: `meta_student`), takes its trainable set and
the compute dtype there, and is sharded by FSDP2 (`sharding.shard`) as a loaded model would be. Each
process then materialises its shards alone (`to_empty`) and fills them (`fill_shards`): the rows of every
parameter that it owns (`sharding.owned_rows`), read from the folder's weight files, those rows and no
others (`FolderTensors.rows`). What a run computes rather than reads comes from rows too: --init copy/mean
average the same rows of the teacher weights they start from (a SwiftKV projection has its teacher
projection's shape), and the adapters' factors are drawn whole (they are small) and sliced. The rotary frequencies, the one kind
of buffer the families have, are in no checkpoint: transformers' own init recomputes them, as its
`from_pretrained` does.

Every value equals the whole load's (`sources.load_model` in fp32, the init, the trainable set, frozen
weights cast to the compute dtype) bit for bit, sliced to the shard (tests/test_sharded_start.py).
`torch.distributed.checkpoint.state_dict.set_model_state_dict(broadcast_from_rank0=True)` would start a
sharded model too, but from the whole model on process 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

from ...model.families import family_of
from ...model.surgery import copy_init_tensors
from ...sources import Source, check_supported, check_weights_present
from ...tensorfiles import FolderTensors
from ..core.trainable import initial_adapters, unwrapped_name
from ..parallel.sharding import owned_rows
from ..parallel.world import World
from ..settings import REDERIVED_INITS, DistillSettings


def meta_student(source: Source) -> nn.Module:
    """The model of the source folder built on the meta device (`meta_model`). The folder must hold
    weights, as for a whole load."""
    check_supported(source.folder)
    check_weights_present(source.folder)
    return meta_model(AutoConfig.from_pretrained(source.folder))


def meta_model(config) -> nn.Module:
    """The model of `config` (plain or SwiftKV: the class `from_pretrained` would pick) on the meta device,
    in eval mode: parameters with shapes and dtypes and no memory, in fp32 as the whole load holds them
    whatever dtype a folder stores (a sharded start casts them as a loaded model is cast)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def fill_shards(distiller: nn.Module, model: nn.Module, settings: DistillSettings, world: World) -> None:
    """`distiller` (sharded on the meta device, holding `model`) materialised on this process's device,
    every parameter's local shard filled with its rows: read from `settings.model.source`'s files, or computed
    (`computed_rows`: the re-derived init, the adapters)."""
    distiller.to_empty(device=world.device)
    stored = StoredParameters(FolderTensors(settings.model.source.folder), model.config)
    computed = computed_rows(model, settings, stored, world)
    for name, parameter in model.named_parameters():
        if not isinstance(parameter, DTensor):
            raise TypeError(f"{name} is not sharded: fill_shards runs after sharding.shard")
        local = parameter.to_local()
        start, stop = owned_rows(parameter.shape[0], world)
        if local.shape[0] != stop - start:
            raise RuntimeError(
                f"{name}: this process holds {local.shape[0]} rows, and rows {start}:{stop} were expected "
                "(FSDP2's split of dim 0, sharding.owned_rows)"
            )
        if start < stop:
            local.copy_(
                computed[name] if name in computed else stored.rows(unwrapped_name(model, name), start, stop)
            )
    restore_buffers(model)


def computed_rows(
    model: nn.Module, settings: DistillSettings, stored: StoredParameters, world: World
) -> dict[str, torch.Tensor]:
    """This process's rows of the parameters a run starts from computed values, by name: the SwiftKV
    parameters of --init copy/mean (`copy_init_tensors` over the same rows of the teacher weights) and the
    adapters' factors (`trainable.initial_adapters`, drawn whole)."""
    values = {}
    if settings.model.init in REDERIVED_INITS:
        teacher = OwnedRows(stored, world)
        values |= copy_init_tensors(model.config, teacher, average_group=settings.model.init == "mean")
    for name, factor in initial_adapters(model, settings.optim.seed).items():
        start, stop = owned_rows(factor.shape[0], world)
        values[name] = factor[start:stop]
    return values


class OwnedRows(Mapping):
    """The stored parameters by name, each as this process's rows of it in fp32 (what a whole load in
    fp32 holds there, and what the init computes in)."""

    def __init__(self, stored: StoredParameters, world: World):
        self.stored, self.world = stored, world

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.stored.rows(name, *owned_rows(self.stored.length(name), self.world)).float()

    def __contains__(self, name) -> bool:  # asked without reading (Mapping's own would read the rows)
        return name in self.stored.names

    def __iter__(self):
        return iter(self.stored.names)

    def __len__(self) -> int:
        return len(self.stored.names)


class StoredParameters:
    """A folder's tensors by the model's parameter names, read by rows, in their stored dtype: a shard is
    cast once, as it is copied in (a float cast is the same through fp32, which the whole load takes, or
    straight). Most parameters are stored under their own names. An MoE family stores its experts one
    tensor per expert (Mixtral's under `block_sparse_moe`), which transformers renames and fuses into
    [experts, ...] parameters as it loads them, through its checkpoint conversion mapping
    (`families.checkpoint_layout`): the same mapping says which stored tensors make each expert's rows."""

    def __init__(self, tensors: FolderTensors, config):
        self.tensors = tensors
        self.names = {name: name for name in tensors}  # parameter name -> stored name
        # fused parameter -> expert -> the stored names concatenated into it, in order
        self.experts: dict[str, dict[int, list[str]]] = {}
        layout = family_of(config.model_type).checkpoint_layout
        if layout is not None:
            self.map_expert_layout(layout)

    def map_expert_layout(self, base_type: str) -> None:
        """Each stored name through the mapping's renamings, then through the converter that fuses it, if
        any (the order transformers applies them in): a fused expert's parts, in its converter's order."""
        mapping = get_checkpoint_conversion_mapping(base_type)
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        renamings = [m for m in mapping if not isinstance(m, WeightConverter)]
        for converter in converters:
            check_fusion(converter, base_type)
        self.names = {}
        for stored in self.tensors:
            name = stored
            for renaming in renamings:
                name, _ = renaming.rename_source_key(name)
            for converter in converters:
                fused, pattern = converter.rename_source_key(name)
                if pattern is not None:
                    expert = int(re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), name).group(1))
                    parts = self.experts.setdefault(fused, {}).setdefault(
                        expert, [None] * len(converter.source_patterns)
                    )
                    parts[converter.source_patterns.index(pattern)] = stored
                    break
            else:
                self.names[name] = stored

    def length(self, name: str) -> int:
        """The parameter's dim 0: its stored tensor's, or its number of experts."""
        return (
            len(self.experts[name])
            if name in self.experts
            else self.tensors.entries[self.names[name]].shape[0]
        )

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name in self.experts:
            return torch.stack([self.expert(name, expert) for expert in range(start, stop)])
        if name not in self.names:
            raise ValueError(f"{self.tensors.folder} holds no tensor {name}, which the model needs")
        return self.tensors.rows(self.names[name], start, stop)

    def expert(self, name: str, expert: int) -> torch.Tensor:
        parts = self.experts[name][expert]
        if None in parts:
            raise ValueError(f"{self.tensors.folder} lacks a part of expert {expert} of {name}")
        return torch.cat([self.tensors[part] for part in parts])


def check_fusion(converter: WeightConverter, base_type: str) -> None:
    """The fusions `StoredParameters` reads: per-expert matrices stacked along a new dim 0
    (MergeModulelist(0)), then, with several source patterns, concatenated along their own dim 0
    (Concatenate(1) of the stacked tensors), as gate_up_proj is made of gate_proj and up_proj."""
    operations = [(type(op), op.dim) for op in converter.operations]
    expected = [(MergeModulelist, 0)] + ([(Concatenate, 1)] if len(converter.source_patterns) > 1 else [])
    if operations != expected:
        raise ValueError(
            f"{base_type}'s checkpoint layout fuses {converter.source_patterns} by {converter.operations}; the "
            "sharded start (--fsdp) reads experts stacked (and concatenated along their rows) only"
        )


def restore_buffers(model: nn.Module) -> None:
    """The buffers `to_empty` left uninitialised, recomputed by transformers' own init (`_init_weights`:
    the rotary frequencies, from the config, as `from_pretrained` computes them). Each is NaN until then,
    so a buffer that init does not recompute is an error rather than garbage in the run. Only modules that
    hold buffers and no parameters of their own are re-initialised: the init would redraw parameters."""
    for name, buffer in model.named_buffers():
        if not buffer.is_floating_point():
            raise ValueError(f"the sharded start (--fsdp) cannot initialise buffer {name} ({buffer.dtype})")
        buffer.fill_(float("nan"))
    for module in model.modules():
        holds_buffers = next(module.buffers(recurse=False), None) is not None
        if holds_buffers and next(module.parameters(recurse=False), None) is None:
            model._init_weights(module)
    left = [name for name, buffer in model.named_buffers() if buffer.isnan().any()]
    if left:
        raise ValueError(
            f"the sharded start (--fsdp) cannot initialise buffers {left[:3]}: they are in no checkpoint"
        )
