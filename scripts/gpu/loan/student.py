"""One student of a loan, in its own process (`python -m loan.student RUN.json`, started by
`students.py`), so the students share the GPU and a failure of one leaves the others training.

The student is built on the device from the teacher: the SwiftKV geometry and convert's lstsq init,
fitted on the staged calibration blocks. It trains with distill's own pieces (`trainer.prepare`,
`train_step`, `evaluate`, `lr_at`: the recipe's trainable set, loss and schedule) on packed blocks of the
staged prompts and the replies written in this loan, repeated in new seeded orders when the data is
shorter than the run. Every `snapshot_seconds`, and at the deadline, it scores the held-out blocks and
replaces its snapshot (`swiftkv.distill.start.snapshot`, in files of at most SNAPSHOT_FILE_BYTES).

A run resumes from a snapshot: the trained tensors exactly, the data order and the schedule from its
step, and a fresh optimizer whose rate warms up again over `rewarm_steps` (AdamW's moments, twice the
trained tensors in fp32, do not fit what a run brings back). A resume with another step, schedule or data is
refused, naming the setting.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from swiftkv.convert import ConvertSettings
from swiftkv.convert.calibration import lstsq_params, teacher_stats
from swiftkv.data.packing import Blocks, in_passes, pack
from swiftkv.data.tokens import Document
from swiftkv.distill import (
    BatchSizes,
    DistillSettings,
    Prepared,
    World,
    compiled_artifacts,
    device_peak,
    evaluate,
    load_trained_set,
    lr_at,
    prepare,
    profile_steps,
    read_snapshot,
    settings_for,
    step_flops_per_token,
    train_step,
    write_snapshot,
)
from swiftkv.dtypes import autocast, dtype_name, resolve_dtype
from swiftkv.files import write_atomic
from swiftkv.model.surgery import build_swiftkv_model, copy_init_params, load_trained
from swiftkv.sources import open_source

from .artifacts import BUNDLE_FILE, load_bundle
from .stage import decode_ids

# The files a run brings back are at most outputs.MAX_FILE_BYTES each; a snapshot's files stay under it.
SNAPSHOT_FILE_BYTES = 15 * 2**20
PROFILED_STEPS = 3  # steps profiled after the first speed line (swiftkv.distill.measure.profile)
RIDGE = ConvertSettings.ridge  # convert's default: the same lstsq init as `swiftkv convert --init lstsq`
# What a resumed run must share with the snapshot it continues: the student, the data, the step, the schedule.
RESUME_KEYS = (
    "teacher_digest",
    "num_key_value_layers",
    "recipe",
    "tokens",
    "seq_len",
    "batch_size",
    "lr",
    "late_lr",
    "warmup",
    "seed",
)


@dataclass
class StudentRun:
    teacher: str  # the teacher's path here (a .gguf file or an HF folder)
    teacher_digest: str  # the staged teacher's sha256: a resume must train the same teacher's student
    blocks: str  # the staged blocks.pt (calibration + held-out)
    prompts: str  # the staged prompts.npz.xz
    replies: str  # the replies written in this loan (replies.npz.xz), aligned with the prompts
    out: str  # this student's snapshot folder
    num_key_value_layers: int
    deadline: float  # unix time at which the run stops, snapshotted
    device: str = "cuda"
    recipe: str = "swiftkv-lora"
    tokens: int = 32_000_000
    seq_len: int = 1024
    batch_size: int = 8
    micro_batch: int | str = "auto"
    lr: float = 4e-3
    late_lr: float = 2e-3
    warmup: float = 0.05
    seed: int = 0
    snapshot_seconds: float = 110.0  # at most 2 minutes between snapshots, one held-out pass included
    first_report_seconds: float = 30.0  # timed steps before the first tok/s line
    rewarm_steps: int = 50
    compile: bool = False  # distill's --compile (each decoder layer through torch.compile, falling back)
    peak_flops: float | None = None  # the device's matmul peak, measured once, alone, by students.py
    resume: str | None = None  # a snapshot folder to continue
    stop_after: int | None = None  # stop (snapshotted) after this many steps: a slice of the run
    teacher_name: str | None = None  # the teacher as the stage named it (an alias there): install's default
    artifacts: str | None = None  # where it keeps its compiled layers at each snapshot (loan/artifacts.py)


@dataclass
class Timing:
    """Train tokens and seconds of this process's steps after its first (which allocates and compiles)."""

    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float | None:
        return round(self.tokens / self.seconds, 1) if self.seconds else None


