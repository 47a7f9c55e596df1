"""The students' GPU run (scripts/gpu/loan, scripts/gpu/gpu_students.sh): staged here, run in its CPU mode
on a tiny GGUF teacher by the same script a GPU runs, then what it brought back installed and loaded. The
stage's parts are cut as on a real run (the teacher split across both)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swiftkv.data.chat import read_source
from swiftkv.data.split import shuffled, take_documents
from swiftkv.data.tokens import turn_prompts
from swiftkv.distill.start.snapshot import install, read_snapshot
from swiftkv.model.config import is_swiftkv
from swiftkv.model.modeling import swiftkv_parameters
from swiftkv.sources import load_model, load_tokenizer
from tests.tiny import byte_tokenizer, random_chats, random_teacher, write_jsonl, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))  # the scripts import as a user's code does: from their folder

from loan.artifacts import BUNDLE_FILE, bundle_artifacts, load_bundle  # noqa: E402
from loan.stage import MIB, TRANSFER_MIB, StageSettings, decode_ids, encode_lists, write_stage  # noqa: E402
from loan.student import StudentRun, train_student  # noqa: E402
from outputs import output_problems  # noqa: E402

pytestmark = pytest.mark.timeout(900)

SCRIPT = SCRIPTS / "gpu_students.sh"
SEQ_LEN, REPLY_TOKENS = 256, 16
# The tree beside each part, chosen so that the tiny teacher (~1 MiB) is cut across both parts.
TREE_MIB = TRANSFER_MIB - 1 - 0.7


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loan")
    tokenizer = byte_tokenizer()
    teacher = random_teacher("llama", vocab_size=len(tokenizer), max_position_embeddings=2048)
    gguf = write_tiny_gguf(folder / "tiny.gguf", teacher, tokenizer, "tiny-llama")
    chats = write_jsonl(folder / "chats.jsonl", random_chats(120, turns=3, words=10))
    settings = StageSettings(
        teacher=str(gguf),
        out=str(folder / "stage"),
        data=str(chats),
        tokens=30_000,
        heldout_tokens=1024,
        seq_len=SEQ_LEN,
        reply_tokens=REPLY_TOKENS,
        calib_tokens=1024,
        tree_mib=TREE_MIB,
    )
    return folder, settings, write_stage(settings)


def test_the_stage_holds_every_train_prompt_in_two_parts_under_the_transfer_limit(staged):
    folder, settings, manifest = staged
    stage = Path(settings.out)
    assert (stage / "part1" / "teacher.tar.0").stat().st_size > 0
    assert (stage / "part2" / "teacher.tar.1").stat().st_size > 0  # the teacher is cut across both parts
    for part in ("part1", "part2"):
        size = sum(f.stat().st_size for f in (stage / part).iterdir())
        assert size + TREE_MIB * MIB <= TRANSFER_MIB * MIB
    # The prompts are distill's every-turn prompts of the same split, in order, stored once per chat.
    tokenizer = load_tokenizer(str(folder / "tiny.gguf"))
    rest = iter(shuffled(read_source(settings.data), settings.seed))
    take_documents(rest, tokenizer, settings.heldout_tokens)
    expected = [ids for example in rest for _, ids in turn_prompts(tokenizer, example, every_turn=True)]
    prompts = decode_ids((stage / "part2" / "prompts.npz.xz").read_bytes())
    assert prompts == expected[: len(prompts)] and len(prompts) == manifest["prompts"]["prompts"] > 100


def test_a_stage_two_transfers_cannot_hold_is_refused_before_writing(staged, tmp_path):
    _, settings, _ = staged
    too_big = StageSettings(
        **{**settings.__dict__, "out": str(tmp_path / "s"), "tree_mib": TRANSFER_MIB - 1.3}
    )
    with pytest.raises(ValueError, match="more than two transfers hold"):
        write_stage(too_big)
    assert not (tmp_path / "s").exists()


def dry_run(stage: Path, out: Path, args: str, **environment) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DRY": "1",
        "STAGE": str(stage),
        "OUT": str(out),
        "ARGS": args,
        "PYTHON": sys.executable,
        **environment,
    }
    return subprocess.run(["bash", str(SCRIPT), "run"], env=env, capture_output=True, text=True, timeout=600)


def test_the_loan_script_trains_both_students_and_what_it_brings_back_installs(staged, tmp_path):
    folder, settings, _ = staged
    out = tmp_path / "out"
    args = (
        "--minutes 4 --students 3,4 --shape tiny --shape-seconds 2 --shape-seq-len 256 --batch-size 2 "
        "--tokens 40k --snapshot-seconds 8 --writer-minutes 0.5 --no-compile"
    )
    result = dry_run(Path(settings.out), out, args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "loan.json").read_text())
    assert report["device"] == "cpu" and report["matmul_peak_flops"] > 0
    assert report["shape"]["tokens_per_second"] > 0 and report["shape"]["fraction_of_bound"] > 0
    assert report["replies"]["written"] == report["replies"]["prompts"]
    for n in ("3", "4"):
        student = report["students"][n]
        assert student["exit"] == 0 and student["step"] == student["total_steps"] == 79
        assert student["heldout"][0]["step"] == 0 and student["heldout"][-1]["step"] == 79
        assert student["speed"]["fraction_of_peak"] > 0
    log = (out / "loan.log").read_text()
    assert "tok/s =" in log and "of the" in log  # the speed line, printed as the students run
    # What a GPU run brings back: at most 8 files, each under 16 MiB, at most 2 folders down (the script
    # checks it too, and its exit code 0 says it found none over).
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * MIB for p in files)
    assert all(len(p.relative_to(out).parts) <= 3 for p in files)
    assert output_problems(out) == []
    tensors, progress = read_snapshot(out / "n3")
    installed = install(out / "n3", tmp_path / "n3-folder", teacher=str(folder / "tiny.gguf"))
    model = load_model(installed)
    assert is_swiftkv(model) and model.config.num_key_value_layers == 3
    own = swiftkv_parameters(model)
    for name, tensor in tensors.items():
        if name in own:
            assert torch.equal(own[name].detach(), tensor.float())
    teacher = load_model(str(folder / "tiny.gguf"))
    later = model.config.later_layers[0]
    merged = model.model.layers[later].self_attn.o_proj.weight
    assert not torch.equal(merged, teacher.model.layers[later].self_attn.o_proj.weight)  # the adapter, merged
    with torch.no_grad():
        logits = model(torch.tensor([[1, 40, 41, 42]])).logits
    assert torch.isfinite(logits).all() and progress["step"] == 79
    assert progress["teacher_name"] == settings.teacher  # what `install` falls back to elsewhere


def student_run(settings: StageSettings, folder: Path, out: Path, **changes) -> StudentRun:
    stage = Path(settings.out)
    return StudentRun(
        **{
            "teacher": str(folder / "tiny.gguf"),
            "teacher_digest": "tiny",
            "blocks": str(stage / "part2" / "blocks.pt"),
            "prompts": str(stage / "part2" / "prompts.npz.xz"),
            "replies": str(folder / "replies.npz.xz"),
            "out": str(out),
            "num_key_value_layers": 4,
            "deadline": 2e9,
            "device": "cpu",
            "tokens": 20_000,
            "seq_len": SEQ_LEN,
            "batch_size": 2,
            "snapshot_seconds": 1e9,
            "rewarm_steps": 3,
            **changes,
        }
    )


def write_prompt_tails_as_replies(settings: StageSettings, folder: Path) -> None:
    """Each staged prompt's last tokens as its reply: a student's data without running a writer."""
    prompts = decode_ids((Path(settings.out) / "part2" / "prompts.npz.xz").read_bytes())
    (folder / "replies.npz.xz").write_bytes(encode_lists([p[-REPLY_TOKENS:] for p in prompts]))


def test_a_cut_run_resumes_from_its_snapshot_and_a_changed_schedule_is_refused(staged, tmp_path):
    folder, settings, _ = staged
    write_prompt_tails_as_replies(settings, folder)
    first = train_student(student_run(settings, folder, tmp_path / "a", stop_after=5))
    assert first["step"] == 5 and first["total_steps"] == 40
    resumed = train_student(student_run(settings, folder, tmp_path / "b", resume=str(tmp_path / "a")))
    assert resumed["step"] == 40 and [s for s, _ in resumed["loss"]] == list(range(1, 41))
    assert [h["step"] for h in resumed["heldout"]] == [0, 5, 40]
    with pytest.raises(ValueError, match="its batch_size is 2, this run's is 4"):
        train_student(student_run(settings, folder, tmp_path / "c", resume=str(tmp_path / "a"), batch_size=4))


def test_a_resumed_student_compiles_its_layers_from_the_artifacts_the_loan_brought_back(
    staged, tmp_path, capsys, monkeypatch
):
    """A compiled student keeps its compiled layers at each snapshot, the loan bundles them into one file
    of OUT, and a student resumed from that OUT on a fresh box (here: dynamo reset and an empty inductor
    cache) loads them and compiles its layers from cache hits, none from nothing."""
    from torch._dynamo.utils import counters

    folder, settings, _ = staged
    write_prompt_tails_as_replies(settings, folder)
    kept = tmp_path / "work" / "compiled-n4.xz"
    kept.parent.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first-box"))
    torch._dynamo.reset()
    first = student_run(
        settings, folder, tmp_path / "out" / "n4", stop_after=2, compile=True, artifacts=str(kept)
    )
    assert train_student(first)["compiled"] and kept.is_file()
    bundle_artifacts([kept, tmp_path / "work" / "compiled-n3.xz"], tmp_path / "out", print)
    assert (tmp_path / "out" / BUNDLE_FILE).is_file()

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "second-box"))
    torch._dynamo.reset()
    counters.clear()
    resumed = student_run(
        settings,
        folder,
        tmp_path / "again" / "n4",
        stop_after=4,
        compile=True,
        resume=str(tmp_path / "out" / "n4"),
    )
    assert train_student(resumed)["step"] == 4
    assert counters["inductor"]["fxgraph_cache_hit"] > 0 and counters["inductor"]["fxgraph_cache_miss"] == 0
    assert "--compile: loaded" in capsys.readouterr().out


def test_an_unreadable_bundle_or_member_is_said_and_the_layers_compile_from_nothing(tmp_path):
    said = []
    (tmp_path / "torn.tar").write_bytes(b"not a tar archive" * 64)
    load_bundle(tmp_path / "torn.tar", said.append)
    (tmp_path / "compiled-n4.xz").write_bytes(b"not xz")
    bundle_artifacts([tmp_path / "compiled-n4.xz"], tmp_path, said.append)
    load_bundle(tmp_path / BUNDLE_FILE, said.append)
    load_bundle(tmp_path / "absent.tar", said.append)
    assert len(said) == 3, said
    assert said[0].startswith(f"--compile: {tmp_path / 'torn.tar'} not read (ReadError")
    assert said[0].endswith("compiling from nothing") and "\n" not in said[0]
    assert "compiled artifacts of 1 student(s)" in said[1]
    assert said[2].startswith(f"--compile: {tmp_path / BUNDLE_FILE}:compiled-n4.xz not loaded (LZMAError")


def test_a_student_profiles_a_few_steps_after_its_first_speed_line_and_trains_on(
    staged, tmp_path, capsys, monkeypatch
):
    """The profiled steps are ordinary steps (the loss history stays step after step), kept out of the
    timing; the report names the busiest ops. A profiler that fails midway is said and the run goes on."""
    from loan import student as student_module

    folder, settings, _ = staged
    write_prompt_tails_as_replies(settings, folder)
    run = student_run(settings, folder, tmp_path / "a", stop_after=8, first_report_seconds=0.0)
    progress = train_student(run)
    printed = capsys.readouterr().out
    assert "profile of 3 steps:" in printed and "ms wall per step" in printed and "Self CPU" in printed
    assert progress["step"] == 8 and [s for s, _ in progress["loss"]] == list(range(1, 9))

    def fails_after_one(step, steps, device):
        step(steps[0])
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(student_module, "profile_steps", fails_after_one)
    progress = train_student(
        student_run(settings, folder, tmp_path / "b", stop_after=8, first_report_seconds=0.0)
    )
    assert (
        "profile failed (RuntimeError: no profiler here); training on unprofiled" in capsys.readouterr().out
    )
    assert progress["step"] == 8 and [s for s, _ in progress["loss"]] == list(range(1, 9))


def test_the_script_without_its_staged_files_names_the_step_that_writes_them(staged, tmp_path):
    _, settings, _ = staged
    env = {**os.environ, "W": str(tmp_path / "work")}
    for step, missing in (
        ("unpack1", ".devdata/sk/part1/teacher.tar.0"),
        ("run", ".devdata/sk/part2/stage.json"),
        ("unpack-previous", ".devdata/sk/previous/replies.npz.xz"),
    ):
        result = subprocess.run(
            ["bash", str(SCRIPT), step], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2 and f"{missing} is missing; it is written by" in result.stderr
    # A resumed run whose earlier output was not unpacked: named before anything is copied.
    for present in (tmp_path / ".devdata/sk/part2/stage.json", tmp_path / "work/part1/teacher.tar.0"):
        present.parent.mkdir(parents=True)
        present.touch()
    result = subprocess.run(
        ["bash", str(SCRIPT), "run"], cwd=tmp_path, env={**env, "RESUME": "1"}, capture_output=True, text=True
    )
    assert result.returncode == 2 and "previous/replies.npz.xz is missing; it is written by" in result.stderr
    assert "gpu_students.sh unpack-previous" in result.stderr
    part1 = Path(settings.out) / "part1"
    moved = part1.with_name("part1-away")
    part1.rename(moved)
    try:
        result = dry_run(Path(settings.out), tmp_path / "out", "--shape none")
    finally:
        moved.rename(part1)
    assert result.returncode == 2
    assert (
        "teacher.tar.0 is missing; it is written by `python -m loan stage` (part1, carried by the first call)"
        in (result.stdout + result.stderr)
    )


def test_a_failing_static_writer_falls_back_to_generate_and_says_why(staged, tmp_path, monkeypatch, capsys):
    from loan import students

    def broken(*args, **kwargs):
        raise RuntimeError("StaticCache takes other arguments here")

    _, settings, manifest = staged
    monkeypatch.setattr(students, "static_generator", broken)
    loan = students.LoanSettings(stage=settings.out, out=str(tmp_path), device="cpu")
    stage = Path(settings.out)
    teacher = students.assemble_teacher(stage, manifest)
    report = students.write_teacher_replies(loan, stage, manifest, teacher, torch.float32, tmp_path)
    assert report["engine"] == "hf" and report["written"] == report["prompts"]
    assert (
        "static engine failed (RuntimeError: StaticCache takes other arguments here)"
        in capsys.readouterr().out
    )
    written = (tmp_path / "replies.npz.xz").read_bytes()
    replies = decode_ids(written)
    assert len(replies) == report["prompts"] and all(0 < len(r) <= REPLY_TOKENS for r in replies)
    # A resumed loan writes the replies it reused again; the students know their data by these bytes.
    assert encode_lists(replies) == written


def test_replies_written_ahead_travel_in_the_stage_and_the_loan_writes_only_the_rest(staged, tmp_path):
    """`--replies` stages the replies a CPU wrote ahead (plain or .xz records, keyed by prompt) for the
    prompts from the first up to the first they do not answer; the loan reuses them and writes the rest."""
    import lzma

    from loan import students

    from swiftkv.data.tokens import Reply, prompt_key
    from swiftkv.replies import append_replies

    _, settings, _ = staged
    prompts = decode_ids((Path(settings.out) / "part2" / "prompts.npz.xz").read_bytes())
    ahead = {prompt_key(p): Reply(p[-3:], True) for p in prompts[:10] + prompts[11:14]}  # a gap at 10
    append_replies(tmp_path / "ahead.jsonl", ahead)
    (tmp_path / "ahead.jsonl.xz").write_bytes(lzma.compress((tmp_path / "ahead.jsonl").read_bytes()))
    for source in ("ahead.jsonl", "ahead.jsonl.xz"):
        out = tmp_path / f"stage-{source}"
        manifest = write_stage(
            StageSettings(**{**settings.__dict__, "out": str(out), "replies": str(tmp_path / source)})
        )
        assert manifest["replies"]["staged"] == 10
        assert decode_ids((out / "part2" / "replies.npz.xz").read_bytes()) == [p[-3:] for p in prompts[:10]]
    loan = students.LoanSettings(stage=str(out), out=str(tmp_path / "out"), device="cpu")
    teacher = students.assemble_teacher(out, manifest)
    report = students.write_teacher_replies(loan, out, manifest, teacher, torch.float32, tmp_path)
    assert report["reused"] == 10 and report["written"] == len(prompts) - 10
    replies = decode_ids((tmp_path / "replies.npz.xz").read_bytes())
    assert replies[:10] == [p[-3:] for p in prompts[:10]] and len(replies) == len(prompts)


def test_replies_written_ahead_that_do_not_fit_the_stage_are_refused_before_writing(staged, tmp_path):
    from swiftkv.data.tokens import Reply, prompt_key
    from swiftkv.replies import append_replies

    _, settings, _ = staged
    prompts = decode_ids((Path(settings.out) / "part2" / "prompts.npz.xz").read_bytes())
    cases = {
        "long.jsonl": (
            {prompt_key(prompts[0]): Reply([5] * (REPLY_TOKENS + 1), False)},
            "more than --reply-tokens",
        ),
        "other.jsonl": ({prompt_key([1, 2, 3]): Reply([5], True)}, "answers none of the staged prompts"),
    }
    for name, (records, message) in cases.items():
        append_replies(tmp_path / name, records)
        stage = StageSettings(
            **{**settings.__dict__, "out": str(tmp_path / "s"), "replies": str(tmp_path / name)}
        )
        with pytest.raises(ValueError, match=message):
            write_stage(stage)
        assert not (tmp_path / "s").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_stage(
            StageSettings(**{**settings.__dict__, "out": str(tmp_path / "s"), "replies": "none.jsonl"})
        )


def test_the_loans_lstsq_student_is_converts(tmp_path):
    """The loan fits the lstsq init on the device from the staged calibration blocks; it must be the init
    `swiftkv convert --init lstsq` writes from the same data (measured on SmolLM2 N = 15 here: held-out KL
    1.1471 against convert's 1.1469, bf16)."""
    from loan.student import lstsq_student

    from swiftkv.convert import ConvertSettings, convert
    from swiftkv.convert.calibration import token_blocks
    from swiftkv.sources import open_source
    from tests.tiny import save_tiny_teacher

    teacher_dir = save_tiny_teacher(tmp_path / "teacher")
    chats = write_jsonl(tmp_path / "chats.jsonl", random_chats(80, turns=2, words=30))
    convert(
        ConvertSettings(
            source=str(teacher_dir),
            out=str(tmp_path / "converted"),
            num_key_value_layers=3,
            init="lstsq",
            calib_data=str(chats),
            calib_tokens=1024,
            compute_dtype="float32",
        )
    )
    teacher = open_source(str(teacher_dir))
    fit, _ = token_blocks(teacher.load_tokenizer(), str(chats), 1024, 2048)
    mine = swiftkv_parameters(lstsq_student(teacher, 3, torch.stack(fit), torch.device("cpu"), torch.float32))
    theirs = swiftkv_parameters(load_model(str(tmp_path / "converted")))
    assert set(mine) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.allclose(mine[name], tensor, rtol=1e-4, atol=1e-6), name


def test_a_loans_replies_merge_into_the_reply_file_cpu_runs_and_the_next_stage_read(staged, tmp_path):
    """`python -m loan replies`: the run's replies, aligned with the staged prompts, keyed and merged after
    the file's own records (kept as they were where the loan's differ); finished = ends with eos."""
    from loan.replies import merge_loan_replies

    from swiftkv.data.tokens import Reply, prompt_key
    from swiftkv.replies import append_replies, read_replies

    _, settings, manifest = staged
    stage = Path(settings.out)
    prompts = decode_ids((stage / "part2" / "prompts.npz.xz").read_bytes())
    eos = manifest["tokenizer_eos"]
    written = [p[-2:] + ([eos] if i % 3 == 0 else [7]) for i, p in enumerate(prompts)]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "replies.npz.xz").write_bytes(encode_lists(written))
    into = tmp_path / "replies-ids.jsonl.xz"
    own = {prompt_key(prompts[0]): Reply([5, 6], False), prompt_key(prompts[1]): Reply(written[1], False)}
    append_replies(tmp_path / "own.jsonl", own)
    into.write_bytes(__import__("lzma").compress((tmp_path / "own.jsonl").read_bytes()))
    counts = merge_loan_replies(tmp_path / "out", stage, into)
    merged = read_replies(into)
    distinct = {prompt_key(p) for p in prompts}
    assert counts == {"held": 2, "added": len(distinct) - 2, "kept_differing": 1, "replies": len(distinct)}
    assert merged[prompt_key(prompts[0])] == Reply([5, 6], False)  # the file's own record wins
    assert list(merged)[:2] == list(own)  # and stays first
    first: dict[str, Reply] = {}  # a repeated prompt keeps the loan's first reply to it
    for i, prompt in enumerate(prompts):
        first.setdefault(prompt_key(prompt), Reply(written[i], i % 3 == 0))
    assert all(merged[key] == reply for key, reply in first.items() if key not in own)
    with pytest.raises(FileNotFoundError, match="python -m loan run"):
        merge_loan_replies(tmp_path / "nowhere", stage, into)


