"""Sharded distillation with PyTorch's FSDP2 (`fully_shard`), for models one device cannot hold.

Units: each decoder layer is one; so are the embeddings when the head does not share them, and each
AcrossKV group owner's SwiftKV K/V projections (called outside their layer's forward). The root
unit is the distiller itself and holds what is left: the head, the final norm, norm_swiftkv (and the
embeddings when they are tied to the head: shared weights must live in one unit). The root keeps its
weights gathered from its forward until the backward ends (FSDP2 does not reshard the root after
forward), which the chunked loss needs: it calls the head once per chunk of rows, a number that
differs between processes, outside any forward hook, so no collective depends on it.

Every process must make the same collective calls in the same order: each runs the same number of
micro-batches and held-out forwards (distill/core/trainer.py pads the held-out split and gives a
micro-batch without trained rows one zero-weight row).

Frozen teacher weights are sharded in the compute dtype (cast before sharding); the trained ones
keep an fp32 master shard and, with bf16 compute, are gathered in bf16 (`MixedPrecisionPolicy`),
their gradients reduced in fp32. The trained tensors of a checkpoint are gathered through
torch.distributed.checkpoint's state-dict helpers; those of the output folder one at a time, each when
it is written (`whole_tensor`), so no process holds more than its shards and one whole tensor.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed._composable import checkpoint as checkpoint_activations
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ...model.modeling import on_student_path, student_path
from .world import World

ROOT_PREFIX = "model."  # the distiller's name for the model: stripped from the gathered tensors' names


def checkpoint_layers(model: nn.Module) -> None:
    """Each decoder layer recomputes its activations in the backward (--activation-checkpointing). The
    composable form keeps parameter names, unlike a wrapper module, so checkpoints and the output folder
    are the same either way; layers < N run without grad and are not affected."""
    for layer in model.model.layers:
        checkpoint_activations(layer, context_fn=same_path_on_recompute)


def same_path_on_recompute():
    """(forward context, recompute context): the recomputation runs in the backward, outside the
    student's `student_path()` block, so it re-enters it when the forward ran there; otherwise the
    student-only weights of `--trainable lora|late` would recompute on the teacher's path."""
    return contextlib.nullcontext(), (student_path() if on_student_path() else contextlib.nullcontext())


def shard(distiller: nn.Module, world: World, compute_dtype: torch.dtype) -> nn.Module:
    """`distiller` (a SharedPrefixDistiller) sharded in place over the world's processes; returns it."""
    model = distiller.model
    mesh = init_device_mesh(world.device.type, (world.size,))
    policy = (
        MixedPrecisionPolicy()
        if compute_dtype == torch.float32
        else MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    )
    for layer in model.model.layers:
        owned = kv_projections(layer)
        if owned:
            fully_shard(owned, mesh=mesh, mp_policy=policy)
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    if not tied_embeddings(model):
        fully_shard(model.model.embed_tokens, mesh=mesh, mp_policy=policy)
    fully_shard(distiller, mesh=mesh, mp_policy=policy)
    return distiller


def kv_projections(layer: nn.Module) -> list[nn.Module]:
    """A group owner's SwiftKV K/V modules (MLA: its latent's). The model calls them for every token before the later layers
    run (`swiftkv_key_values`), outside the layer's own forward, so they are a unit of their own that
    gathers when they are called."""
    attention = layer.self_attn
    names = getattr(attention, "swiftkv_group_modules", ())
    return [getattr(attention, name) for name in names if hasattr(attention, name)]


def owned_rows(length: int, world: World) -> tuple[int, int]:
    """(start, stop) of the rows of a dim 0 of `length` that this process holds: FSDP2 splits dim 0 as
    torch.chunk does, in chunks of ceil(length / size), the last ones shorter or empty."""
    chunk = -(-length // world.size)
    start = min(world.rank * chunk, length)
    return start, min(start + chunk, length)


def tied_embeddings(model: nn.Module) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


@torch.no_grad()
def whole_tensor(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter whole: a sharded one (DTensor) gathered from every process, so every process must
    call this for the same parameters in the same order; any other is returned as it is."""
    return parameter.full_tensor() if isinstance(parameter, DTensor) else parameter.detach()
