"""How a distillation run starts, decided in one place before any work: `decide_start(settings)` returns
what the run loads and why, and refuses (one error each, naming the setting and what is expected) every
start that would clobber an output, resume another run, or train on from another student.

  fresh     nothing to load: the SwiftKV parameters as --init leaves them
  resume    --resume: this run's own checkpoint (trained tensors, AdamW state, step), which must be this
            run's (the same model and settings) in the layout it reads (sharded under --fsdp, whole otherwise)
  snapshot  --snapshot-every, started again by the same command: as resume, from the checkpoint it left
  continue  --continue-from: an earlier run's trained tensors and its place in the same data, a fresh AdamW
  init      --init-from: an earlier run's (or a weights folder's) trained tensors of the same student, on
            this run's own data and schedule, a fresh AdamW

Checkpoints are memory-mapped to be checked, so deciding costs no read of their tensors. A run with a
--continue-from or --init-from that is resumed loads its own checkpoint, and still checks them: a resumed
continuation must continue the same steps of the data (`check_same_continuation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...data.mixture import check_data
from ...files import check_new_output
from ...sources import Source, read_config_dict, source_name
from ..core.trainable import DEFAULT_LORA_RANK, STUDENT_MODULES
from ..sections import ModelSettings
from ..settings import CHECKPOINT_FILE, MODEL_KEY, SETTING_DEFAULTS, DistillSettings, RunIdentity
from .from_weights import folder_spec, weights_folder
from .snapshot import saved_checkpoint

KINDS = ("fresh", "resume", "snapshot", "continue", "init")


@dataclass(frozen=True)
class Start:
    kind: str  # one of KINDS
    load: Path | None  # the checkpoint file or weights folder the run loads (None: fresh)
    why: str  # said as the run starts
    checkpoint: Path | None  # where this run writes its own checkpoints
    continued_steps: int = 0  # --continue-from: the data's steps the runs it continues trained before it

    @property
    def resumes(self) -> bool:
        """The run loads its own checkpoint: its step, AdamW state and history with its tensors."""
        return self.kind in ("resume", "snapshot")


def decide_start(settings: DistillSettings, config: dict | None = None, writes_output: bool = True) -> Start:
    """How this run starts, every check of it made here, before any work. `config`: the run's model's
    (default: read from its source folder; a model built in memory is checked when training starts).
    `writes_output`: a run that writes --out (`run_distillation`): it needs one, refuses to overwrite it or an
    existing checkpoint without --force, and resumes a --snapshot-every run's checkpoint by itself; the
    library's `distill` trains a model in memory and checks the rest."""
    check_values(settings, writes_output)
    path = settings.checkpoint_path()
    kind = (
        "resume"
        if settings.checkpoint.resume
        else "snapshot"
        if writes_output and left_snapshot(settings)
        else None
    )
    continued = check_continuable(settings)
    initial = check_initializable(settings, config)
    if kind is not None:
        check_resumable(path, settings.identity(), settings.parallel.fsdp)
        if continued is not None:
            check_same_continuation(path, continued)
        step = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["state"]["step"]
        how = "--resume" if kind == "resume" else "the same --snapshot-every command again"
        return Start(
            kind, path, f"resuming {path} after step {step} ({how})", path, continued_steps(continued)
        )
    if writes_output and path is not None and path.exists() and not settings.checkpoint.force:
        raise FileExistsError(
            f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over"
        )
    if continued is not None:
        why = f"continuing {continued.checkpoint}: its trained tensors, after {continued.steps} steps of the data"
        return Start("continue", continued.checkpoint, why, path, continued.steps)
    if initial is not None:
        why = f"starting from {initial}: its trained tensors, on this run's data and schedule"
        return Start("init", initial, why, path)
    return Start(
        "fresh", None, f"a fresh start: the SwiftKV parameters of --init {settings.model.init}", path
    )


def check_values(settings: DistillSettings, writes_output: bool) -> None:
    """The settings a start reads that could not mean anything, and an output that exists."""
    if writes_output and not settings.output.out:
        raise ValueError("--out is required: the folder the distilled HF SwiftKV model is written to")
    settings.check_parallelism()
    settings.check_skip()
    check_data(settings.data.spec, split=settings.data.data_split)
    if writes_output:
        check_new_output(settings.output.out, settings.checkpoint.force)
    if settings.data.passes < 1:
        raise ValueError(f"--passes {settings.data.passes}: expected a whole number of passes, at least 1")
    if settings.checkpoint.snapshot_every is not None and not settings.checkpoint.snapshot_every > 0:
        raise ValueError(
            f"--snapshot-every {settings.checkpoint.snapshot_every}: expected a number of seconds above 0"
        )
    if settings.output.profile_steps is not None and settings.output.profile_steps < 1:
        raise ValueError(
            f"--profile-steps {settings.output.profile_steps}: expected a number of steps, at least 1"
        )


