"""What a distillation run is: one dataclass, declared once. The command line is generated from it
(`swiftkv.cli.options`), the checkpoint fingerprint is computed from it, and its field defaults are the
default recipe; the other recipes are named overrides of them.

Recipes (`--recipe`):
  swiftkv    ours (the default: the field defaults): lstsq init; the teacher's own greedy replies, cut at
             64 tokens, as the assistant turns, so the student learns the exact distribution it is judged
             against, with many answer starts per token; T^2 * KL at T = 2 averaged over those reply tokens
             only, no MSE term; lr 2e-3 (5% warmup, linear decay) at steps of 2 blocks.
  reference  ArcticTraining's SwiftKV recipe, reproduced: mean init; T^2 * KL at T = 2 on assistant
             tokens, averaged over *all* positions (their `torch.mean` over the masked loss); plus
             1.0 x MSE of `hidden_states[-2]` (the residual stream entering the last layer) over all
             positions; lr 2e-4 at steps of 16 blocks; the human-written replies of the data.
  swiftkv-lora  swiftkv plus student-only rank-64 adapters (lr 1e-3) on the later layers' o_proj and
             MLP; the written folder merges them, so it serves unchanged but no longer contains its teacher.
  reference-large  the reference at the scale Snowflake ran it for Llama-3.1-8B (ArcticTraining's 8B
             config: 8 GPUs x micro-batch 1 of up to 8,192 tokens, lr 2e-4, 1 epoch): blocks of 8,192
             tokens, a global batch of 8 blocks (65,536 tokens a step), one block per forward, 500M train
             tokens (a cap: a run trains one pass over whatever its --data holds below it), checkpoints
             and held-out evaluations every 500 steps. Its lr follows the global batch: --batch-size B
             without --lr trains at 2e-4 x sqrt(B / 8) (`scaled_lr`).
How each recipe was chosen, with the study's figures, is in docs/distillation.md and docs/history.md.
Options given on the command line override the recipe's values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..data.long_prompts import LONG_PROMPT_TOKENS
from ..data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, DataSpec
from ..data.split import LONG_KINDS, written_tokens
from ..dtypes import DTYPE_CHOICES
from ..replies import ENGINES as REPLY_ENGINES
from ..replies import LONG_KIND_HELP, PROMPT_TURNS, REPLY_TOKENS, RepliesSettings
from ..replies import WRITERS as REPLY_WRITERS
from ..settings import parse_count, setting
from ..sources import Source, SourceLike, open_source, source_name
from .core.loss import LossTerms
from .core.microbatch import AUTO, check_split, parse_micro_batch
from .core.trainable import DEFAULT_LORA_RANK, TRAINABLE_SETS

CHECKPOINT_FILE = "checkpoint.pt"
INITS = ("keep", "copy", "mean", "lstsq")
REDERIVED_INITS = ("copy", "mean")  # recomputed from the model's own teacher weights when the run starts
TARGETS = ("human", "teacher", "mixed")
HUMAN_SHARE = {"human": 1.0, "teacher": 0.0, "mixed": 0.5}  # of the train tokens, per --targets
KL_MEAN_OVER = ("targets", "positions")
LONG_PROMPT_MARGIN = (
    128  # tokens a block needs beyond the shortest long prompt's text: its chat template, and room
)
# Settings that do not change the training trajectory; a resume may differ in them.
RUN_ONLY_SETTINGS = (
    "out",
    "checkpoint_dir",
    "eval_every",
    "checkpoint_every",
    "snapshot_every",
    "profile_steps",
    "stop_after",
    "force",
    "resume",
    "teacher_data",
    "revision",  # the models are known by what their folders hold (`RunIdentity`), not by where they came from
    "teacher_revision",
    "reply_engine",
    "fsdp",
    "activation_checkpointing",
    "compile",
)


@dataclass
class DistillSettings:
    source: str | Source = setting(
        None, "SwiftKV HF folder (from `swiftkv convert`), alias or Hub repo id", cli=False
    )
    recipe: str = setting(
        "swiftkv",
        "named preset of the settings below (reference = ArcticTraining's)",
        choices=None,
        cli=False,
    )
    out: str | None = setting(None, "final HF SwiftKV folder (written atomically)")
    data: DataSpec = setting("sharegpt", DATA_HELP, repeat=True)
    data_split: str = setting(DEFAULT_SPLIT, SPLIT_HELP)
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
    targets: str = setting(
        "teacher",
        "assistant turns to learn on: the data's own (human), the teacher's greedy "
        "replies to the same first prompts (teacher; generated once with vLLM or transformers and "
        "cached), or half of each (mixed)",
        choices=TARGETS,
    )
    reply_writer: str = setting(
        "teacher",
        "who writes the replies of --targets teacher|mixed: the teacher, or the "
        "student as converted (its own greedy replies, scored by the teacher: an on-policy "
        "snapshot that shows the teacher the student's own continuations)",
        choices=REPLY_WRITERS,
    )
    teacher_data: str | None = setting(
        None, "JSONL cache of the written replies (default: in the swiftkv cache)"
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
    reply_engine: str = setting(
        "auto",
        "what generates the replies: vllm, hf (transformers' generate, on CUDA when available), static (a "
        "batched greedy loop over a static KV cache, CUDA graphs on a GPU; teacher writes only) or auto "
        "(vllm where installed)",
        choices=REPLY_ENGINES,
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
    late_lr: float = setting(
        2e-4, "peak learning rate of the student-only later-layer weights (--trainable lora|late|late-norms)"
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
    heldout_tokens: int = setting(32_768, "held-out tokens for KL / top-1 during the run", parse=parse_count)
    seq_len: int = setting(1024, "tokens per packed block")
    batch_size: int = setting(
        2,
        "the global batch: blocks per optimizer step over all processes, split into the processes x "
        "--micro-batch (so it must be a multiple of their product). The lr was tuned with each recipe's "
        "batch; under --recipe reference-large a --batch-size B without --lr trains at 2e-4 x sqrt(B / 8)",
    )
    micro_batch: int | str = setting(
        AUTO,
        "blocks per forward, or auto: on CUDA the largest divisor of the "
        "per-process batch whose first step fits in memory (tried), on CPU 2",
        parse=parse_micro_batch,
    )
    lr: float = setting(2e-3, "peak learning rate (AdamW)")
    warmup: float = setting(0.05, "fraction of steps with linear warmup; linear decay to 0 after")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    temperature: float = setting(2.0, "softmax temperature of the T^2 * KL term")
    kl_mean_over: str = setting(
        "targets",
        "the KL sum is divided by the trained (assistant) positions, or by all "
        "positions as the reference does",
        choices=KL_MEAN_OVER,
    )
    top1_weight: float = setting(
        0.0,
        "weight of a cross-entropy term on the teacher's most likely token at each "
        "trained position (hard-label distillation; greedy agreement is decided at the "
        "argmax), divided like the KL",
    )
    mse_weight: float = setting(0.0, "weight of the hidden-state MSE term (all positions)")
    mse_hidden_index: int = setting(
        -2,
        "which transformers hidden_states entry the MSE compares (-2: the input of "
        "the last layer, as the reference); must be a later layer's input",
    )
    max_grad_norm: float = setting(1.0, "gradient clipping")
    dtype: str = setting(
        "auto",
        "compute dtype: auto = bf16 autocast where bf16 is native, else fp32 "
        "(master weights and loss stay fp32)",
        choices=DTYPE_CHOICES,
    )
    chunk_rows: int = setting(512, "positions per vocabulary chunk of the loss")
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
    seed: int = setting(0, "data split and order")
    eval_every: int = setting(50, "steps between held-out evaluations")
    checkpoint_every: int = setting(10, "steps between checkpoints")
    checkpoint_dir: str | None = setting(None, "default: OUT.ckpt")
    snapshot_every: float | None = setting(
        None,
        "also write the checkpoint at least every SECONDS of wall time (atomically: a run killed at any "
        "moment keeps the last complete one), for machines that can be taken away; the same command run "
        "again resumes from it, without --resume",
    )
    profile_steps: int | None = setting(
        None,
        "profile this many steps after the first (torch.profiler) and print where a step's time goes: wall "
        "ms against the ms the device was busy, and the ops with the most self time; the steps train as usual",
    )
    stop_after: int | None = setting(
        None, "stop (checkpointed) after this many steps, e.g. to slice a long run"
    )
    resume: bool = setting(False, "continue from the checkpoint")
    force: bool = setting(False, "overwrite OUT / start over an existing checkpoint")

    def opened(self) -> DistillSettings:
        """These settings with their model sources resolved, once, as a command starts (`open_source`):
        everything after reads the opened `Source`s and resolves nothing again."""
        teacher = None if self.teacher is None else open_source(self.teacher, self.teacher_revision)
        return replace(self, source=open_source(self.source, self.revision), teacher=teacher)

    def as_json(self) -> dict:
        """The settings as JSON values (a source by the name it was given)."""
        names = {"source": source_name(self.source), "teacher": source_name(self.teacher)}
        data = (
            self.data if isinstance(self.data, str) else list(self.data)
        )  # as a checkpoint's JSON reads back
        return {**asdict(self), **names, "data": data}

    def fingerprint(self) -> dict:
        return {k: v for k, v in self.as_json().items() if k not in RUN_ONLY_SETTINGS}

    def identity(self) -> RunIdentity:
        """What a resume of this run must match (the checkpoint's fingerprint)."""
        return RunIdentity({k: v for k, v in self.fingerprint().items() if k != "source"}, self.source)

    def step_settings(self) -> StepSettings:
        """The part of the settings one forward + backward and a held-out evaluation read."""
        loss = LossTerms(**{f.name: getattr(self, f.name) for f in fields(LossTerms)})
        return StepSettings(self.micro_batch, self.dtype, self.naive, self.max_grad_norm, loss)

    def check_parallelism(self) -> None:
        """Settings sharding cannot honour, refused before any work."""
        if self.fsdp and self.naive:
            raise ValueError(
                "--fsdp with --naive: the naive way runs layers < N a second time for the student only "
                "to compare speeds on one process; drop one of them"
            )

    def check_batch_split(self, world_size: int) -> None:
        """--batch-size is the global batch: it must split over `world_size` processes x --micro-batch."""
        check_split(self.batch_size, world_size, self.micro_batch)

    def check_skip(self) -> None:
        """--skip-tokens passes over one kind of train document: human chats, or written prompts."""
        if self.skip_tokens < 0:
            raise ValueError(f"--skip-tokens {self.skip_tokens}: expected a count of tokens, 0 or more")
        if self.skip_tokens and (self.targets == "mixed" or self.long_share):
            raise ValueError(
                f"--skip-tokens with {'--targets mixed' if self.targets == 'mixed' else '--long-share'}: "
                "its train documents interleave two kinds, and a skip passes over one; expected --targets "
                "teacher or human without --long-share"
            )

    def check_written_replies(self) -> None:
        """Long prompts are answered by the writer and packed whole, so they need written replies and a
        block that holds one. A student-written reply comes from SOURCE's SwiftKV parameters as they are
        on disk, so the run must start from those same parameters, and must train on written replies."""
        if self.long_share:
            if not 0 < self.long_share <= 1:
                raise ValueError(
                    f"--long-share {self.long_share}: expected a share of the written tokens in (0, 1]"
                )
            if self.targets == "human":
                raise ValueError(
                    "--long-share: long prompts are answered by the reply writer, and --targets human "
                    "trains on the data's own replies; expected --targets teacher or mixed"
                )
            needed = LONG_PROMPT_TOKENS[0] + LONG_PROMPT_MARGIN + self.reply_tokens + 1
            if self.seq_len < needed:
                raise ValueError(
                    f"--long-share: a long prompt ({LONG_PROMPT_TOKENS[0]}+ tokens) and its reply "
                    f"({self.reply_tokens}) must fit one block; expected --seq-len of at least {needed}, "
                    f"got {self.seq_len}"
                )
        if self.prompt_turns != "first" and self.targets == "human":
            raise ValueError(
                f"--prompt-turns {self.prompt_turns}: prompts are answered by the reply writer, and "
                "--targets human trains on the data's own replies; expected --targets teacher or mixed"
            )
        self.replies_settings().check_engine()
        self.replies_settings().check_long_mix()
        if self.reply_writer != "student":
            return
        if self.targets == "human":
            raise ValueError(
                "--reply-writer student: --targets human trains on the data's own replies, which "
                "nobody writes; expected --targets teacher or mixed"
            )
        if self.init in REDERIVED_INITS:
            raise ValueError(
                f"--reply-writer student writes with {self.source}'s SwiftKV parameters as converted, "
                f"but --init {self.init} replaces them before training, so another student would write "
                "the replies; expected --init keep or lstsq (convert the source with the init you want)"
            )

    @property
    def data_tokens(self) -> int:
        """The train tokens one pass holds: --tokens split into --passes."""
        return self.train_tokens // self.passes

    @property
    def train_tokens(self) -> int:
        """--tokens rounded up to whole optimizer steps: asking for 1M trains at least 1M tokens (flooring
        gave 999,424 at steps of 2 x 1024)."""
        step_tokens = self.batch_size * self.seq_len
        return -(-self.tokens // step_tokens) * step_tokens

    def replies_settings(self) -> RepliesSettings:
        """The replies stage of `--targets teacher|mixed`: the writer's replies to the train prompts of
        this run's split, as many tokens as the run trains on written replies."""
        writer = self.source if self.reply_writer == "student" else (self.teacher or self.source)
        return RepliesSettings(
            source=writer,
            out=self.teacher_data,
            writer=self.reply_writer,
            data=self.data,
            data_split=self.data_split,
            tokens=written_tokens(self.data_tokens, HUMAN_SHARE[self.targets]),
            heldout_tokens=self.heldout_tokens,
            skip_tokens=self.skip_tokens,
            seed=self.seed,
            reply_tokens=self.reply_tokens,
            engine=self.reply_engine,
            dtype=self.dtype,
            long_share=self.long_share,
            long_kind=self.long_kind,
            long_prompt_tokens=self.seq_len - self.reply_tokens - 1,  # + the reply's end token
            prompt_turns=self.prompt_turns,
        )

    def checkpoint_path(self) -> Path | None:
        folder = self.checkpoint_dir or (f"{self.out}.ckpt" if self.out else None)
        return Path(folder) / CHECKPOINT_FILE if folder else None


SETTING_DEFAULTS = {f.name: f.default for f in fields(DistillSettings)}


@dataclass(frozen=True)
class StepSettings:
    """What the trainer's step functions read: how a batch is cut into forwards, the compute dtype, how
    teacher and student run, and the loss terms. Everything else about a run stays in DistillSettings."""

    micro_batch: int | str  # `auto` until trainer.sized_micro_batch resolves it to a number
    dtype: str
    naive: bool
    max_grad_norm: float
    loss: LossTerms


@dataclass(frozen=True)
class RunIdentity:
    """What a resumed run must match: the settings that shape its trajectory, and the model it started from."""

    training: dict  # DistillSettings.fingerprint() without the source
    source: SourceLike

    def fingerprint(self, by_content: bool = True) -> dict:
        """The model is known by content (`model_identity`) where the source is a model folder, so the
        same folder given by a relative or an absolute path resumes and another model put in the same
        folder is refused; by its name where it is not one (a library caller's in-memory model) or where
        the checkpoint was written before model identities (`by_content=False`)."""
        try:
            source = open_source(self.source) if by_content else None  # an opened Source: as it is
        except FileNotFoundError:
            source = None
        if source is None:
            return self.training | {"source": source_name(self.source)}
        return self.training | {MODEL_KEY + k: v for k, v in source.identity().items()}


MODEL_KEY = "model "  # prefix of the model's identity keys in a checkpoint's fingerprint

# Each recipe is what it changes from the field defaults (which are "swiftkv"). The reference keeps
# ArcticTraining's step of 16 blocks and lr; its 512-token reply cap matters only with --targets teacher.
RECIPES: dict[str, dict] = {
    "swiftkv": {},
    "reference": {
        "init": "mean",
        "targets": "human",
        "kl_mean_over": "positions",
        "mse_weight": 1.0,
        "lr": 2e-4,
        "batch_size": 16,
        "reply_tokens": 512,
    },
    "swiftkv-lora": {"trainable": "lora", "lora_rank": 64, "late_lr": 1e-3},
    "reference-large": {
        "init": "mean",
        "targets": "human",
        "kl_mean_over": "positions",
        "mse_weight": 1.0,
        "lr": 2e-4,
        "warmup": 0.05,
        "batch_size": 8,
        "micro_batch": 1,
        "seq_len": 8192,
        "tokens": 500_000_000,
        "passes": 1,
        "reply_tokens": 512,
        "eval_every": 500,
        "checkpoint_every": 500,
    },
}
DEFAULT_RECIPE = "swiftkv"
# Without --recipe a run takes the recipe made for its model's size: the default recipe's lr (2e-3) and
# 512-token blocks were tuned on the 135M model, and Snowflake's 8B config is the only one tried at 1B+.
LARGE_RECIPE = "reference-large"
LARGE_MODEL_PARAMETERS = 1_000_000_000
# Recipes whose lr follows the global batch: given --batch-size B and no --lr, lr x sqrt(B / B_ref) with
# B_ref the recipe's own batch (the square-root rule for Adam-type optimizers: the gradient noise of a
# batch falls as 1 / sqrt(B)). The other recipes keep their lr at any batch (it was tuned at their step).
LR_FOLLOWS_BATCH = ("reference-large",)


def settings_for(source: str, recipe: str = DEFAULT_RECIPE, **given) -> DistillSettings:
    """The recipe's values, then the ones given explicitly (None means "not given")."""
    if recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe!r} is unknown; expected one of {sorted(RECIPES)}")
    unknown = set(given) - {f.name for f in fields(DistillSettings)}
    if unknown:
        raise TypeError(f"unknown distillation settings: {sorted(unknown)}")
    chosen = {k: v for k, v in given.items() if v is not None}
    values = {**RECIPES[recipe], **chosen}
    if recipe in LR_FOLLOWS_BATCH and "batch_size" in chosen and "lr" not in chosen:
        values["lr"] = scaled_lr(RECIPES[recipe]["lr"], chosen["batch_size"], RECIPES[recipe]["batch_size"])
    return DistillSettings(source=source, recipe=recipe, **values)


def default_recipe(parameters: int) -> tuple[str, str]:
    """The recipe a run of a model with `parameters` takes without --recipe, and why, in words."""
    size = f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.1f}M"
    size += " parameters"
    if parameters >= LARGE_MODEL_PARAMETERS:
        return LARGE_RECIPE, f"the model has {size}, at least {LARGE_MODEL_PARAMETERS / 1e9:g}B"
    return DEFAULT_RECIPE, f"the model has {size}, under {LARGE_MODEL_PARAMETERS / 1e9:g}B"


def scaled_lr(lr: float, batch_size: int, reference_batch: int) -> float:
    """The peak lr at global batch `batch_size` of a recipe whose `lr` was set at `reference_batch`."""
    return lr * math.sqrt(batch_size / reference_batch)
