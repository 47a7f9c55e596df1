"""The GPU run itself (`python -m loan run STAGE --out OUT`): everything the rented GPU does, in one command,
with every result under OUT as soon as it exists, so a run cut at any moment brings back what it got.

  1. the stage checked (a missing file is named with the stage that writes it) and the teacher put
     back together from its two parts (digest checked);
  2. the device's matmul peak in the compute dtype, measured alone (every fraction of peak divides by it);
  3. the users' number: the trainer on a Llama-3.1-8B-shaped model (`shape.py`, a process of its own);
  4. the teacher's greedy replies to the staged prompts that the replies staged with them (written
     ahead on a CPU) do not answer (the static engine: a static KV cache, CUDA graphs), until they are
     all written or the writer's time is up; OUT/replies.npz.xz;
  5. every student trained in parallel, one process each (`student.py`), until the deadline; each
     replaces OUT/n<N>/ (its trained tensors and progress) at least every 2 minutes;
  6. what the students compiled, bundled into OUT/compiled.tar for the next loan (`artifacts.py`).

OUT/loan.json holds the device, the peak, the 8B numbers, the writer's speed and each student's latest
progress; it is rewritten after every phase. `--device cpu` is the dry-run the suite runs on a tiny
teacher. A run given `--resume PREVIOUS_OUT` reuses the replies written there and continues each student
from its snapshot, its layers compiled from the bundle there.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import io
import json
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from swiftkv.distill import AUTO, parse_micro_batch, read_progress, reason_of
from swiftkv.dtypes import dtype_name, resolve_dtype
from swiftkv.files import write_atomic
from swiftkv.peaks import matmul_peak
from swiftkv.replies import hf_generator
from swiftkv.replies.static_greedy import static_generator
from swiftkv.settings import parse_count, setting
from swiftkv.sources import open_source

from . import module_command
from .artifacts import bundle_artifacts
from .stage import (
    BLOCKS_FILE,
    PARTS,
    PROMPTS_FILE,
    REPLIES_FILE,
    SITE_FILE,
    STAGE_FILE,
    TEACHER_TAR,
    decode_ids,
    encode_lists,
    need,
    staged,
)
from .student import StudentRun, check_resume, run_file

REPORT_FILE = "loan.json"
# Prompts per call of the writer: the deadline is checked between calls.
WRITER_CHUNK = {"cuda": 4096, "cpu": 64}
WRITER_ROWS = {"cuda": 512, "cpu": 16}  # rows of one static-cache batch
END_MARGIN_SECONDS = 25  # kept after the students' deadline for their last snapshot and this report


@dataclass
class LoanSettings:
    stage: str = setting(
        None, "the stage folder (part1/ and part2/, as `python -m loan stage` wrote them)", cli=False
    )
    out: str | None = setting(None, "where results go as they come (what the GPU run brings back)")
    minutes: float = setting(9.0, "wall minutes of the whole command; the students stop before its end")
    device: str = setting("cuda", "cuda, or cpu for the dry-run", choices=("cuda", "cpu"))
    students: str = setting("15,22", "the students' N (num_key_value_layers), trained in parallel")
    recipe: str = setting("swiftkv-lora", "the students' recipe (distill's --recipe)")
    tokens: int = setting(
        32_000_000, "train tokens per student (the data is repeated if shorter)", parse=parse_count
    )
    batch_size: int = setting(8, "blocks per optimizer step (the larger step of docs/distillation.md)")
    micro_batch: int | str = setting(
        AUTO, "blocks per forward, or auto (the largest that fits)", parse=parse_micro_batch
    )
    lr: float = setting(4e-3, "peak rate of the SwiftKV parameters at --batch-size 8")
    late_lr: float = setting(2e-3, "peak rate of the student-only adapters at --batch-size 8")
    compile: bool = setting(
        True,
        "distill's --compile for the students (each decoder layer through torch.compile; the first failure "
        "falls back to the plain layers, with the reason printed)",
    )
    writer_minutes: float = setting(2.5, "most minutes the teacher's replies may take")
    writer_compile: bool = setting(
        True,
        "compile the writer's decode step into one CUDA graph (compiled once, for its one shape; if the first "
        "loan's log shows the compile outweighing the steps, a later loan runs it eagerly with --no-writer-compile)",
    )
    shape: str = setting("llama-3.1-8b", "the users' shape measured first (`none` skips it)")
    shape_seconds: float = setting(
        20.0, "timed seconds of the shape's steps (eager, as `swiftkv distill` runs)"
    )
    shape_seq_len: int = setting(4096, "tokens per block of the shape's steps")
    snapshot_seconds: float = setting(110.0, "most seconds between a student's snapshots")
    resume: str | None = setting(
        None, "a previous loan's OUT: its replies are reused, its students continued"
    )
    stop_after: int | None = setting(
        None, "stop each student (snapshotted) after this many steps: a slice of the run"
    )


@dataclass
class Report:
    """OUT/loan.json, rewritten after every phase."""

    settings: dict
    device: str = ""
    compute_dtype: str = ""
    matmul_peak_flops: float | None = None
    stage: dict = field(default_factory=dict)
    shape: dict | None = None
    replies: dict | None = None
    students: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def write(self, out: Path) -> None:
        write_atomic(out / REPORT_FILE, json.dumps(asdict(self), indent=2) + "\n")


def run_loan(settings: LoanSettings) -> Report:
    started = time.time()
    end = started + settings.minutes * 60
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(settings.stage)
    manifest = json.loads(staged(stage, STAGE_FILE).read_text())
    for name in (PROMPTS_FILE, BLOCKS_FILE):
        staged(stage, name)
    teacher_path = assemble_teacher(stage, manifest)
    device = torch.device(settings.device)
    dtype = resolve_dtype("auto", device)
    say(dtype_line(device, dtype))
    report = Report(
        asdict(settings), device=device_name(device), compute_dtype=dtype_name(dtype), stage=manifest
    )
    runs = student_runs(settings, stage, manifest, teacher_path, end - END_MARGIN_SECONDS)
    report.matmul_peak_flops = round(matmul_peak(dtype, device=device))
    for run in runs:
        run.peak_flops = report.matmul_peak_flops
    say(f"{report.device}: {dtype_name(dtype)} matmul peak {report.matmul_peak_flops / 1e12:.1f} TFLOP/s")
    report.seconds["setup"] = round(time.time() - started, 1)
    report.write(out)
    if settings.shape != "none":
        report.shape = measure_shape(settings, report.matmul_peak_flops)
        report.seconds["shape"] = round(time.time() - started, 1)
        report.write(out)
    report.replies = write_teacher_replies(settings, stage, manifest, teacher_path, dtype, out)
    report.seconds["replies"] = round(time.time() - started, 1)
    report.write(out)
    open_source(teacher_path)  # the teacher's HF folder built once, before the students load it
    report.students = train_students(runs, stage, out, report)
    report.seconds["students"] = round(time.time() - started, 1)
    report.write(out)
    return report


def assemble_teacher(stage: Path, manifest: dict) -> Path:
    """The teacher's two parts joined, checked against the staged digest, unpacked beside the stage. A GGUF
    teacher needs the `gguf` package, which the GPU machine may lack: the stage carries it (part2/site.tar.xz), and it
    must be on PYTHONPATH before Python starts (transformers checks for it once), as gpu_students.sh does."""
    parts = [
        need(
            stage / "part1" / f"{TEACHER_TAR}.0", "`python -m loan stage` (part1, carried by the first call)"
        ),
        staged(stage, f"{TEACHER_TAR}.1"),
    ]
    if manifest["teacher"]["path"].endswith(".gguf") and importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(
            f"the teacher is a GGUF file and the gguf package is not importable here; unpack "
            f"{stage}/part2/{SITE_FILE} into a folder on PYTHONPATH before starting (gpu_students.sh run does)"
        )
    work = stage / "work"
    work.mkdir(exist_ok=True)
    data = b"".join(part.read_bytes() for part in parts)
    if hashlib.sha256(data).hexdigest() != manifest["teacher"]["tar_sha256"]:
        raise ValueError(
            f"the teacher's parts in {stage}/{'|'.join(PARTS)} do not join into the staged teacher (digest "
            "differs): both parts must come from the same `python -m loan stage` run"
        )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(work, filter="data")
    return work / manifest["teacher"]["path"]


def dtype_line(device: torch.device, dtype: torch.dtype) -> str:
    """The compute dtype, with the reason when it is not bf16 on a GPU (never a silent slow path)."""
    if device.type == "cuda" and dtype != torch.bfloat16:
        return f"compute dtype {dtype_name(dtype)}: this GPU ({device_name(device)}) does not support bf16"
    return f"compute dtype {dtype_name(dtype)} on {device_name(device)}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def measure_shape(settings: LoanSettings, peak: float) -> dict:
    """The shape's numbers from its own process (its 8B model leaves with it), or the reason it failed."""
    command, env = module_command(
        "shape",
        "--shape",
        settings.shape,
        "--seconds",
        str(settings.shape_seconds),
        "--seq-len",
        str(settings.shape_seq_len),
        "--device",
        settings.device,
        "--peak-flops",
        str(peak),
        "--out",
        str(Path(settings.out) / "shape.json.tmp"),
    )
    say(f"shape {settings.shape}: seq {settings.shape_seq_len}, {settings.shape_seconds:.0f} s of steps")
    result_path = Path(settings.out) / "shape.json.tmp"
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=settings.shape_seconds + 120
        )
        error = None if done.returncode == 0 and result_path.is_file() else done.stderr[-2000:]
    except subprocess.TimeoutExpired:
        error = f"no result within {settings.shape_seconds + 120:.0f} s"
    if error is not None:
        say(f"shape {settings.shape} failed: {error}")
        return {"shape": settings.shape, "error": error}
    result = json.loads(result_path.read_text())
    result_path.unlink()
    say(
        f"shape {settings.shape}: {result['tokens_per_second']:,.0f} tok/s = {result['fraction_of_bound']:.1%} of peak, "
        f"{result['peak_memory_mib'] / 1024:.1f} GiB peak, {result['gpu_hours_per_100m_tokens']} GPU-hours per 100M tokens"
    )
    return result


