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
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ..data.long_prompts import LONG_PROMPT_TOKENS
from ..data.split import written_tokens
from ..replies import RepliesSettings
from ..settings import key_of
from ..sources import SourceLike, open_source, source_name
from .core.loss import LossTerms
from .core.microbatch import check_split
from .sections import (
    CheckpointSettings,
    DataSettings,
    ModelSettings,
    OptimSettings,
    OutputSettings,
    ParallelSettings,
    ReplySettings,
)

CHECKPOINT_FILE = "checkpoint.pt"
REDERIVED_INITS = ("copy", "mean")  # recomputed from the model's own teacher weights when the run starts
HUMAN_SHARE = {"human": 1.0, "teacher": 0.0, "mixed": 0.5}  # of the train tokens, per --targets
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


@dataclass(frozen=True)
class DistillSettings:
    """A run's settings, in sections (`sections`; the loss is `core.loss.LossTerms`). A function takes the
    section it reads. `of` builds one from flat keys (the options' names) and `but` changes some by them."""

    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    replies: ReplySettings = field(default_factory=ReplySettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    loss: LossTerms = field(default_factory=LossTerms)
    parallel: ParallelSettings = field(default_factory=ParallelSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    @classmethod
    def of(cls, **values) -> DistillSettings:
        """Settings from flat keys (`--KEY` without dashes, e.g. lr=1e-3, data="sharegpt"); the rest default."""
        return cls().but(**values)

    def but(self, **values) -> DistillSettings:
        """These settings with the flat keys `values` changed."""
        unknown = set(values) - set(SECTION_OF)
        if unknown:
            raise TypeError(f"unknown distillation settings: {sorted(unknown)}")
        changed = {}
        for section in SECTIONS:
            mine = {SECTION_OF[k][1]: v for k, v in values.items() if SECTION_OF[k][0] == section}
            if mine:
                changed[section] = replace(getattr(self, section), **mine)
        return replace(self, **changed)

    def flat(self) -> dict:
        """Every setting by its flat key (the checkpoint fingerprint's and distill.json's)."""
        return {key: getattr(getattr(self, section), name) for key, (section, name) in SECTION_OF.items()}

    def opened(self) -> DistillSettings:
        """These settings with their model sources resolved, once, as a command starts (`open_source`):
        everything after reads the opened `Source`s and resolves nothing again."""
        model = self.model
        teacher = None if model.teacher is None else open_source(model.teacher, model.teacher_revision)
        return self.but(source=open_source(model.source, model.revision), teacher=teacher)

    def as_json(self) -> dict:
        """The settings as JSON values, by flat key (a source by the name it was given)."""
        names = {"source": source_name(self.model.source), "teacher": source_name(self.model.teacher)}
        spec = self.data.spec
        data = spec if isinstance(spec, str) else list(spec)  # as a checkpoint's JSON reads back
        return {**self.flat(), **names, "data": data}

    def fingerprint(self) -> dict:
        return {k: v for k, v in self.as_json().items() if k not in RUN_ONLY_SETTINGS}

    def identity(self) -> RunIdentity:
        """What a resume of this run must match (the checkpoint's fingerprint)."""
        return RunIdentity({k: v for k, v in self.fingerprint().items() if k != "source"}, self.model.source)

    def step_settings(self) -> StepSettings:
        """The part of the settings one forward + backward and a held-out evaluation read."""
        parallel = self.parallel
        return StepSettings(
            parallel.micro_batch, parallel.dtype, parallel.naive, self.optim.max_grad_norm, self.loss
        )

    def check_parallelism(self) -> None:
        """Settings sharding cannot honour, refused before any work."""
        if self.parallel.fsdp and self.parallel.naive:
            raise ValueError(
                "--fsdp with --naive: the naive way runs layers < N a second time for the student only "
                "to compare speeds on one process; drop one of them"
            )

    def check_batch_split(self, world_size: int) -> None:
        """--batch-size is the global batch: it must split over `world_size` processes x --micro-batch."""
        check_split(self.optim.batch_size, world_size, self.parallel.micro_batch)

    def check_skip(self) -> None:
        """--skip-tokens passes over one kind of train document: human chats, or written prompts."""
        data, long_share = self.data, self.replies.long_share
        if data.skip_tokens < 0:
            raise ValueError(f"--skip-tokens {data.skip_tokens}: expected a count of tokens, 0 or more")
        if data.skip_tokens and (data.targets == "mixed" or long_share):
            raise ValueError(
                f"--skip-tokens with {'--targets mixed' if data.targets == 'mixed' else '--long-share'}: "
                "its train documents interleave two kinds, and a skip passes over one; expected --targets "
                "teacher or human without --long-share"
            )

    def check_written_replies(self) -> None:
        """Long prompts are answered by the writer and packed whole, so they need written replies and a
        block that holds one. A student-written reply comes from SOURCE's SwiftKV parameters as they are
        on disk, so the run must start from those same parameters, and must train on written replies."""
        replies, targets = self.replies, self.data.targets
        if replies.long_share:
            check_long_share(replies, targets, self.data.seq_len)
        if replies.prompt_turns != "first" and targets == "human":
            raise ValueError(
                f"--prompt-turns {replies.prompt_turns}: prompts are answered by the reply writer, and "
                "--targets human trains on the data's own replies; expected --targets teacher or mixed"
            )
        self.replies_settings().check_engine()
        self.replies_settings().check_long_mix()
        if replies.writer != "student":
            return
        if targets == "human":
            raise ValueError(
                "--reply-writer student: --targets human trains on the data's own replies, which "
                "nobody writes; expected --targets teacher or mixed"
            )
        if self.model.init in REDERIVED_INITS:
            raise ValueError(
                f"--reply-writer student writes with {self.model.source}'s SwiftKV parameters as converted, "
                f"but --init {self.model.init} replaces them before training, so another student would write "
                "the replies; expected --init keep or lstsq (convert the source with the init you want)"
            )

    @property
    def data_tokens(self) -> int:
        """The train tokens one pass holds: --tokens split into --passes."""
        return self.train_tokens // self.data.passes

    @property
    def train_tokens(self) -> int:
        """--tokens rounded up to whole optimizer steps: asking for 1M trains at least 1M tokens (flooring
        gave 999,424 at steps of 2 x 1024)."""
        step_tokens = self.optim.batch_size * self.data.seq_len
        return -(-self.data.tokens // step_tokens) * step_tokens

    def replies_settings(self) -> RepliesSettings:
        """The replies stage of `--targets teacher|mixed`, composed of this run's `replies` section and what
        the rest decides: the writer's model, the prompts of this run's split, and as many tokens as the run
        trains on written replies."""
        replies, data, model = self.replies, self.data, self.model
        writer = model.source if replies.writer == "student" else (model.teacher or model.source)
        return RepliesSettings(
            **asdict(replies),
            source=writer,
            data=data.spec,
            data_split=data.data_split,
            tokens=written_tokens(self.data_tokens, HUMAN_SHARE[data.targets]),
            heldout_tokens=data.heldout_tokens,
            skip_tokens=data.skip_tokens,
            seed=self.optim.seed,
            dtype=self.parallel.dtype,
            long_prompt_tokens=data.seq_len - replies.reply_tokens - 1,  # + the reply's end token
        )

    def checkpoint_path(self) -> Path | None:
        out = self.output.out
        folder = self.checkpoint.checkpoint_dir or (f"{out}.ckpt" if out else None)
        return Path(folder) / CHECKPOINT_FILE if folder else None


def check_long_share(replies: ReplySettings, targets: str, seq_len: int) -> None:
    """--long-share: a share, of written replies, whose long prompt and reply fit one block."""
    if not 0 < replies.long_share <= 1:
        raise ValueError(
            f"--long-share {replies.long_share}: expected a share of the written tokens in (0, 1]"
        )
    if targets == "human":
        raise ValueError(
            "--long-share: long prompts are answered by the reply writer, and --targets human "
            "trains on the data's own replies; expected --targets teacher or mixed"
        )
    needed = LONG_PROMPT_TOKENS[0] + LONG_PROMPT_MARGIN + replies.reply_tokens + 1
    if seq_len < needed:
        raise ValueError(
            f"--long-share: a long prompt ({LONG_PROMPT_TOKENS[0]}+ tokens) and its reply "
            f"({replies.reply_tokens}) must fit one block; expected --seq-len of at least {needed}, "
            f"got {seq_len}"
        )


# Each section's class, by its attribute on DistillSettings
SECTIONS = {
    "model": ModelSettings,
    "data": DataSettings,
    "replies": ReplySettings,
    "optim": OptimSettings,
    "loss": LossTerms,
    "parallel": ParallelSettings,
    "checkpoint": CheckpointSettings,
    "output": OutputSettings,
}
# Each setting's flat key -> (its section, its field there)
SECTION_OF = {key_of(f): (name, f.name) for name, section in SECTIONS.items() for f in fields(section)}
SETTING_DEFAULTS = {key_of(f): f.default for section in SECTIONS.values() for f in fields(section)}


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
    unknown = set(given) - set(SECTION_OF)
    if unknown:
        raise TypeError(f"unknown distillation settings: {sorted(unknown)}")
    chosen = {k: v for k, v in given.items() if v is not None}
    values = {**RECIPES[recipe], **chosen}
    if recipe in LR_FOLLOWS_BATCH and "batch_size" in chosen and "lr" not in chosen:
        values["lr"] = scaled_lr(RECIPES[recipe]["lr"], chosen["batch_size"], RECIPES[recipe]["batch_size"])
    return DistillSettings.of(source=source, recipe=recipe, **values)


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
