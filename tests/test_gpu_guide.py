"""Every command of docs/gpu.md ("Llama-3.1-8B on 8 GPUs"), read from its ```bash blocks and run in order on
a tiny model: the install (a dry run of this tree, offline), convert, the plan, the replies on vLLM's CPU
build with 2 data-parallel engines, the distillation under torchrun with 2 gloo processes and --fsdp, eval,
the server and the curl request against it, and the benchmark. No command is skipped; each is changed only by
the fixed mapping below: the 8B guide's names become the tiny model's folders, its sizes the tiny model's,
and a few options are added for a tiny model on a 2-core CPU (never one that changes what the command does).
Each step's output is then checked by value: the replies equal transformers' greedy ones, the served
completion equals the distilled folder's greedy completion, the benchmark's KV capacities are equal (G = 1)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.tiny import byte_tokenizer, write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "gpu.md"
# The guide's folders and files -> names under the test's temp folder.
NAMES = {
    "Llama-3.1-8B-Instruct": "teacher",
    "llama8b-n16": "n2",
    "llama8b-swiftkv": "distilled",
    "openorca.jsonl": "openorca.jsonl",
    "acemath.jsonl": "acemath.jsonl",
    "lmsys-chat.jsonl": "lmsys-chat.jsonl",
    "replies.jsonl": "replies.jsonl",
    "eval-8b": "eval",
    "bench-8b": "bench",
}
# The guide's datasets (read through `datasets.load_dataset` where the hub is reachable) -> local sources of the
# same layouts (`write_inputs`): OpenOrca's columns, AceMath's messages + answer (a save_to_disk folder),
# lmsys-chat's conversation.
DATASETS = {
    "Open-Orca/OpenOrca": "openorca-source.jsonl",
    "nvidia/AceMath-Instruct-Training-Data@general_sft_stage2": "acemath-source",
    "lmsys/lmsys-chat-1m": "lmsys-source.jsonl",
}
DATA_COUNT = 40  # the guide's 500,000 chats of each dataset
# The 8B sizes -> the tiny model's (4 layers, N = 2; 2 processes / ranks where the guide has 8 GPUs).
SIZES = {
    "--num-key-value-layers 16": "--num-key-value-layers 2",
    "--world-size 8": "--world-size 2",
    "--nproc-per-node 8": "--nproc-per-node 2",
    "--data-parallel-size 8": "--data-parallel-size 2",
    "--tokens 500M": "--tokens 6000",
    "--reply-tokens 512": "--reply-tokens 8",
    "--limit 500": "--limit 4",
    ":500000": f":{DATA_COUNT}",
}
# Added to a command for the tiny model only: blocks within its 1,024 positions, a held-out part its small
# data can spare, fp32 (so greedy ids compare exactly), eager vLLM engines with small KV caches, a short
# evaluation, the benchmark's quick workloads, and a private eval cache.
TINY_OPTIONS = {
    "distill": ["--seq-len", "128", "--heldout-tokens", "256", "--dtype", "float32"],
    "replies": ["--heldout-tokens", "256", "--dtype", "float32"],
    "eval": ["--chat-conversations", "4", "--gen-prompts", "2", "--gen-tokens", "4", "--long-prompts", "0"],
    "serve": ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes"],
    "bench": [
        "--quick",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--kv-cache-memory",
    ],
}
KV_BYTES = 64 * 2**20
PROGRAMS = {
    "swiftkv": [sys.executable, "-m", "swiftkv.cli"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone"],
}
# The guide's install is of the published package; here the same extra of this tree, resolved offline.
INSTALL = [
    sys.executable,
    "-m",
    "pip",
    "install",
    "--dry-run",
    "--no-deps",
    "--no-index",
    "--no-build-isolation",
]
SOURCE_TAGS = {
    "openorca.jsonl": "w1",
    "acemath.jsonl": "w2",
    "lmsys-chat.jsonl": "w3",
}  # each chat's first word


def guide_commands(text: str) -> list[str]:
    """The commands of the guide's fenced blocks: ```bash ones are commands (continuation lines joined),
    ```text ones are printed output; any other block fails, so no command can hide in one."""
    commands = []
    for language, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        assert language in ("bash", "text"), f"a fenced block of {language!r}: expected bash or text"
        if language == "bash":
            joined = body.replace("\\\n", " ")
            commands += [line.strip() for line in joined.splitlines() if line.strip()]
    return commands


def kind(argv: list[str]) -> str:
    """What a guide command is: pip, curl, the swiftkv command it runs (directly or under torchrun), or a
    plan: distill's (`plan`) or another command's (`replies-plan`)."""
    if argv[0] in ("pip", "curl"):
        return argv[0]
    command = argv[argv.index("swiftkv.cli") + 1] if argv[0] == "torchrun" else argv[1]
    if "--plan" in argv or ("--mode" in argv and argv[argv.index("--mode") + 1] == "plan"):
        return "plan" if command == "distill" else f"{command}-plan"
    return command


def tiny_argv(command: str, folder: Path, port: int) -> tuple[str, list[str]]:
    """(kind, argv) of a guide command mapped onto the tiny model (the module docstring)."""
    for big, small in SIZES.items():
        command = command.replace(big, small)
    command = command.replace("8000", str(port))
    argv = shlex.split(command)
    step = kind(argv)
    argv = [",".join(local_name(part, folder) for part in arg.split(",")) for arg in argv]
    argv = [arg.replace('"llama8b-swiftkv"', json.dumps(str(folder / "distilled"))) for arg in argv]
    if step == "pip":
        return step, [*INSTALL, *(a.replace("swiftkv[", ".[") for a in argv[2:])]
    if step == "curl":
        return step, argv
    extra = TINY_OPTIONS.get("distill" if step == "plan" else step.removesuffix("-plan"), [])
    if step in ("serve", "bench"):
        extra = [*extra, str(KV_BYTES)]
    return step, [*PROGRAMS[argv[0]], *argv[1:], *extra]


def local_name(part: str, folder: Path) -> str:
    """A guide's name (a folder, a file, or a dataset with its `:COUNT`) as the test's own path."""
    if part in NAMES:
        return str(folder / NAMES[part])
    name, colon, count = part.rpartition(":")
    if name in DATASETS:
        return f"{folder / DATASETS[name]}{colon}{count}"
    return part


def chats_of(tag: str, count: int, seed: int) -> list[dict]:
    """Chats whose user turns start with `tag`, so a reply can be traced to its source."""
    generator = torch.Generator().manual_seed(seed)

    def words(n: int) -> str:
        return " ".join(f"w{int(i)}" for i in torch.randint(0, 100, (n,), generator=generator))

    return [
        {
            "messages": [
                {"role": "user", "content": f"{tag} {words(6)}"},
                {"role": "assistant", "content": words(8)},
            ]
        }
        for _ in range(count)
    ]


def write_inputs(folder: Path) -> None:
    """The teacher (a random Llama with peaked logits, head_dim 32 for vLLM's CPU attention, 2 KV heads for 2
    ranks, byte-level tokenizer) and the three chat sources (two JSONL files, one datasets folder)."""
    import datasets
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.5 if "embed" in name else 0.15)
    model.save_pretrained(folder / "teacher")
    tokenizer.save_pretrained(folder / "teacher")
    openorca, acemath, lmsys = (chats_of(tag, 60, seed) for seed, tag in enumerate(SOURCE_TAGS.values()))
    write_jsonl(
        folder / DATASETS["Open-Orca/OpenOrca"],
        [
            {"id": str(i), "system_prompt": "", "question": user, "response": reply}
            for i, (user, reply) in enumerate(map(turns, openorca))
        ],
    )
    acemath_records = [{"messages": chat["messages"][:1], "answer": turns(chat)[1]} for chat in acemath]
    datasets.Dataset.from_list(acemath_records).save_to_disk(
        str(folder / DATASETS["nvidia/AceMath-Instruct-Training-Data@general_sft_stage2"])
    )
    write_jsonl(
        folder / DATASETS["lmsys/lmsys-chat-1m"],
        [{"conversation_id": str(i), "conversation": chat["messages"]} for i, chat in enumerate(lmsys)],
    )


def turns(chat: dict) -> tuple[str, str]:
    """The user turn and the reply of a one-exchange chat."""
    user, reply = chat["messages"]
    return user["content"], reply["content"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def run(argv: list[str], env: dict, log: Path) -> str:
    """The command's standard output (both streams go to `log`)."""
    result = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    log.write_text(f"$ {shlex.join(argv)}\n{result.stdout}\n--- stderr\n{result.stderr}")
    assert result.returncode == 0, f"{shlex.join(argv)} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


class Server:
    """`swiftkv serve` in the background, from its start until the guide's request has been answered."""

    def __init__(self, argv: list[str], env: dict, log: Path, port: int):
        self.log = log
        self.handle = log.open("w")
        self.process = subprocess.Popen(
            argv, env=env, stdout=self.handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        deadline = time.time() + 600
        while not healthy(port):
            if self.process.poll() is not None or time.time() > deadline:
                self.stop()
                pytest.fail("the server did not start:\n" + log.read_text()[-4000:])
            time.sleep(2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.handle.close()


@pytest.fixture(scope="module")
def guide(tmp_path_factory) -> tuple[Path, dict[str, str], list[str]]:
    """(the folder, each step's output by kind, the kinds in the guide's order) after running every command."""
    folder = tmp_path_factory.mktemp("gpu_guide")
    write_inputs(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # set per engine by swiftkv for its tensor-parallel ranks
    port = free_port()
    outputs, kinds, server = {}, [], None
    try:
        for command in guide_commands(GUIDE.read_text()):
            step, argv = tiny_argv(command, folder, port)
            kinds.append(step)
            log = folder / f"{len(kinds):02d}-{step}.log"
            if step == "serve":
                server = Server(argv, env, log, port)
                continue
            outputs[step] = run(argv, env, log)
            if (
                step == "curl" and server is not None
            ):  # the guide's request is answered: the server's job is done
                server.stop()
                server = None
    finally:
        if server is not None:
            server.stop()
    return folder, outputs, kinds


def test_the_guide_runs_every_step_in_order(guide):
    _, outputs, kinds = guide
    assert kinds == [
        "pip", "data", "data", "data", "convert", "plan", "replies-plan", "replies", "distill", "eval", "serve",
        "curl", "bench",
    ]  # fmt: skip
    assert "Would install swiftkv" in outputs["pip"]


def test_the_data_step_draws_the_count_of_each_dataset_as_chats(guide):
    """Each dataset's own layout (OpenOrca's columns, AceMath's messages + answer, lmsys's conversation)
    becomes the same chat records, exactly the asked count, each traceable to its source."""
    folder, *_ = guide
    for name, tag in SOURCE_TAGS.items():
        records = [json.loads(line) for line in (folder / name).read_text().splitlines()]
        assert len(records) == DATA_COUNT
        for record in records:
            roles = [turn["role"] for turn in record["messages"]]
            assert roles[-2:] == ["user", "assistant"] and record["messages"][-2]["content"].startswith(tag)


def test_convert_wrote_the_swiftkv_folder_in_bf16(guide):
    folder, *_ = guide
    config = json.loads((folder / "n2" / "config.json").read_text())
    assert (config["num_key_value_layers"], config["key_value_group_size"], config["swiftkv"]) == (2, 1, True)
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"


def test_the_replies_are_the_teachers_greedy_ones_from_every_source(guide):
    from transformers import AutoModelForCausalLM

    from swiftkv.data.tokens import prompt_ids, prompt_key

    folder, *_ = guide
    records = [json.loads(line) for line in (folder / "replies.jsonl").read_text().splitlines()]
    assert len(records) >= 30 and all(len(r["reply_ids"]) <= 9 for r in records)  # 8 tokens + the end token
    tags = {r["messages"][0]["content"].split()[0] for r in records}
    assert tags == set(SOURCE_TAGS.values())  # the three sources, interleaved
    tokenizer = byte_tokenizer()
    teacher = AutoModelForCausalLM.from_pretrained(folder / "teacher", dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    for record in records[:4]:
        ids = prompt_ids(tokenizer, record["messages"][:-1])
        assert prompt_key(ids) == record["key"]
        with torch.no_grad():
            out = teacher.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )
        expected = out[0, len(ids) :].tolist()
        assert record["reply_ids"][: len(expected)] == expected  # tp = 2 on vLLM's CPU build = HF's greedy


def test_the_plan_prints_memory_per_process_that_adds_up(guide):
    _, outputs, _ = guide
    assert "seq 128 x micro-batch 1" in outputs["plan"]  # the recipe's micro-batch, the tiny blocks
    line = re.search(r"fsdp x 2: (.*) [MG]iB per process", outputs["plan"])  # MiB at the tiny size
    assert line, outputs["plan"]
    parts = dict(re.findall(r"(\w+) ([\d.]+)", line.group(1)))
    total = float(parts.pop("total"))
    assert abs(sum(map(float, parts.values())) - total) < 0.01 * len(parts)


def test_the_replies_plan_counts_the_prompts_and_times_them_on_two_engines(guide):
    _, outputs, _ = guide
    prompts = re.search(r"replies: about ([\d,]+) prompts of (\d+) tokens", outputs["replies-plan"])
    assert prompts and int(prompts.group(1).replace(",", "")) > 0, outputs["replies-plan"]
    assert "h on 2 engine(s)" in outputs["replies-plan"]


def test_the_distilled_folder_trained_only_the_swiftkv_parameters(guide):
    from safetensors.torch import load_file

    folder, *_ = guide
    summary = json.loads((folder / "distilled" / "distill.json").read_text())
    assert summary["settings"]["recipe"] == "reference-large" and summary["steps"] >= 1
    assert summary["settings"]["batch_size"] == 8 and summary["settings"]["lr"] == 2e-4
    source, trained = (
        load_file(folder / "n2" / "model.safetensors"),
        load_file(folder / "distilled" / "model.safetensors"),
    )
    changed = {name for name in trained if not torch.equal(trained[name].float(), source[name].float())}
    assert changed and all("swiftkv" in name for name in changed)


def test_eval_wrote_its_report(guide):
    folder, *_ = guide
    results = json.loads((folder / "eval" / "results.json").read_text())
    assert (folder / "eval" / "report.md").is_file() and results["tasks"] == ["arc_challenge", "winogrande"]
    for task in results["students"][0]["tasks"].values():  # --limit 4: the same 4 items for both models
        assert task["items"] == 4 and all(0 <= m["acc"] <= 1 for m in task["metrics"].values())


def test_the_served_completion_is_the_distilled_models_greedy_one(guide):
    from transformers import AutoModelForCausalLM

    import swiftkv  # noqa: F401 - registers the SwiftKV architectures with transformers

    folder, outputs, _ = guide
    answer = json.loads(outputs["curl"])
    model = AutoModelForCausalLM.from_pretrained(folder / "distilled", dtype=torch.float32).eval()
    tokenizer = byte_tokenizer()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    new_ids = out[0, ids.shape[1] :]
    expected = tokenizer.decode(new_ids, skip_special_tokens=True)
    text = answer["choices"][0]["text"]
    assert answer["usage"]["completion_tokens"] == len(new_ids) == 16
    # vLLM holds back the bytes of a UTF-8 character still unfinished at the end (a random model's bytes);
    # transformers decodes them as one replacement character
    assert text == expected or (
        expected == text + "\ufffd" and answer["choices"][0]["finish_reason"] == "length"
    )


def test_the_benchmark_compares_both_models_at_the_same_kv_memory(guide):
    folder, *_ = guide
    report = json.loads((folder / "bench" / "bench.json").read_text())
    assert report["settings"]["kv_cache_memory_bytes"] == KV_BYTES
    assert report["baseline"]["kv_cache_tokens"] == report["swiftkv"]["kv_cache_tokens"] > 0  # G = 1
    assert report["baseline"]["prefill_tok_s"] > 0 and report["swiftkv"]["prefill_tok_s"] > 0
