"""What a distillation run trains (`--trainable`): the SwiftKV parameters, and optionally student-only
weights in the later layers.

  swiftkv     q/k/v_proj_swiftkv and norm_swiftkv only (the paper: the original weights stay frozen)
  lora        + low-rank adapters (rank `--lora-rank`) on the later layers' o_proj and MLP projections
  late        + a trainable copy of the later layers' o_proj and MLP
  late-norms  + `late`, and copies of their input / post-attention norms

The teacher and the student share one model in memory (layers < N run once for both), so a later-layer
weight cannot simply be unfrozen: the teacher would drift with it. Each extra weight is wrapped instead:
the wrapper runs the frozen original on the teacher path and the student's own version on the student
path (`swiftkv.model.modeling.on_student_path`). When the distilled folder is written, the student's
versions are merged under the original names (`student_weights`), so vLLM, transformers and the
reference project's code load it unchanged; its config names what was trained
(`swiftkv_student_trained`), because the folder no longer contains its teacher.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ...model.families import family_of
from ...model.modeling import on_student_path, swiftkv_parameters
from ...model.surgery import load_trained

TRAINABLE_SETS = ("swiftkv", "lora", "late", "late-norms")
DEFAULT_LORA_RANK = 16
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# Later-layer modules each set trains for the student, by their name inside a decoder layer (the
# names recorded in a distilled folder's `swiftkv_student_trained`).
STUDENT_MODULES = {
    "swiftkv": (),
    "lora": ("self_attn.o_proj", "mlp"),
    "late": ("self_attn.o_proj", "mlp"),
    "late-norms": ("self_attn.o_proj", "mlp", "input_layernorm", "post_attention_layernorm"),
}


class LowRankAdapter(nn.Module):
    """base(x) on the teacher path; base(x) + B(A(x)) on the student path. Its factors start as
    `initial_adapters` draws them (B at zero, so the student starts exactly where the SwiftKV parameters
    alone put it)."""

    def __init__(self, base: nn.Linear, rank: int):
        super().__init__()
        self.base = base
        device = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, dtype=torch.float32, device=device))
        self.lora_b = nn.Parameter(torch.empty(base.out_features, rank, dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if on_student_path():
            out = out + nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b)
        return out


class StudentCopy(nn.Module):
    """The frozen original on the teacher path, a trainable copy of it on the student path."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.original = original
        self.copy = copy.deepcopy(original).float()

    def forward(self, *args, **kwargs):
        return (self.copy if on_student_path() else self.original)(*args, **kwargs)


STUDENT_WRAPPERS = (LowRankAdapter, StudentCopy)
COPY = ".copy."  # StudentCopy's name for its trained module: layer.mlp.copy.up_proj.weight
LORA_B = ".lora_b"  # an adapter's second factor
LORA_A = ".lora_a"  # its first, beside it


def max_lora_rank(config) -> int:
    """The widest rank that is still low: the narrowest side of any adapted projection."""
    return min(config.hidden_size, config.intermediate_size)


def check_trainable(trainable: str, lora_rank: int | None, config) -> None:
    """Refuse an unknown set or a rank that is not a low rank of the adapted layers (before any work)."""
    if trainable not in TRAINABLE_SETS:
        raise ValueError(f"--trainable {trainable!r} is unknown; expected one of {list(TRAINABLE_SETS)}")
    refusal = family_of(config.model_type).mlp_training_refusal(config)
    if STUDENT_MODULES[trainable] and refusal:
        raise ValueError(
            f"--trainable {trainable} trains the later layers' MLP, but {refusal}; use --trainable swiftkv"
        )
    if lora_rank is None:
        return
    if trainable != "lora":
        raise ValueError(
            f"--lora-rank {lora_rank} applies to --trainable lora only (got --trainable {trainable})"
        )
    high = max_lora_rank(config)
    if not 1 <= lora_rank <= high:
        raise ValueError(
            f"--lora-rank {lora_rank} is out of range; expected 1 <= rank <= {high} (the narrowest "
            "width of the later layers' o_proj and MLP projections)"
        )


def install(
    model: nn.Module, trainable: str, lora_rank: int | None = None, seed: int = 0
) -> dict[str, nn.Parameter]:
    """Wrap the later layers' student-only weights of `trainable` and freeze everything else. Returns
    the trained parameters by name (SwiftKV parameters first); the optimizer and checkpoints use it.
    Adapters start from `seed` (`initial_adapters`); on a model built on the meta device (a sharded
    start) they stay empty until each process fills its rows of them (distill/start/sharded.py)."""
    check_trainable(trainable, lora_rank, model.config)
    if any(isinstance(module, STUDENT_WRAPPERS) for module in model.modules()):
        raise ValueError(
            "a trainable set is already installed in this model; install one per run, on a fresh model"
        )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    rank = lora_rank or DEFAULT_LORA_RANK
    for i in model.config.later_layers:
        layer = model.model.layers[i]
        for module_name in STUDENT_MODULES[trainable]:
            wrap_module(layer, module_name, trainable, rank)
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, factor in initial_adapters(model, seed).items():
            if not parameters[name].is_meta:
                parameters[name].copy_(factor)
    trained = swiftkv_parameters(model)
    trained.update(
        {name: p for name, p in model.named_parameters() if p.requires_grad and name not in trained}
    )
    for parameter in trained.values():
        parameter.requires_grad_(True)
    return trained


