"""Folders written tensor by tensor (`swiftkv.tensorfiles`): `convert` keeps the source's dtype and
files, with the teacher exactly the source's; `distill` writes the source's files with its trained
tensors in; and neither holds the whole model: convert's peak RSS stays under 2.2x the folder, and
under --fsdp no rank's start holds more than its share of the model and an interpreter's margin, nor
does its write add more than a few tensors' worth."""

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from swiftkv.cli import main
from swiftkv.model.modeling import swiftkv_parameters
from swiftkv.tensorfiles import INDEX_FILE, FolderTensors, write_safetensors
from tests.memory import calibration_text, convert_peak, folder_bytes, random_llama_folder
from tests.test_distill_cli import distill_args
from tests.test_distill_fsdp import torchrun
from tests.tiny import random_chats, random_student, random_teacher, tiny_tokenizer, write_jsonl

N = 3


def save_teacher(folder, dtype=torch.bfloat16, **save_options):
    tokenizer = tiny_tokenizer()
    model = random_teacher("llama", vocab_size=max(128, len(tokenizer))).to(dtype)
    model.save_pretrained(folder, **save_options)
    tokenizer.save_pretrained(folder)
    return folder


def stored(folder) -> dict[str, torch.Tensor]:
    tensors = FolderTensors(folder)
    return {name: tensors[name] for name in tensors}


def convert(src, dst, *extra) -> None:
    assert main(["convert", str(src), str(dst), "--num-key-value-layers", str(N), *extra]) == 0


def teacher_logits_equal(converted, source) -> bool:
    x = torch.randint(4, 60, (1, 12))
    student = AutoModelForCausalLM.from_pretrained(converted).eval()
    teacher = AutoModelForCausalLM.from_pretrained(source).eval()
    student.set_swiftkv(False)
    with torch.no_grad():
        return torch.equal(student(x).logits, teacher(x).logits)