def test_install_finds_the_teacher_here_or_says_to_name_it():
    from swiftkv.distill.start.snapshot import snapshot_teacher

    box = {"teacher": "/root/sk/work/teacher.gguf", "teacher_digest": "ab12"}
    assert snapshot_teacher({**box, "teacher_name": "smollm2-135m-instruct"}, None) == "smollm2-135m-instruct"
    assert snapshot_teacher(box, "here.gguf") == "here.gguf"
    assert snapshot_teacher({**box, "teacher": str(ROOT)}, None) == str(ROOT)  # a path that exists here
    with pytest.raises(ValueError, match="pass --teacher .* sha256 ab12"):
        snapshot_teacher(box, None)


@pytest.mark.slow
def test_a_failing_student_fails_the_run_and_a_missing_import_fails_it_before_anything_runs(staged, tmp_path):
    """A student whose process fails (here: no replies written before it starts) makes the run exit 1,
    naming it; an import the run needs that fails exits 3, naming it, with nothing written."""
    _, settings, _ = staged
    out = tmp_path / "out"
    result = dry_run(Path(settings.out), out, "--students 4 --shape none --writer-minutes 0 --no-compile")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "python -m loan run: failed: N = 4" in result.stdout
    assert json.loads((out / "loan.json").read_text())["students"]["4"]["snapshot"] is None
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no torch build for this machine')\n")
    path = f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    result = dry_run(Path(settings.out), tmp_path / "none", "--shape none", PYTHONPATH=path)
    assert result.returncode == 3
    assert (
        "python -m loan: `import torch` failed (ImportError: no torch build for this machine); nothing ran"
        in (result.stdout)
    )
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["loan.log"]
