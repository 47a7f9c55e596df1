"""The sections of a distillation run's settings, each a dataclass declared once: its fields' defaults, types
and help, from which the command line is generated (`swiftkv.cli.options`, one group per section). The loss
terms are `core.loss.LossTerms`. `settings.DistillSettings` composes them.

A field's `key` (its name unless given) is its name outside the section: the option (`--KEY`), the recipes'
and `settings_for`'s keyword, and the key of the checkpoint fingerprint and of distill.json, which stay flat
so that a run resumes and a record reads as before the settings had sections.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, DataSpec
from ..data.split import LONG_KINDS
from ..dtypes import DTYPE_CHOICES
from ..replies import ENGINES as REPLY_ENGINES
from ..replies import LONG_KIND_HELP, PROMPT_TURNS, REPLY_TOKENS
from ..replies import WRITERS as REPLY_WRITERS
from ..settings import parse_count, setting
from ..sources import Source
from .core.microbatch import AUTO, parse_micro_batch
from .core.trainable import DEFAULT_LORA_RANK, TRAINABLE_SETS

INITS = ("keep", "copy", "mean", "lstsq")
TARGETS = ("human", "teacher", "mixed")


@dataclass(frozen=True)
class ModelSettings:
    """What is distilled, from what, and which of its parameters train."""

    source: str | Source = setting(
        None, "SwiftKV HF folder (from `swiftkv convert`), alias or Hub repo id", cli=False
    )
    recipe: str = setting(
        "swiftkv",
        "named preset of the settings below (reference = ArcticTraining's)",
        choices=None,
        cli=False,
    )
    teacher: str | Source | None = setting(
        None, "the model MODEL was converted from: checked to match (shapes, tokenizer, weights)"
    )
    revision: str | None = setting(None, "MODEL's revision (branch, tag or commit) when it is a Hub repo id")
    teacher_revision: str | None = setting(
        None, "--teacher's revision (branch, tag or commit) when it is a Hub repo id"
    )
    init: str = setting(
        "lstsq",
        "re-initialise the SwiftKV parameters before training: keep (as converted), copy, "
        "mean (reference) or lstsq",
        choices=INITS,
    )
    trainable: str = setting(
        "swiftkv",
        "what trains: the SwiftKV parameters only (swiftkv, the paper), plus "
        "student-only low-rank adapters on the later layers' o_proj and MLP (lora), plus "
        "student-only copies of them (late), or of them and the later layers' norms "
        "(late-norms); the teacher's weights stay frozen in every case, and the student's "
        "are merged into the written folder",
        choices=TRAINABLE_SETS,
    )
    lora_rank: int | None = setting(
        None, f"rank of the --trainable lora adapters (default {DEFAULT_LORA_RANK})"
    )
    continue_from: str | None = setting(
        None,
        "an earlier run's checkpoint (its OUT.ckpt folder or the checkpoint.pt in it) to continue: "
        "its trained tensors, and the steps after its own in the same data (the same settings but a "
        "larger --tokens, e.g. more --passes), with a fresh AdamW and this run's schedule over the "
        "steps it adds (warmup again)",
    )
    init_from: str | None = setting(
        None,
        "an earlier run's checkpoint (OUT.ckpt or its checkpoint.pt), or a student's SwiftKV weights "
        "(a folder with swiftkv.json, an installed student's alias, or a student snapshot: 0.safetensors "
        "with the run's progress in its metadata), whose trained tensors this run "
        "starts from, on data and settings of its own (a second stage: longer blocks, another mix), with "
        "a fresh AdamW; the same student: the same source, --trainable and --lora-rank (a weights "
        "folder's rank unless --lora-rank is given)",
    )


@dataclass(frozen=True)
class DataSettings:
    """What the run trains on: the data, its split, how many tokens in what blocks, and whose replies."""

    spec: DataSpec = setting("sharegpt", DATA_HELP, repeat=True, key="data")
    data_split: str = setting(DEFAULT_SPLIT, SPLIT_HELP)
    targets: str = setting(
        "teacher",
        "assistant turns to learn on: the data's own (human), the teacher's greedy "
        "replies to the same first prompts (teacher; generated once with vLLM or transformers and "
        "cached), or half of each (mixed)",
        choices=TARGETS,
    )
    tokens: int = setting(
        1_000_000,
        "train tokens (whole blocks, masked or not), rounded up to whole optimizer steps "
        "of --batch-size x --seq-len, so at least this many train",
        parse=parse_count,
    )
    passes: int = setting(
        1,
        "passes over the train data: it holds --tokens / --passes tokens (the written replies are that "
        "many), and each pass takes its blocks in a new seeded order",
    )
    skip_tokens: int = setting(
        0,
        "train tokens of the split passed over first: the documents a run with --tokens SKIP trained on "
        "(a later stage, e.g. with --init-from, on prompts the earlier one never saw; their replies are "
        "written too, as the split counts prompt + reply tokens). Not with --targets mixed or --long-share",
        parse=parse_count,
    )
    heldout_tokens: int = setting(32_768, "held-out tokens for KL / top-1 during the run", parse=parse_count)
    seq_len: int = setting(1024, "tokens per packed block")


@dataclass(frozen=True)
class ReplySettings:
    """How the replies of --targets teacher|mixed are written (the `swiftkv replies` stage a run composes)."""

    writer: str = setting(
        "teacher",
        "who writes the replies of --targets teacher|mixed: the teacher, or the "
        "student as converted (its own greedy replies, scored by the teacher: an on-policy "
        "snapshot that shows the teacher the student's own continuations)",
        choices=REPLY_WRITERS,
        key="reply_writer",
    )
    out: str | None = setting(
        None, "JSONL cache of the written replies (default: in the swiftkv cache)", key="teacher_data"
    )
    reply_tokens: int = setting(REPLY_TOKENS, "max tokens of a written reply")
    long_share: float = setting(
        0.0,
        "share of the written-reply train tokens that answer long prompts (1-2k "
        "tokens of passages + a question, or a document + a summary request, built from "
        "train chats; each packed whole, so it needs --seq-len of about 2048): SwiftKV's "
        "own workload",
    )
    long_kind: str = setting(
        "chat",
        LONG_KIND_HELP,
        choices=tuple(LONG_KINDS),
    )
    prompt_turns: str = setting(
        "first",
        "which user turns of a train chat get written replies: the first, or "
        "every user turn with the conversation before it (about 3x the prompts of "
        "ShareGPT's first turns: what a run beyond ~6M tokens needs)",
        choices=PROMPT_TURNS,
    )
    engine: str = setting(
        "auto",
        "what generates the replies: vllm, hf (transformers' generate, on CUDA when available), static (a "
        "batched greedy loop over a static KV cache, CUDA graphs on a GPU; teacher writes only) or auto "
        "(vllm where installed)",
        choices=REPLY_ENGINES,
        key="reply_engine",
    )


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer's steps: batch, learning rates, schedule, clipping, seed."""

    batch_size: int = setting(
        2,
        "the global batch: blocks per optimizer step over all processes, split into the processes x "
        "--micro-batch (so it must be a multiple of their product). The lr was tuned with each recipe's "
        "batch; under --recipe reference-large a --batch-size B without --lr trains at 2e-4 x sqrt(B / 8)",
    )
    lr: float = setting(2e-3, "peak learning rate (AdamW)")
    late_lr: float = setting(
        2e-4, "peak learning rate of the student-only later-layer weights (--trainable lora|late|late-norms)"
    )
    warmup: float = setting(0.05, "fraction of steps with linear warmup; linear decay to 0 after")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "gradient clipping")
    seed: int = setting(0, "data split and order")