@dataclass
class Session:
    """One student's training as it runs: the model, its blocks, the prepared step and its progress."""

    run: StudentRun
    world: World
    model: torch.nn.Module
    train: Blocks
    heldout: Blocks
    prepared: Prepared
    trained: dict[str, torch.nn.Parameter]
    progress: dict
    bound: dict  # FLOPs per token and the device's matmul peak
    timing: Timing

    def step(self, step: int, start: int) -> None:
        """Optimizer step `step` (a resumed run's rate re-warms from `start`), timed after its first."""
        run, (distiller, optimizer, step_settings, compiled) = self.run, self.prepared
        began = time.perf_counter()
        for group in optimizer.param_groups:
            peak = lr_at(step, self.progress["total_steps"], group["peak_lr"], run.warmup)
            group["lr"] = peak * rewarm(step - start, run)
        blocks = self.train.select(slice(step * run.batch_size, (step + 1) * run.batch_size))
        sizes = BatchSizes.of(blocks)
        loss = compiled.run(
            train_step,
            distiller,
            self.model,
            optimizer,
            blocks,
            sizes,
            step_settings,
            self.world,
        )
        if self.world.device.type == "cuda":
            torch.cuda.synchronize()
        if step > start:
            self.timing.tokens += blocks.num_tokens
            self.timing.seconds += time.perf_counter() - began
        self.progress["loss"].append([step + 1, round(loss, 4)])

    def score(self, step: int) -> None:
        """Held-out KL / top-1 at `step`, into the progress."""
        _, _, step_settings, compiled = self.prepared
        scores = compiled.run(evaluate, self.model, self.heldout, step_settings, self.world)
        self.progress["heldout"].append({"step": step, **scores})

    def snapshot(self, step: int) -> None:
        """Score the held-out blocks and replace the snapshot with this step's tensors and progress."""
        self.progress |= {
            "step": step,
            "train_tokens": step * self.run.batch_size * self.run.seq_len,
            "tokens_per_second": self.timing.tokens_per_second,
        }
        self.score(step)
        self.progress["speed"] = speed_of(self.timing, self.bound)
        write_snapshot(Path(self.run.out), self.trained, self.progress, SNAPSHOT_FILE_BYTES)
        say(self.run, f"snapshot at step {step}: held-out {json.dumps(self.progress['heldout'][-1])}")
        if self.run.artifacts and self.prepared.compiled.active:
            artifacts = compiled_artifacts(lambda line: say(self.run, line))
            if artifacts:
                write_atomic(self.run.artifacts, artifacts)


def train_student(run: StudentRun) -> dict:
    """Train until the run's tokens, its `stop_after` or its deadline; returns the last progress written."""
    session = start_session(run)
    start = resume_into(run, session.progress, session.model, session.trained) if run.resume else 0
    if not run.resume:
        session.score(0)
    total = session.progress["total_steps"]
    say(
        run,
        f"{len(session.train)} blocks: {total} steps of {run.batch_size} x {run.seq_len}, from step {start}",
    )
    last = total if run.stop_after is None else min(total, run.stop_after)
    reported, last_snapshot, step = False, time.time(), start
    while step < last and time.time() < run.deadline:
        session.step(step, start)
        step += 1
        if not reported and session.timing.seconds >= run.first_report_seconds:
            reported = True
            say(run, speed_line(speed_of(session.timing, session.bound)))
            if step + PROFILED_STEPS <= last:
                step = profiled(session, step, start)
        if time.time() - last_snapshot >= run.snapshot_seconds:
            session.snapshot(step)
            last_snapshot = time.time()
    session.snapshot(step)
    say(run, speed_line(speed_of(session.timing, session.bound)))
    return session.progress


