"""Memory and time plan of a distillation run, before anything is loaded or converted: bytes per process,
whether they fit the memory a process has (and, if not, by how much and which settings would fit), and the
time on this machine's device (`speed.time_plan`).

The model is built on the meta device from its config alone (`SRC` may be a folder holding only a SwiftKV
`config.json`, or a plain HF config, converted as `swiftkv convert` would at --num-key-value-layers, default
L/2), with the run's trainable set installed, so every count is the run's own: frozen weights
in the compute dtype (cast once), trained parameters as fp32 masters, their fp32 gradients and AdamW's
two fp32 moments. Under FSDP each of those is divided by the world size, and the units being gathered
come on top: the root (head, norms, tied embeddings), held from forward to backward, and two decoder
layers (the one computing and the one prefetched). DDP keeps a second fp32 copy of the gradients in its
reduction buckets.

Activations, per token of a micro-batch (B x S), with `a` the compute dtype's bytes: the student's later
layers keep what their backward reads: two RMSNorms (their fp32 input and output in `a`: 2 x (4 + a) H),
attention's query and output (2aH), the MLP's gate, up, activation and product (4aI, I the width a token's
pass spans: an MoE block's routed experts and shared expert, which also keeps its router's logits and
probabilities ((a + 4) E) and the routed copies of its input (k aH)); each AcrossKV group
keeps its K and V (2a KV; under DeepSeek's latent attention its latent and every head's K and V), and
norm_swiftkv(h_N) its input and output ((4 + a) H). With activation
checkpointing a later layer keeps only its input (aH) and one layer is recomputed at a time. The teacher
and the early layers run without grad: one layer's intermediates at a time. On a CPU, masked attention takes the math path,
which keeps each later layer's attention probabilities (heads x S per token); CUDA's kernels keep none. The
attention masks of a packed block (B x S x S in `a`, teacher and student), the final hidden rows of both
models and, during the loss, which runs before the model's backward, its vocabulary chunk (`--chunk-rows` x
V in fp32: the student's and the teacher's logits, their log-softmaxes and the gradient) come on top. Worst
case: every position is trained.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoConfig

from ...dtypes import DTYPE_NAMES, resolve_dtype
from ...files import write_atomic
from ...flops import attention_counts, mlp_token_width
from ...hub import CONFIG_FILES
from ...model.config import is_sparse_layer, is_swiftkv, routed_experts
from ...model.surgery import swiftkv_config
from ...sources import Source, SourceLike, resolve_source
from ..core import microbatch, trainable
from ..core.microbatch import AUTO
from ..parallel.world import training_device
from ..start import sharded
from .speed import TIMED_STEPS, time_plan

GIB = 2**30
LOSS_CHUNK_COPIES = 5  # fp32 [chunk, V]: student and teacher logits, their log-softmaxes, the gradient
GATHERED_LAYERS = 2  # FSDP: the layer computing and the one prefetched
MAX_PLANNED_WORLD = 4096  # processes the fit search tries, doubling


@dataclass
class MemoryPlan:
    """Bytes per process, in GiB."""

    mode: str  # "ddp" (every process holds everything) or "fsdp"
    world_size: int
    weights: float  # frozen (teacher) weights, in the compute dtype
    gathered: float  # FSDP: the units gathered at once (root + two layers); DDP: 0
    trained: float  # fp32 masters of the trained parameters
    gradients: float  # fp32 gradients (DDP: and its reduction buckets)
    optimizer: float  # AdamW's two fp32 moments
    activations: float  # what one micro-batch keeps for its backward, plus its largest transient
    total: float

    def lines(self) -> list[str]:
        """One line; in MiB when the total is under 1 GiB (a small model's plan would read 0.00 GiB)."""
        parts = ("weights", "gathered", "trained", "gradients", "optimizer", "activations", "total")
        scale, unit = (1, "GiB") if self.total >= 1 else (1024, "MiB")
        return [
            f"{self.mode} x {self.world_size}: "
            + ", ".join(f"{name} {getattr(self, name) * scale:.2f}" for name in parts)
            + f" {unit} per process"
        ]


def plan_config(
    source: SourceLike,
    num_key_value_layers: int | None,
    key_value_group_size: int | None,
    revision: str | None = None,
):
    """The SwiftKV config a plan is for: SRC's own (a converted folder, or a folder holding only its
    config.json), or a plain HF config (a folder, a `config.json` path or a Hub repo id at `revision`, whose
    config alone is fetched: no weights needed) converted at `num_key_value_layers` (default L/2) and
    `key_value_group_size` (default 1), as `swiftkv convert` would."""
    path = Path(str(source))
    if path.suffix == ".json" and path.is_file():
        config_file = path
    elif isinstance(source, Source):
        config_file = source.folder
    else:
        config_file = resolve_source(source, revision, files=CONFIG_FILES)
    config = AutoConfig.from_pretrained(str(config_file))
    if is_swiftkv(config):
        given = {
            "--num-key-value-layers": num_key_value_layers,
            "--key-value-group-size": key_value_group_size,
        }
        own = {
            "--num-key-value-layers": config.num_key_value_layers,
            "--key-value-group-size": config.key_value_group_size,
        }
        for option, value in given.items():
            if value is not None and value != own[option]:
                raise ValueError(
                    f"--plan: {source} is a SwiftKV config with {option} {own[option]}; drop {option} {value} "
                    "(it plans a plain config's conversion)"
                )
        return config
    layers = config.num_hidden_layers
    n = layers // 2 if num_key_value_layers is None else num_key_value_layers
    return swiftkv_config(config, n, key_value_group_size or 1)


def model_parameters(source: SourceLike) -> int:
    """The parameters of SRC's model (a converted folder, or a plain HF config as `plan_config` reads it),
    counted on the meta device from its config alone: no weights are read."""
    model = sharded.meta_model(plan_config(source, None, None))
    return sum(parameter.numel() for parameter in model.parameters())


def meta_model(config, trainable_set: str, lora_rank: int | None):
    """The SwiftKV model of `config` on the meta device, with the run's trainable set installed."""
    model = sharded.meta_model(config)
    trainable.install(model, trainable_set, lora_rank)
    return model


def memory_plan(
    model,
    world_size: int,
    fsdp: bool,
    seq_len: int,
    micro_batch: int,
    dtype: torch.dtype,
    chunk_rows: int,
    activation_checkpointing: bool,
    device: str = "cuda",
) -> MemoryPlan:
    a = torch.finfo(dtype).bits // 8
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shards = world_size if fsdp else 1
    gathered = 0.0
    if fsdp and world_size > 1:
        layer = max(sum(p.numel() for p in block.parameters()) for block in model.model.layers)
        in_layers = sum(p.numel() for p in model.model.layers.parameters())
        root = frozen + trained - in_layers
        gathered = (root + GATHERED_LAYERS * layer) * a * (1 - 1 / world_size)
    buckets = 2 if not fsdp and world_size > 1 else 1
    plan = MemoryPlan(
        mode="fsdp" if fsdp else "ddp",
        world_size=world_size,
        weights=frozen * a / shards / GIB,
        gathered=gathered / GIB,
        trained=trained * 4 / shards / GIB,
        gradients=buckets * trained * 4 / shards / GIB,
        optimizer=2 * trained * 4 / shards / GIB,
        activations=activation_bytes(
            model.config, seq_len, micro_batch, a, chunk_rows, activation_checkpointing, device
        )
        / GIB,
        total=0.0,
    )
    plan.total = (
        plan.weights + plan.gathered + plan.trained + plan.gradients + plan.optimizer + plan.activations
    )
    return plan


def activation_bytes(
    config,
    seq_len: int,
    micro_batch: int,
    a: int,
    chunk_rows: int,
    activation_checkpointing: bool,
    device: str,
) -> float:
    """See the module docstring."""
    tokens = seq_len * micro_batch
    hidden = config.hidden_size
    saved = [layer_saved_bytes(config, i, a, seq_len, device) for i in config.later_layers]
    shared = config.num_kv_groups * a * group_kv_values(config) + (4 + a) * hidden
    kept = (len(saved) * a * hidden + max(saved)) if activation_checkpointing else sum(saved)
    masks = 2 * micro_batch * seq_len * seq_len * a
    rows = tokens * 2 * a * hidden  # the final hidden rows of teacher and student
    loss_chunk = (
        LOSS_CHUNK_COPIES * 4 * min(chunk_rows, tokens) * config.vocab_size
    )  # beside the kept activations
    return tokens * (kept + shared) + rows + masks + loss_chunk


def group_kv_values(config) -> int:
    """Values per token an AcrossKV group keeps for its layers' backward (its family's kind of attention)."""
    return attention_counts(config).group_kv_values(config)


def layer_saved_bytes(config, layer: int, a: int, seq_len: int, device: str) -> int:
    """Bytes per token that later layer `layer` keeps for its backward (see the module docstring). An MoE
    block's gated activations span the experts a token is routed to (`mlp_token_width`), and it also keeps
    the router's logits and probabilities and each routed copy of its input."""
    hidden = config.hidden_size
    saved = 2 * (4 + a) * hidden + 2 * a * hidden + 4 * a * mlp_token_width(config, layer)
    if is_sparse_layer(config, layer):
        saved += (a + 4) * routed_experts(config) + config.num_experts_per_tok * a * hidden
    if device == "cpu":  # the math path of masked attention keeps each layer's probabilities
        saved += config.num_attention_heads * seq_len * a
    return saved


@dataclass(frozen=True)
class PlanRequest:
    """What `--plan` was asked beside the run's settings."""

    world_size: int = 1
    device: str = "cuda"  # the device the memory is planned for
    num_key_value_layers: int | None = None  # a plain config's conversion
    key_value_group_size: int | None = None
    device_memory_gib: float | None = None  # per process; default: this GPU's, or the shared RAM's share
    timed_steps: int = TIMED_STEPS  # of the time plan on this machine's device (0: no time plan)


def plan_memory(model, settings, request: PlanRequest, dtype: torch.dtype, **changes) -> MemoryPlan:
    """`memory_plan` of the run's settings with `changes` (fsdp, micro_batch, activation_checkpointing,
    world_size)."""
    values = {
        "world_size": request.world_size,
        "fsdp": settings.parallel.fsdp,
        "micro_batch": settings.parallel.micro_batch,
        "activation_checkpointing": settings.parallel.activation_checkpointing,
        **changes,
    }
    return memory_plan(
        model,
        values["world_size"],
        values["fsdp"],
        settings.data.seq_len,
        values["micro_batch"],
        dtype,
        settings.loss.chunk_rows,
        values["activation_checkpointing"],
        request.device,
    )


@dataclass
class Fit:
    """Whether the run's plan fits its memory per process, by how much it misses, and what would fit."""

    capacity_gib: float | None  # None: nothing to check against (no GPU here and no --device-memory)
    against: str  # where the capacity comes from
    total_gib: float
    fits: bool | None
    would_fit: list[str]  # settings that would fit, each with its total

    @property
    def line(self) -> str:
        if self.capacity_gib is None:
            return f"fit: not checked ({self.against})"
        head = f"{self.total_gib:,.2f} GiB per process against {self.capacity_gib:,.2f} GiB ({self.against})"
        if self.fits:
            return f"fits: {head}, {self.capacity_gib - self.total_gib:,.2f} GiB to spare"
        return (
            f"does not fit: {head}, {self.total_gib - self.capacity_gib:,.2f} GiB over; would fit: "
            + "; ".join(self.would_fit)
        )


def capacity(request: PlanRequest) -> tuple[float | None, str]:
    """Memory per process (GiB) and where it comes from: --device-memory, this GPU's, or on a CPU the shared
    RAM's share of each process."""
    if request.device_memory_gib is not None:
        return request.device_memory_gib, "--device-memory"
    if request.device == "cuda":
        if not torch.cuda.is_available():
            return None, "no GPU here; give --device-memory GiB"
        total = torch.cuda.get_device_properties(0).total_memory / GIB
        return total, f"{torch.cuda.get_device_name(0)}'s memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return ram / request.world_size, f"{ram:,.1f} GiB of shared RAM over {request.world_size} process(es)"


def check_fit(model, settings, request: PlanRequest, dtype: torch.dtype, plan: MemoryPlan) -> Fit:
    limit, against = capacity(request)
    fits = None if limit is None else plan.total <= limit
    fit = Fit(limit, against, plan.total, fits, [])
    if fits is False:
        fit.would_fit = fitting_settings(model, settings, request, dtype, limit)
    return fit


def setting_changes(settings, request: PlanRequest) -> list[tuple[str, dict]]:
    """Each single change that lowers a process's memory: FSDP, activation checkpointing, each smaller
    micro-batch (a divisor of the run's)."""
    changes = []
    if not settings.parallel.fsdp and request.world_size > 1:
        changes.append(("--fsdp", {"fsdp": True}))
    if not settings.parallel.activation_checkpointing:
        changes.append(("--activation-checkpointing", {"activation_checkpointing": True}))
    micro = int(settings.parallel.micro_batch)
    changes += [(f"--micro-batch {m}", {"micro_batch": m}) for m in range(micro - 1, 0, -1) if micro % m == 0]
    return changes


def fitting_settings(model, settings, request: PlanRequest, dtype: torch.dtype, limit: float) -> list[str]:
    """The settings that would fit `limit`: every single change that does; else all of them together (with
    the smallest micro-batch); else the world size FSDP would need with all of them."""

    def total(**values) -> float:
        return plan_memory(model, settings, request, dtype, **values).total

    singles = setting_changes(settings, request)
    fitting = [(name, total(**values)) for name, values in singles]
    found = [f"{name} ({gib:,.2f} GiB)" for name, gib in fitting if gib <= limit]
    if found:
        return found
    kinds = {}  # one change of each kind; the micro-batches come largest first, so the smallest stays
    for name, values in singles:
        kinds[name.split()[0]] = (name, values)
    every = " ".join(name for name, _ in kinds.values())
    combined = {k: v for _, values in kinds.values() for k, v in values.items()}
    gib = total(**combined)
    if gib <= limit:
        return [f"{every} ({gib:,.2f} GiB)"]
    world = request.world_size
    while world < MAX_PLANNED_WORLD:
        world *= 2
        gib = total(**{**combined, "fsdp": True, "world_size": world})
        if gib <= limit:
            return [f"--fsdp over --world-size {world} with {every} ({gib:,.2f} GiB)"]
    return [f"nothing up to --world-size {MAX_PLANNED_WORLD} with --fsdp {every}"]


def auto_micro_batch(model, settings, request: PlanRequest, dtype: torch.dtype) -> int:
    """What `--micro-batch auto` would choose (`trainer.sized_micro_batch`): 1 under FSDP on a GPU, 2 blocks at
    most on a CPU, else the largest divisor of the per-process batch whose plan fits the memory (1 where there
    is no memory to check against)."""
    per_rank = max(1, settings.optim.batch_size // request.world_size)
    if request.device == "cpu":
        return microbatch.cpu_micro_batch(per_rank)
    limit, _ = capacity(request)
    if settings.parallel.fsdp or limit is None:
        return 1
    return microbatch.largest_fitting(
        per_rank,
        lambda size: (
            plan_memory(model, settings, request, dtype, micro_batch=size).total
            <= microbatch.MEMORY_SHARE * limit
        ),
    )


def print_plan(settings, request: PlanRequest, json_path: str | None = None) -> dict:
    """`swiftkv distill SRC --plan`: the memory per process of DDP and of FSDP at the world size (or only
    FSDP's with --fsdp) on the planned device, whether the run's fits its memory and what would, and the time
    on this machine's device (`speed.time_plan`); printed, and written as JSON to `json_path`."""
    if request.world_size < 1:
        raise ValueError(f"--world-size {request.world_size}: expected a number of processes, 1 or more")
    settings.check_batch_split(request.world_size)  # as the run itself would, before anything is built
    chosen = settings.parallel.dtype
    dtype = torch.bfloat16 if chosen == "auto" else DTYPE_NAMES[chosen]  # auto: a GPU's bf16
    config = plan_config(
        settings.model.source,
        request.num_key_value_layers,
        request.key_value_group_size,
        settings.model.revision,
    )
    model = meta_model(config, settings.model.trainable, settings.model.lora_rank)
    if settings.parallel.micro_batch == AUTO:
        settings = settings.but(micro_batch=auto_micro_batch(model, settings, request, dtype))
    modes = (True,) if settings.parallel.fsdp else (False, True)
    plans = [plan_memory(model, settings, request, dtype, fsdp=fsdp) for fsdp in modes]
    print(
        f"{settings.model.source}: L = {config.num_hidden_layers}, N = {config.num_key_value_layers}, "
        f"G = {config.key_value_group_size}, trainable {settings.model.trainable}, {str(dtype).removeprefix('torch.')}, "
        f"seq {settings.data.seq_len} x micro-batch {settings.parallel.micro_batch}"
        f"{', activation checkpointing' if settings.parallel.activation_checkpointing else ''}, on {request.device}"
    )
    for plan in plans:
        print("\n".join(plan.lines()))
    fit = check_fit(model, settings, request, dtype, plans[0] if not settings.parallel.fsdp else plans[-1])
    print(fit.line)
    timing = None
    if request.timed_steps:
        device = training_device()
        whole = plan_memory(model, settings, request, dtype, world_size=1, fsdp=False).total
        # the compute dtype a run would take on this device
        here = resolve_dtype(settings.parallel.dtype, device)
        timing = time_plan(config, settings, here, device, whole, request.timed_steps)
        print("\n".join(timing.lines(request.world_size)))
    result = {
        "memory": [asdict(p) for p in plans],
        "fit": asdict(fit),
        "time": asdict(timing) if timing else None,
    }
    if json_path:
        write_atomic(json_path, json.dumps(result, indent=2) + "\n")
    return result