@dataclass(frozen=True)
class ParallelSettings:
    """How a step runs on the devices: forwards per step, dtype, sharding, recomputation, compilation."""

    micro_batch: int | str = setting(
        AUTO,
        "blocks per forward, or auto: on CUDA the largest divisor of the "
        "per-process batch whose first step fits in memory (tried), on CPU 2",
        parse=parse_micro_batch,
    )
    dtype: str = setting(
        "auto",
        "compute dtype: auto = bf16 autocast where bf16 is native, else fp32 "
        "(master weights and loss stay fp32)",
        choices=DTYPE_CHOICES,
    )
    naive: bool = setting(
        False, "teacher and student each run all layers (the reference way), for comparison"
    )
    fsdp: bool = setting(
        False,
        "shard the frozen teacher weights, the trained parameters, their gradients and the "
        "optimizer state over the torchrun processes (FSDP2: one unit per decoder layer), for "
        "models one device cannot hold; checkpoints are sharded (torch.distributed.checkpoint)",
    )
    activation_checkpointing: bool = setting(
        False,
        "recompute each decoder layer's activations in the backward instead of keeping them (long sequences)",
    )
    compile: bool = setting(
        False,
        "torch.compile each decoder layer (dynamic shapes: the student's kept positions change every step), "
        "for GPUs whose small-model steps are launch-bound; the first failure falls back to the plain "
        "layers, with the reason printed",
    )


@dataclass(frozen=True)
class CheckpointSettings:
    """When and where the run's state is kept, and how a run meets an earlier one's."""

    checkpoint_every: int = setting(10, "steps between checkpoints")
    checkpoint_dir: str | None = setting(None, "default: OUT.ckpt")
    snapshot_every: float | None = setting(
        None,
        "also write the checkpoint at least every SECONDS of wall time (atomically: a run killed at any "
        "moment keeps the last complete one), for machines that can be taken away; the same command run "
        "again resumes from it, without --resume",
    )
    resume: bool = setting(False, "continue from the checkpoint")
    force: bool = setting(False, "overwrite OUT / start over an existing checkpoint")

    stop_after: int | None = setting(
        None, "stop (checkpointed) after this many steps, e.g. to slice a long run"
    )


@dataclass(frozen=True)
class OutputSettings:
    """What the run writes and reports while it runs."""

    out: str | None = setting(None, "final HF SwiftKV folder (written atomically)")
    eval_every: int = setting(50, "steps between held-out evaluations")
    profile_steps: int | None = setting(
        None,
        "profile this many steps after the first (torch.profiler) and print where a step's time goes: wall "
        "ms against the ms the device was busy, and the ops with the most self time; the steps train as usual",
    )