def profiled(session: Session, step: int, start: int) -> int:
    """PROFILED_STEPS more steps under the profiler, its report printed (or why it failed) and those steps
    kept out of the timing; the step after the last one that ran."""
    timing, done = replace(session.timing), []

    def one(index: int) -> None:
        session.step(index, start)
        done.append(index)

    try:
        say(session.run, profile_steps(one, range(step, step + PROFILED_STEPS), session.world.device))
    except Exception as error:  # the profiler is a diagnosis: the run trains on without it
        say(session.run, f"profile failed ({type(error).__name__}: {error}); training on unprofiled")
    session.timing = timing
    return step + len(done)


def start_session(run: StudentRun) -> Session:
    """The student built on the device (lstsq init), its blocks, distill's prepared step, a fresh progress."""
    device = torch.device(run.device)
    teacher = open_source(run.teacher)
    staged = torch.load(run.blocks)
    settings = distill_settings(run, teacher.name)
    dtype = resolve_dtype(settings.parallel.dtype, device)
    model = lstsq_student(teacher, run.num_key_value_layers, staged["calibration"], device, dtype)
    train, data_digest = train_blocks(run, teacher.load_tokenizer())
    progress = new_progress(run, settings, len(train) // run.batch_size, data_digest, device)
    world = World(device=device)
    if run.compile and run.resume:  # before the first compiled call, so that the layers compile from it
        load_bundle(Path(run.resume).parent / BUNDLE_FILE, lambda line: say(run, line))
    prepared = prepare(settings, model, train, world)
    progress |= {"micro_batch": prepared.step.micro_batch, "compiled": prepared.compiled.active}
    return Session(
        run,
        world,
        model,
        train,
        Blocks(**staged["heldout"]),
        prepared,
        {name: p for name, p in model.named_parameters() if p.requires_grad},
        progress,
        speed_bound(model.config, settings, train, dtype, device, run.peak_flops),
        Timing(),
    )


def distill_settings(run: StudentRun, teacher_name: str) -> DistillSettings:
    """The run's distill settings: its recipe, at the loan's step and rates."""
    return settings_for(
        teacher_name,
        run.recipe,
        seq_len=run.seq_len,
        batch_size=run.batch_size,
        micro_batch=run.micro_batch,
        lr=run.lr,
        late_lr=run.late_lr,
        warmup=run.warmup,
        seed=run.seed,
        tokens=run.tokens,
        compile=run.compile,
    )


def lstsq_student(teacher, num_key_value_layers: int, calibration: torch.Tensor, device, dtype):
    """The SwiftKV student over the teacher's weights with convert's lstsq init (copy init first: lstsq
    fits through its norm_swiftkv), fitted on `device` in the compute dtype. `trainer.prepare` installs
    the recipe's trainable set on it."""
    model = build_swiftkv_model(teacher.load_model(torch.float32), num_key_value_layers, 1).to(device)
    load_trained(model, copy_init_params(model))
    with autocast(dtype, device):
        stats = teacher_stats(model, [block.to(device) for block in calibration], desc="calibration (fit)")
    load_trained(model, lstsq_params(model, stats, RIDGE))
    return model


def train_blocks(run: StudentRun, tokenizer) -> tuple[Blocks, str]:
    """(blocks, digest of the documents): prompt + written reply documents (only the reply trains),
    packed as distill packs them, in passes of new seeded orders (`in_passes`) until the run's tokens."""
    prompts_data, replies_data = Path(run.prompts).read_bytes(), Path(run.replies).read_bytes()
    prompts, replies = decode_ids(prompts_data), decode_ids(replies_data)
    documents = [
        Document(prompt + reply, [False] * len(prompt) + [True] * len(reply))
        for prompt, reply in zip(prompts, replies, strict=False)  # the writer may have stopped early
        if reply
    ]
    if not documents:
        raise ValueError(f"{run.replies} holds no replies: the loan wrote none before the students started")
    digest = hashlib.sha256(prompts_data + replies_data).hexdigest()[:16]  # what the documents are made of
    wanted = -(-run.tokens // (run.batch_size * run.seq_len)) * run.batch_size
    return in_passes(pack(documents, run.seq_len), wanted, run.seed), digest


def new_progress(
    run: StudentRun, settings: DistillSettings, total_steps: int, data_digest: str, device
) -> dict:
    return {
        "teacher": run.teacher,
        "teacher_digest": run.teacher_digest,
        "teacher_name": run.teacher_name,
        "num_key_value_layers": run.num_key_value_layers,
        "key_value_group_size": 1,
        "recipe": run.recipe,
        "trainable": settings.model.trainable,
        "lora_rank": settings.model.lora_rank,
        "tokens": run.tokens,
        "seq_len": run.seq_len,
        "batch_size": run.batch_size,
        "lr": run.lr,
        "late_lr": run.late_lr,
        "warmup": run.warmup,
        "seed": run.seed,
        "total_steps": total_steps,
        "data_digest": data_digest,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "compute_dtype": dtype_name(resolve_dtype(settings.parallel.dtype, device)),
        "resumed_from": run.resume,
        "step": 0,
        "heldout": [],
        "loss": [],
    }


def check_resume(run: StudentRun, previous: dict) -> None:
    """Refuse (naming the setting) a resume from a snapshot whose progress, `previous`, was trained with
    another teacher, student, data or schedule: checked before a loan does any work."""
    for key in RESUME_KEYS:
        if previous.get(key) != getattr(run, key):
            raise ValueError(
                f"--resume {run.resume}: its {key} is {previous.get(key)!r}, this run's is {getattr(run, key)!r}; "
                "a resumed run keeps the teacher, the step, the schedule and the data of the run it continues"
            )


def resume_into(run: StudentRun, progress: dict, model, trained: dict[str, torch.nn.Parameter]) -> int:
    """Load a snapshot's tensors into the installed trainable set; returns the step to continue from."""
    tensors, previous = read_snapshot(run.resume)
    check_resume(run, previous)
    if previous["data_digest"] != progress["data_digest"]:
        raise ValueError(
            f"--resume {run.resume}: it trained on other documents (the staged prompts or the written replies "
            "differ); resume with the stage and the replies of the loan it came from"
        )
    load_trained_set(model, trained, tensors, run.resume)
    progress["heldout"] = previous["heldout"]
    progress["loss"] = previous["loss"]
    return previous["step"]


def rewarm(steps_done: int, run: StudentRun) -> float:
    """The fresh optimizer of a resumed run warms up again (1 for a run from step 0)."""
    return 1.0 if not run.resume else min(1.0, (steps_done + 1) / run.rewarm_steps)


def speed_bound(config, settings, train, dtype, device, peak_flops) -> dict:
    """FLOPs per train token of the student's step on its blocks, and the device's matmul peak (`peak_flops`:
    measured alone by students.py; else measured here), which `speed_of` puts a rate against."""
    return {
        "flops_per_token": round(step_flops_per_token(config, settings, train)),
        "matmul_peak_flops": round(peak_flops or device_peak(dtype, device)),
    }


def speed_of(timing: Timing, bound: dict) -> dict:
    rate = timing.tokens_per_second or 0.0
    return {
        "tokens_per_second": rate,
        "flops_per_token": bound["flops_per_token"],
        "matmul_peak_flops": bound["matmul_peak_flops"],
        "fraction_of_peak": round(rate * bound["flops_per_token"] / bound["matmul_peak_flops"], 4),
    }


def speed_line(speed: dict) -> str:
    return (
        f"{speed['tokens_per_second']:,.0f} tok/s = {speed['fraction_of_peak']:.1%} of the "
        f"{speed['matmul_peak_flops'] / 1e12:.1f} TFLOP/s matmul peak ({speed['flops_per_token'] / 1e9:.2f} GFLOP/token)"
    )


def say(run: StudentRun, text: str) -> None:
    print(f"[N={run.num_key_value_layers}] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run = StudentRun(**json.loads(Path(argv[0]).read_text()))
    train_student(run)
    return 0


def run_file(run: StudentRun, path: Path) -> Path:
    path.write_text(json.dumps(asdict(run), indent=2))
    return path


if __name__ == "__main__":
    sys.exit(main())