def test_the_safetensors_writer_matches_safetensors_and_checks_shapes(tmp_path):
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7), "c": torch.ones(0, 4)}
    layout = [(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    write_safetensors(tmp_path / "ours.safetensors", layout, tensors.__getitem__)
    read = load_file(tmp_path / "ours.safetensors")
    assert read.keys() == tensors.keys() and all(torch.equal(read[n], tensors[n]) for n in tensors)
    assert FolderTensors(tmp_path).entries["a"].dtype == torch.bfloat16  # read back from the header
    with pytest.raises(ValueError, match=r"tensor a has shape \(5, 3\); its file declares \(3, 5\)"):
        write_safetensors(tmp_path / "bad.safetensors", layout, lambda name: tensors[name].T)


@pytest.mark.parametrize("init", ["copy", "lstsq"])
def test_a_bf16_source_converts_to_bf16_with_its_teacher_exact(tmp_path, init):
    source = save_teacher(tmp_path / "bf16")
    calib = calibration_text(tmp_path / "calib.jsonl", 40)
    extra = ["--init", "copy", "--no-measure"] if init == "copy" else ["--calib-data", str(calib)]
    convert(source, tmp_path / "out", *extra)
    before, after = stored(source), stored(tmp_path / "out")
    assert {t.dtype for t in after.values()} == {torch.bfloat16}
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())  # the same bytes
    assert {name for name in after if name not in before} == set(
        swiftkv_parameters(AutoModelForCausalLM.from_pretrained(tmp_path / "out"))
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["architectures"] == ["LlamaSwiftKVForCausalLM"]
    assert teacher_logits_equal(tmp_path / "out", source)
    if init == "copy":  # copy: q_proj_swiftkv is the layer's own q_proj, bit for bit
        name = f"model.layers.{N}.self_attn.q_proj"
        assert torch.equal(after[f"{name}_swiftkv.weight"], before[f"{name}.weight"])


def test_dtype_overrides_the_sources(tmp_path):
    source = save_teacher(tmp_path / "bf16")
    convert(source, tmp_path / "fp32", "--init", "copy", "--no-measure", "--dtype", "float32")
    before, after = stored(source), stored(tmp_path / "fp32")
    assert {t.dtype for t in after.values()} == {torch.float32}
    assert all(torch.equal(after[name], tensor.float()) for name, tensor in before.items())


def test_a_sharded_source_keeps_its_files_with_the_new_tensors_beside_their_neighbours(tmp_path):
    source = save_teacher(tmp_path / "sharded", torch.float32, max_shard_size="100KB")
    files = sorted(p.name for p in source.glob("*.safetensors"))
    assert len(files) > 2
    convert(source, tmp_path / "out", "--init", "copy", "--no-measure")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == files
    index = json.loads((tmp_path / "out" / INDEX_FILE).read_text())["weight_map"]
    written = FolderTensors(tmp_path / "out")
    assert index == {name: entry.file for name, entry in written.entries.items()}
    source_index = json.loads((source / INDEX_FILE).read_text())["weight_map"]
    for name in (n for n in index if "swiftkv" in n):
        assert index[name] == source_index[name.replace("_swiftkv", "")]
    assert teacher_logits_equal(tmp_path / "out", source)


def test_a_pickled_source_converts_to_safetensors(tmp_path):
    safetensors_folder = save_teacher(tmp_path / "safetensors")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (pickled / name).write_bytes((safetensors_folder / name).read_bytes())
    torch.save(load_file(safetensors_folder / "model.safetensors"), pickled / "pytorch_model.bin")
    convert(pickled, tmp_path / "out", "--init", "copy", "--no-measure")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == ["model.safetensors"]
    before, after = stored(safetensors_folder), stored(tmp_path / "out")
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())
    assert teacher_logits_equal(tmp_path / "out", safetensors_folder)


def bf16_student_folder(folder):
    _, student = random_student(
        "llama", N, swiftkv_std=0.2, max_position_embeddings=256, tie_word_embeddings=True
    )
    student.to(torch.bfloat16).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("trainable", ["swiftkv", "lora"])
def test_distill_writes_a_bf16_sources_files_with_the_trained_tensors_in(tmp_path, trainable):
    folder = bf16_student_folder(tmp_path / "student")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    extra = ["--trainable", trainable, *(["--lora-rank", "4"] if trainable == "lora" else [])]
    assert main(distill_args(folder, data, tmp_path / "out", *extra)) == 0
    before, after = stored(folder), stored(tmp_path / "out")
    assert before.keys() == after.keys() and {t.dtype for t in after.values()} == {torch.bfloat16}
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    trained = set(swiftkv_parameters(AutoModelForCausalLM.from_pretrained(folder)))
    merged = {  # --trainable lora: the later layers' adapted projections, merged under their own names
        f"model.layers.{i}.{module}.weight"
        for i in range(N, 6)
        for module in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    }
    assert changed & trained and changed - trained <= (merged if trainable == "lora" else set())
    assert any("o_proj" in name for name in changed) == (trainable == "lora")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["swiftkv"] is True and config["dtype"] == "bfloat16"
    assert config["swiftkv_student_trained"] == (["self_attn.o_proj", "mlp"] if trainable == "lora" else None)


# --------------------------------------------------------------------------------------------------
# Peak host memory
# --------------------------------------------------------------------------------------------------

# Llama-3.2-1B's widths (hidden 2048, 32 heads, 8 KV heads, FFN 8192, vocab 128256, tied) at 8 layers of
# its 16: a 1.4 GiB folder. Big enough that the interpreter's own ~0.5 GiB does not decide the ratio,
# small enough for the lstsq calibration's bf16 passes to run in the suite's time on a small CPU.
WIDE_8_LAYERS = {
    "hidden_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
}
RSS_BOUND = 2.2  # peak RSS of convert, in multiples of the folder's size


@pytest.mark.slow
def test_convert_peak_rss_stays_under_its_bound_of_the_folder(tmp_path):
    folder = random_llama_folder(tmp_path / "wide", **WIDE_8_LAYERS)
    size = folder_bytes(folder)
    data = calibration_text(tmp_path / "calib.jsonl")
    runs = {
        "copy": ["--init", "copy", "--no-measure"],
        "lstsq": ["--calib-data", str(data), "--calib-tokens", "512", "--eval-tokens", "512"],
    }
    ratios = {}
    for name, extra in runs.items():
        ratios[name] = convert_peak(folder, tmp_path / name, *extra) / size
        assert {entry.dtype for entry in FolderTensors(tmp_path / name).entries.values()} == {torch.bfloat16}
    print(f"convert peak RSS / folder size ({size / 2**30:.2f} GiB): {ratios}")
    assert max(ratios.values()) < RSS_BOUND, ratios


# The FSDP write test's student: wide enough that its source model (58M parameters, 230 MiB in fp32) is
# far above the write's margin, so a process that loaded it whole would fail.
WIDE_STUDENT = {
    "hidden_size": 512,
    "intermediate_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
}
# What a write may add above what the process held: a few whole tensors (a source tensor being copied,
# one gathered trained tensor, a merged adapter's weight and the delta added to it, a cast copy: at most 4
# of the folder's largest tensor in fp32) and a fixed 64 MiB for the interpreter (the tokenizer's and
# config's saving, the safetensors handle, allocator slack).
WRITE_TENSORS, WRITE_SLACK_MIB = 4, 64
WRITE_LINE = re.compile(r"process (\d+): writing the output raised its peak host memory ([\d,]+) MiB")


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["swiftkv", "lora"])
def test_an_fsdp_write_adds_no_more_than_its_margin_on_any_rank(tmp_path, trainable):
    _, student = random_student(
        "llama", 4, swiftkv_std=0.2, max_position_embeddings=256, tie_word_embeddings=True, **WIDE_STUDENT
    )
    student.save_pretrained(tmp_path / "student")
    tiny_tokenizer().save_pretrained(tmp_path / "student")
    model_mib = sum(p.numel() for p in student.parameters()) * 4 / 2**20
    largest_mib = max(p.numel() for p in student.parameters()) * 4 / 2**20
    margin = WRITE_TENSORS * largest_mib + WRITE_SLACK_MIB
    assert model_mib > 2 * margin  # a write that held the model would not pass
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    extra = ["--trainable", trainable, *(["--lora-rank", "4"] if trainable == "lora" else [])]
    args = distill_args(tmp_path / "student", data, tmp_path / "out", *extra, "--tokens", "128", "--fsdp")
    # each rank's stdout to its own file (torchrun's --redirects): two ranks printing into one pipe can
    # interleave, and one rank's report went missing from the shared stdout once
    logs = tmp_path / "logs"
    torchrun(2, args, launcher=("--log-dir", str(logs), "--redirects", "1"))
    output = "\n".join(path.read_text() for path in sorted(logs.rglob("stdout.log")))
    added = {int(rank): float(mib.replace(",", "")) for rank, mib in WRITE_LINE.findall(output)}
    print(
        f"{trainable}: write added {added} MiB per rank; margin {margin:.0f} MiB, model {model_mib:.0f} MiB"
    )
    assert sorted(added) == [0, 1], output[-2000:]
    assert max(added.values()) < margin, (added, margin)
    with safe_open(tmp_path / "out" / "model.safetensors", framework="pt") as handle:
        assert len(list(handle.keys())) == len(FolderTensors(tmp_path / "student"))


