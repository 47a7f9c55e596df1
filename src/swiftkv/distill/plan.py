"""Memory plan of a distillation run: bytes per process, before anything is loaded.

The model is built on the meta device from its config alone (`SRC` may be a folder holding only a SwiftKV
`config.json`), with the run's trainable set installed, so every count is the run's own: frozen weights
in the compute dtype (cast once), trained parameters as fp32 masters, their fp32 gradients and AdamW's
two fp32 moments. Under FSDP each of those is divided by the world size, and the units being gathered
come on top: the root (head, norms, tied embeddings), held from forward to backward, and two decoder
layers (the one computing and the one prefetched). DDP keeps a second fp32 copy of the gradients in its
reduction buckets.

Activations, per token of a micro-batch (B x S), with `a` the compute dtype's bytes: the student's later
layers keep what their backward reads: two RMSNorms (their fp32 input and output in `a`: 2 x (4 + a) H),
attention's query and output (2aH), the MLP's gate, up, activation and product (4aI); each AcrossKV group
keeps its K and V (2a KV), and norm_swiftkv(h_N) its input and output ((4 + a) H). With activation
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
from dataclasses import asdict, dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..dtypes import DTYPE_NAMES
from ..files import write_atomic
from ..model.config import is_swiftkv
from ..sources import SourceLike, open_source
from . import trainable

GIB = 2**30
LOSS_CHUNK_COPIES = 5  # fp32 [chunk, V]: student and teacher logits, their log-softmaxes, the gradient
GATHERED_LAYERS = 2  # FSDP: the layer computing and the one prefetched


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


def meta_model(source: SourceLike, trainable_set: str, lora_rank: int | None):
    """The SwiftKV model of `source`'s config on the meta device, with the run's trainable set installed
    (a folder holding only config.json is a source too)."""
    folder = open_source(source).folder
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    if not is_swiftkv(config):
        raise ValueError(
            f"--plan: {folder} is not a SwiftKV model (no num_key_value_layers); plan a converted folder"
        )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
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
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    later = config.num_hidden_layers - config.num_key_value_layers
    layer_saved = 2 * (4 + a) * hidden + 2 * a * hidden + 4 * a * inner
    if device == "cpu":  # the math path of masked attention keeps each layer's probabilities
        layer_saved += config.num_attention_heads * seq_len * a
    shared = config.num_kv_groups * 2 * a * kv + (4 + a) * hidden
    kept = (later * a * hidden + layer_saved) if activation_checkpointing else later * layer_saved
    masks = 2 * micro_batch * seq_len * seq_len * a
    rows = tokens * 2 * a * hidden  # the final hidden rows of teacher and student
    loss_chunk = (
        LOSS_CHUNK_COPIES * 4 * min(chunk_rows, tokens) * config.vocab_size
    )  # beside the kept activations
    return tokens * (kept + shared) + rows + masks + loss_chunk


def print_plan(
    settings, world_size: int, device: str = "cuda", json_path: str | None = None
) -> list[MemoryPlan]:
    """`swiftkv distill SRC --plan`: the plan of DDP and of FSDP at `world_size` processes (or only FSDP's
    with --fsdp) on `device` (cuda or cpu), printed in GiB."""
    if settings.micro_batch == "auto":
        raise ValueError("--plan needs a number for --micro-batch (auto is decided on the device)")
    dtype = torch.bfloat16 if settings.dtype == "auto" else DTYPE_NAMES[settings.dtype]  # auto: a GPU's bf16
    model = meta_model(settings.source, settings.trainable, settings.lora_rank)
    modes = (True,) if settings.fsdp else (False, True)
    plans = [
        memory_plan(
            model,
            world_size,
            fsdp,
            settings.seq_len,
            settings.micro_batch,
            dtype,
            settings.chunk_rows,
            settings.activation_checkpointing,
            device,
        )
        for fsdp in modes
    ]
    print(
        f"{settings.source}: L = {model.config.num_hidden_layers}, N = {model.config.num_key_value_layers}, "
        f"trainable {settings.trainable}, {str(dtype).removeprefix('torch.')}, seq {settings.seq_len} x micro-batch "
        f"{settings.micro_batch}{', activation checkpointing' if settings.activation_checkpointing else ''}, on {device}"
    )
    for plan in plans:
        print("\n".join(plan.lines()))
    if json_path:
        write_atomic(json_path, json.dumps([asdict(p) for p in plans], indent=2) + "\n")
    return plans