def write_teacher_replies(
    settings, stage: Path, manifest: dict, teacher_path: Path, dtype, out: Path
) -> dict:
    """The teacher's greedy replies to the staged prompts, in order, until all are written or the
    writer's minutes are up (those written before are reused); OUT/replies.npz.xz."""
    prompts = decode_ids(staged(stage, PROMPTS_FILE).read_bytes())
    reused = replies_written_before(settings, stage)
    if reused:
        say(f"replies: {len(reused)} of {len(prompts)} written before this loan")
    written: list[list[int]] = []
    kind = settings.device
    started = time.time()
    if len(reused) < len(prompts):
        folder, reply_tokens, eos = (
            open_source(teacher_path).folder,
            manifest["settings"]["reply_tokens"],
            manifest["tokenizer_eos"],
        )
        engine, generate = "static", None
        stop = started + settings.writer_minutes * 60
        while len(reused) + len(written) < len(prompts) and time.time() < stop:
            done = len(reused) + len(written)
            try:  # the static engine, built at its first chunk; transformers' generate if it fails
                generate = generate or static_generator(
                    folder,
                    reply_tokens,
                    dtype,
                    eos,
                    WRITER_ROWS[kind],
                    kind,
                    compile_step=settings.writer_compile,
                )
                written += [reply.ids for reply in generate(prompts[done : done + WRITER_CHUNK[kind]])]
            except Exception as error:  # noqa: BLE001 - transformers' generate still writes
                if engine != "static":
                    raise
                engine, generate = fallback_writer(error, folder, reply_tokens, dtype, eos, kind)
                continue
            seconds = time.time() - started  # the first chunk's includes compiling the decode step
            say(
                f"replies: {len(reused) + len(written)} of {len(prompts)} ({len(written) / seconds:.0f}/s, {seconds:.0f} s)"
            )
        del generate
        gc.collect()
        if kind == "cuda":
            torch.cuda.empty_cache()
    seconds = time.time() - started
    write_atomic(out / REPLIES_FILE, encode_lists(reused + written))
    return {
        "engine": engine if written else None,
        "prompts": len(prompts),
        "reused": len(reused),
        "written": len(written),
        "reply_tokens": sum(map(len, reused + written)),
        "seconds": round(seconds, 1),
        "replies_per_second": round(len(written) / seconds, 1) if written else None,
    }