def left_snapshot(settings: DistillSettings) -> bool:
    """A --snapshot-every run started again: it left a checkpoint (`snapshot.saved_checkpoint`), and
    --force does not ask to start over."""
    path = settings.checkpoint_path()
    if settings.checkpoint.snapshot_every is None or settings.checkpoint.force or path is None:
        return False
    return saved_checkpoint(path.parent, path.name) is not None


# --------------------------------------------------------------------------------------------------
# --resume (and a snapshot's rerun)
# --------------------------------------------------------------------------------------------------


def check_resumable(path: Path | None, identity: RunIdentity, fsdp: bool = False) -> Path:
    """The checkpoint at `path` exists, was written by this run (same model, same settings) and in the
    layout this run reads (sharded under --fsdp, whole otherwise)."""
    if path is None or not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; start without --resume")
    payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    differing = differing_settings(payload["fingerprint"], identity)
    if differing:
        raise ValueError(
            f"--resume: checkpoint {path} is from another model or run configuration ({differing})"
        )
    if ("shards" in payload) != fsdp:
        written = "with --fsdp (sharded)" if "shards" in payload else "without --fsdp (whole)"
        raise ValueError(
            f"--resume: checkpoint {path} was written {written}; resume it "
            f"{'with' if 'shards' in payload else 'without'} --fsdp"
        )
    return path


def check_same_continuation(path: Path, continued: Continued) -> None:
    """A resumed continuation trains the data after the steps it started after: refused if the run it
    continues has trained on since (its checkpoint now ends elsewhere in the data)."""
    started_after = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["state"][
        "continued_steps"
    ]
    if started_after != continued.steps:
        raise ValueError(
            f"--resume: this run continued {continued.checkpoint} after {started_after} steps of the data, "
            f"and that checkpoint now ends after {continued.steps}; resume with the checkpoint as it was, "
            "or start a new continuation"
        )


def differing_settings(saved: dict, identity: RunIdentity, may_change: tuple[str, ...] = ()) -> str:
    """The settings and model identity in which a checkpoint's fingerprint `saved` differs from this
    run's (those of `may_change` aside), described; empty when none does."""
    now = identity.fingerprint(by_content="source" not in saved)
    # A setting missing from an older checkpoint did not exist then: that run behaved as its default.
    then = {k: saved.get(k, SETTING_DEFAULTS.get(k)) for k in now}
    return ", ".join(
        f"{k}: checkpoint {then[k]!r} vs now {v!r}"
        for k, v in now.items()
        if then[k] != v and k not in may_change
    )


# --------------------------------------------------------------------------------------------------
# --continue-from
# --------------------------------------------------------------------------------------------------

# Settings a continuing run (--continue-from) may change: how long it trains and its optimizer's schedule.
CONTINUE_MAY_CHANGE = (
    "tokens",
    "passes",
    "continue_from",
    "lr",
    "late_lr",
    "warmup",
    "weight_decay",
    "max_grad_norm",
)


@dataclass(frozen=True)
class Continued:
    """The run a --continue-from run continues: its checkpoint and where it left the data."""

    checkpoint: Path
    steps: int  # the data's optimizer steps trained by it and by the runs it continued


def continued_steps(continued: Continued | None) -> int:
    return continued.steps if continued is not None else 0


def earlier_checkpoint(given: str, option: str) -> Path:
    """The checkpoint file an option names: an earlier run's OUT.ckpt folder or the file in it."""
    path = Path(given)
    path = path / CHECKPOINT_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(
            f"{option} {given}: no checkpoint there; expected an earlier run's OUT.ckpt folder or the "
            f"{CHECKPOINT_FILE} in it"
        )
    return path