def wrap_module(layer: nn.Module, module_name: str, trainable: str, rank: int) -> None:
    parent_name, _, leaf = module_name.rpartition(".")
    parent = layer.get_submodule(parent_name) if parent_name else layer
    original = getattr(parent, leaf)
    if trainable != "lora":
        setattr(parent, leaf, StudentCopy(original).requires_grad_(True))
        original.requires_grad_(False)
        return
    linears = [(parent, leaf)] if leaf == "o_proj" else [(original, name) for name in MLP_PROJECTIONS]
    for owner, name in linears:
        adapter = LowRankAdapter(getattr(owner, name), rank)
        adapter.base.requires_grad_(False)
        setattr(owner, name, adapter)


def initial_adapters(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every adapter's starting factors by parameter name, whole, on the host (adapters are small): A as
    nn.Linear's own init (kaiming uniform, as LoRA does), B zero. They are drawn from `seed` (the run's,
    not the process's random state) in the model's module order, so every process of a sharded run, and
    every run of the same settings, starts from the same adapters."""
    generator = torch.Generator().manual_seed(seed)
    factors = {}
    for name, module in model.named_modules():
        if isinstance(module, LowRankAdapter):
            lora_a = torch.empty(module.lora_a.shape, dtype=torch.float32, device="cpu")
            nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5), generator=generator)
            factors[name + LORA_A] = lora_a
            factors[name + LORA_B] = torch.zeros(module.lora_b.shape, dtype=torch.float32, device="cpu")
    return factors


def unwrapped_name(model: nn.Module, name: str) -> str:
    """A parameter's name in the model without the trainable set's wrappers: the name its weight is
    stored under in the source folder (layer.mlp.copy.up_proj.weight and layer.mlp.original.up_proj.weight
    are layer.mlp.up_proj.weight; an adapter's base.weight is its projection's weight)."""
    module, kept = model, []
    for part in name.split("."):
        if not isinstance(module, STUDENT_WRAPPERS):
            kept.append(part)
        module = getattr(module, part)
    return ".".join(kept)


def load_trained_set(
    model: nn.Module, trained: dict[str, nn.Parameter], tensors: dict[str, torch.Tensor], where
) -> None:
    """Copy saved tensors (a student snapshot's, a weights folder's) into `model`'s installed trainable set
    (`trained`, by name): exactly that set (no tensor missing or extra), each of its parameter's shape
    (`surgery.load_trained` checks those)."""
    missing = sorted(set(trained) - set(tensors))
    if missing:
        raise ValueError(f"{where}: it lacks trained tensors of this run's student: {missing[:3]}")
    load_trained(model, tensors, trained)


def student_weights(
    trained: dict[str, torch.Tensor], source: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The student's versions of the wrapped weights, merged, under the original parameter names (what a
    distilled folder holds for them). `trained`: the run's trained tensors by parameter name (whole: a
    sharded run gathers them first); `source`: the unwrapped source model's state dict, in the dtype it
    was stored in (`merged_student_weights` says how they merge)."""
    whole = {name: (lambda tensor=tensor: tensor) for name, tensor in trained.items()}
    return {name: merge() for name, merge in merged_student_weights(whole, source).items()}


def merged_student_weights(
    trained: Mapping[str, Callable[[], torch.Tensor]], source: Mapping[str, torch.Tensor]
) -> dict[str, Callable[[], torch.Tensor]]:
    """`student_weights`, each merged only when it is called: `trained` gives each trained tensor whole
    when called (a sharded run gathers it then), `source` the source's stored weights (read when
    indexed), so a folder is written one merged weight at a time. A copy's tensors are the weights; an
    adapter's factors are added onto the source's own weight, not onto the run's frozen copy: a bf16
    run casts that copy for compute, and its rounding would make the folder differ from the source at
    full rank, not by B @ A."""
    weights = {}
    for name, whole in trained.items():
        if COPY in name:  # layer.mlp.copy.up_proj.weight -> layer.mlp.up_proj.weight
            path, _, leaf = name.partition(COPY)
            weights[f"{path}.{leaf}"] = lambda whole=whole: whole().detach().float()
        elif name.endswith(LORA_B):
            path = name.removesuffix(LORA_B)
            factor_a = trained[path + LORA_A]

            def merge(path=path, factor_b=whole, factor_a=factor_a) -> torch.Tensor:
                delta = factor_b().detach().float() @ factor_a().detach().float()
                return source[f"{path}.weight"].float() + delta

            weights[f"{path}.weight"] = merge
    return weights


def merge_trained(model: nn.Module, trained: dict[str, torch.Tensor], trainable: str) -> None:
    """Put a run's trained tensors (whole, by parameter name) into `model`, a fresh SwiftKV model of the
    run's source with no trainable set installed: the SwiftKV parameters as they are, the student-only
    weights merged under their original names (`student_weights`), the config marked as a distilled
    student (`swiftkv=True`; `swiftkv_student_trained` when its later layers were trained too)."""
    own = swiftkv_parameters(model)
    merged = student_weights(trained, model.state_dict())
    load_trained(model, {name: tensor for name, tensor in trained.items() if name in own}, own)
    if merged:
        load_trained(model, merged, dict(model.named_parameters()))
    mark_distilled(model.config, trainable, bool(merged))


def mark_distilled(config, trainable: str, merged: bool) -> None:
    """A distilled student's config: `swiftkv=True`, and `swiftkv_student_trained` naming what its later
    layers trained when student-only weights were `merged` in (it no longer contains its teacher)."""
    if merged:
        config.swiftkv_student_trained = list(STUDENT_MODULES[trainable])
    config.swiftkv = True