def replies_written_before(settings: LoanSettings, stage: Path) -> list[list[int]]:
    """A resumed loan's replies (they begin with any staged ones), else those staged (written ahead on a
    CPU), else none."""
    if settings.resume:
        return decode_ids(need(Path(settings.resume) / REPLIES_FILE, "the loan --resume names").read_bytes())
    ahead = stage / "part2" / REPLIES_FILE
    return decode_ids(ahead.read_bytes()) if ahead.is_file() else []


def fallback_writer(error: Exception, folder, reply_tokens: int, dtype, eos: int, kind: str):
    """transformers' generate, when the static engine fails on this machine (said, with the reason)."""
    say(f"static engine failed ({reason_of(error)}); writing with transformers' generate")
    return "hf", hf_generator(folder, reply_tokens, dtype, eos, kind)


def student_runs(
    settings: LoanSettings, stage: Path, manifest: dict, teacher_path: Path, deadline: float
) -> list[StudentRun]:
    """One run per student, each checked against the snapshot it resumes before any work."""
    out = Path(settings.out)
    runs = [
        StudentRun(
            teacher=str(teacher_path),
            teacher_digest=manifest["teacher"]["tar_sha256"],
            teacher_name=manifest["teacher"]["name"],
            blocks=str(staged(stage, BLOCKS_FILE)),
            prompts=str(staged(stage, PROMPTS_FILE)),
            replies=str(out / REPLIES_FILE),
            out=str(out / f"n{n}"),
            num_key_value_layers=n,
            deadline=deadline,
            device=settings.device,
            recipe=settings.recipe,
            tokens=settings.tokens,
            seq_len=manifest["settings"]["seq_len"],
            batch_size=settings.batch_size,
            micro_batch=settings.micro_batch,
            lr=settings.lr,
            late_lr=settings.late_lr,
            seed=manifest["settings"]["seed"],
            snapshot_seconds=settings.snapshot_seconds,
            resume=str(Path(settings.resume) / f"n{n}") if settings.resume else None,
            stop_after=settings.stop_after,
            compile=settings.compile,
            artifacts=str(stage / "work" / f"compiled-n{n}.xz"),
        )
        for n in [int(text) for text in settings.students.split(",")]
    ]
    for run in runs:
        if run.resume:
            check_resume(run, read_progress(run.resume))
    return runs