def check_continuable(settings: DistillSettings) -> Continued | None:
    """The --continue-from checkpoint exists, was written by a run of this student on this data (every
    setting equal but those of CONTINUE_MAY_CHANGE, one pass of the same length), and leaves steps for
    this run to train."""
    if settings.model.continue_from is None:
        return None
    path = earlier_checkpoint(settings.model.continue_from, "--continue-from")
    payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    saved = payload["fingerprint"]
    differing = differing_settings(saved, settings.identity(), may_change=CONTINUE_MAY_CHANGE)
    if differing:
        raise ValueError(
            f"--continue-from {path}: that run trained another student or data ({differing}); a continuing "
            f"run may change only {', '.join(CONTINUE_MAY_CHANGE)}"
        )
    earlier = settings.but(**{k: saved.get(k, SETTING_DEFAULTS[k]) for k in ("tokens", "passes")})
    if earlier.data_tokens != settings.data_tokens:
        passes = max(2, settings.data.passes)
        raise ValueError(
            f"--continue-from {path}: its pass over the data held {earlier.data_tokens:,} train tokens and "
            f"this run's holds {settings.data_tokens:,} (--tokens / --passes); expected the same data, "
            f"e.g. --tokens {earlier.data_tokens * passes:,} with --passes {passes}"
        )
    state = payload["state"]
    steps = state.get("continued_steps", 0) + state["step"]
    if steps * settings.optim.batch_size >= settings.train_tokens // settings.data.seq_len:
        raise ValueError(
            f"--continue-from {path}: it has trained {steps * settings.optim.batch_size * settings.data.seq_len:,} "
            f"tokens of the data and this run asks for {settings.train_tokens:,} in all; ask for more "
            "--tokens (with --passes to repeat the data)"
        )
    return Continued(path, steps)


# --------------------------------------------------------------------------------------------------
# --init-from
# --------------------------------------------------------------------------------------------------

# What makes an earlier run's trained tensors this run's student (--init-from): the model both start
# from (its identity keys) and what they train.
STUDENT_SETTINGS = ("source", "trainable", "lora_rank")


def check_initializable(settings: DistillSettings, config: dict | None = None) -> Path | None:
    """The --init-from checkpoint exists and trained this student (the same model, --trainable and
    --lora-rank); every other setting may differ. A weights folder instead is checked against `config`
    (`check_weights_student`). None when there is none, or when this run continues one started from it
    (--continue-from: the tensors come from that run, whose --init-from check_continuable finds equal to
    this one's)."""
    if settings.model.init_from is None or settings.model.continue_from is not None:
        return None
    folder = weights_folder(settings.model.init_from)
    if folder is not None:
        check_weights_student(folder, settings.model, config)
        return folder
    path = earlier_checkpoint(settings.model.init_from, "--init-from")
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["fingerprint"]
    identity = settings.identity()
    others = tuple(
        k
        for k in identity.fingerprint(by_content="source" not in saved)
        if k not in STUDENT_SETTINGS and not k.startswith(MODEL_KEY)
    )
    differing = differing_settings(saved, identity, may_change=others)
    if differing:
        raise ValueError(
            f"--init-from {path}: that run trained another student ({differing}); expected the same "
            "source, --trainable and --lora-rank"
        )
    return path


def expected_spec(model: ModelSettings, config: dict) -> dict:
    """What a weights folder must say of itself to be the student of this run, whose model has `config`:
    the model it was converted from, its geometry, and what its later layers trained."""
    trained = list(STUDENT_MODULES[model.trainable])
    return {
        "base": (config.get("swiftkv_conversion") or {}).get("source", source_name(model.source)),
        "num_key_value_layers": config.get("num_key_value_layers"),
        "key_value_group_size": config.get("key_value_group_size", 1),
        "student_trained": trained or None,
        "student_rank": (model.lora_rank or DEFAULT_LORA_RANK) if trained else None,
    }


def check_weights_student(folder: Path, model: ModelSettings, config: dict | None = None) -> None:
    """Refuse a weights folder that holds another student than this run trains (another base model or
    N, another --trainable or --lora-rank). `config`: the run's model's (default: read from its source
    folder; a model built in memory is checked when the run starts, `check_model_start`)."""
    if config is None:
        if not isinstance(model.source, Source):
            return
        config = read_config_dict(model.source.folder)
    spec = folder_spec(folder)
    expected = expected_spec(model, config)
    found = {key: spec.get(key) for key in expected} | {
        "key_value_group_size": spec.get("key_value_group_size", 1)
    }
    differing = ", ".join(
        f"{key}: folder {found[key]!r} vs this run {value!r}"
        for key, value in expected.items()
        if found[key] != value
    )
    if differing:
        raise ValueError(
            f"--init-from {folder}: it holds another student than this run trains ({differing}); expected "
            "one converted from the same model with the same N, --trainable and --lora-rank"
        )


def check_model_start(start: Start, settings: DistillSettings, config: dict) -> None:
    """The start's weights folder against the model as built (a model built in memory has no source folder
    to read its config from before it is built)."""
    if start.kind == "init" and start.load is not None and start.load.is_dir():
        check_weights_student(start.load, settings.model, config)