# What a process holds after the sharded start beyond its share of the model (the plan's weights and
# trained tensors per process): the interpreter with torch, transformers, the tokenizer and the process
# group (570 MiB measured), allocator slack, and the rows of one stored tensor being read.
START_SLACK_MIB = 768
START_LINE = re.compile(r"process (\d+): peak host memory ([\d,]+) MiB after the start")


@pytest.mark.slow
def test_an_fsdp_run_of_a_1b_wide_model_holds_its_share_on_each_rank(tmp_path):
    """A Llama-3.2-1B-wide bf16 folder trained by two --fsdp processes: each one's peak host memory when its
    shards are filled stays within its share of the model plus the interpreter's margin, which a process
    holding the whole model in fp32 (as the start did before it was sharded) exceeds; and writing the output
    adds at most two of its largest stored tensors (one copied, one cast) and the write's slack."""
    from swiftkv.distill.measure.plan import memory_plan, meta_model

    convert(
        random_llama_folder(tmp_path / "wide", **WIDE_8_LAYERS),
        tmp_path / "student",
        "--init",
        "copy",
        "--no-measure",
    )
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    seq_len, world = 32, 2
    args = distill_args(
        tmp_path / "student", data, tmp_path / "out", "--tokens", "128", "--seq-len", str(seq_len)
    )
    logs = tmp_path / "logs"
    torchrun(
        world, [*args, "--dtype", "bfloat16", "--fsdp"], launcher=("--log-dir", str(logs), "--redirects", "1")
    )
    output = "\n".join(path.read_text() for path in sorted(logs.rglob("stdout.log")))
    peaks = {int(rank): float(mib.replace(",", "")) for rank, mib in START_LINE.findall(output)}
    model = meta_model(AutoConfig.from_pretrained(tmp_path / "student"), "swiftkv", None)
    plan = memory_plan(model, world, True, seq_len, 1, torch.bfloat16, 512, False, device="cpu")
    share = (plan.weights + plan.trained) * 1024
    largest = (
        max(entry.nbytes for entry in FolderTensors(tmp_path / "student").entries.values()) / world / 2**20
    )
    bound = share + largest + START_SLACK_MIB
    whole = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    added = {int(rank): float(mib.replace(",", "")) for rank, mib in WRITE_LINE.findall(output)}
    write_margin = 2 * largest * world + WRITE_SLACK_MIB
    print(
        f"sharded start peak {peaks} MiB per rank; share {share:.0f} MiB, bound {bound:.0f}, whole fp32 "
        f"{whole:.0f}; the write added {added} MiB, margin {write_margin:.0f}"
    )
    assert sorted(peaks) == sorted(added) == [0, 1] and max(bound, write_margin) < whole
    assert max(peaks.values()) < bound, (peaks, bound)  # a process that held the whole model could not pass
    assert max(added.values()) < write_margin, (added, write_margin)