def train_students(runs: list[StudentRun], stage: Path, out: Path, report: Report) -> dict:
    """Every student in its own process until the deadline; their latest progress by N."""
    processes = {}
    for run in runs:
        path = run_file(run, stage / "work" / f"student-n{run.num_key_value_layers}.json")
        command, env = module_command("student", str(path))
        processes[run.num_key_value_layers] = subprocess.Popen(command, env=env)
    for n, process in processes.items():
        try:
            code = process.wait(timeout=max(1.0, runs[0].deadline - time.time() + END_MARGIN_SECONDS - 5))
        except subprocess.TimeoutExpired:
            process.kill()
            code = "killed at the command's end"
        report.students = {**report.students, n: student_result(out / f"n{n}", code)}
        report.write(out)
    bundle_artifacts([Path(run.artifacts) for run in runs if run.artifacts], out, say)
    return report.students


def student_result(folder: Path, code) -> dict:
    """A student's latest snapshot progress (no loss history) and its process's exit."""
    if not (folder / "0.safetensors").is_file():
        return {"exit": code, "snapshot": None}
    progress = read_progress(folder)
    return {"exit": code, **{k: v for k, v in progress.items() if k != "loss"}}


def say(text: str) -> None:
    print(f"[loan {time.strftime('%H:%M:%S')}] {text}", flush=True)
