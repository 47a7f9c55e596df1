"""`swiftkv eval` on the device and over several processes: batched scoring equals one request at a time,
two torchrun processes (gloo) write the same results.json as one process, and a device that is not there
is refused before any model loads."""

import json
import re

import pytest
import torch

from swiftkv.cli import main
from swiftkv.evaluate.loglikelihood import LoglikelihoodScorer
from swiftkv.evaluate.pair import ROLES, load_pair
from swiftkv.evaluate.processes import Processes, eval_device
from swiftkv.evaluate.store import ResultStore
from tests.test_distill_fsdp import torchrun
from tests.test_evaluate import REQUESTS, save_models
from tests.tiny import byte_tokenizer

# Batching changes only the shapes the fp32 kernels see (padding never reaches a scored row: right
# padding under a causal mask), so a batched score may differ from the one-request score by rounding alone.
BATCHING_TOLERANCE = 1e-4  # absolute, on a summed log-likelihood of a few to ~30 tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_models(tmp_path_factory.mktemp("models"), byte_tokenizer())


MORE_REQUESTS = [
    *REQUESTS,
    *[(f"Item {i}: the numbers {' '.join(map(str, range(i)))} continue with", f" {i}") for i in range(12)],
]


def test_batched_scores_equal_one_request_at_a_time(models, tmp_path):
    pair = load_pair(str(models["student"]), None, dtype=torch.float32)
    scores = {}
    for batch_tokens in (1, 4096):  # 1: each request alone (a batch always takes at least one)
        scorer = LoglikelihoodScorer(
            pair, ResultStore(tmp_path / f"{batch_tokens}.sqlite"), batch_tokens=batch_tokens, progress=False
        )
        scores[batch_tokens] = {role: scorer.loglikelihood(MORE_REQUESTS, role) for role in ROLES}
    for role in ROLES:
        alone, batched = scores[1][role], scores[4096][role]
        assert [greedy for _, greedy in alone] == [greedy for _, greedy in batched]
        worst = max(abs(a - b) for (a, _), (b, _) in zip(alone, batched, strict=True))
        assert worst < BATCHING_TOLERANCE, (role, worst)


def test_items_are_dealt_round_robin_and_returned_in_order():
    one = list(Processes().computed(list(range(5)), lambda item: item * item))
    assert one == [(i, i * i) for i in range(5)]


def test_a_device_that_is_not_there_is_refused():
    assert eval_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert eval_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="--device cuda: no CUDA device is visible"):
            eval_device("cuda")
    with pytest.raises(ValueError, match="--device 'tpu' is unknown"):
        eval_device("tpu")


def eval_args(models, out, long_qa) -> list[str]:
    return [
        "eval",
        str(models["student"]),
        "--teacher",
        str(models["teacher"]),
        "--tasks",
        "arc_easy,mmlu_anatomy",
        "--limit",
        "7",
        "--chat-conversations",
        "3",
        "--chat-max-tokens",
        "768",
        "--gen-prompts",
        "3",
        "--gen-tokens",
        "4",
        "--long-prompts",
        "0",
        "--long-qa",
        str(long_qa),
        "--long-qa-tokens",
        "4",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--batch-tokens",
        "512",
        "--out",
        str(out),
        "--cache",
        f"{out}.sqlite",  # each run its own cache: both compute everything
        "--no-progress",
    ]


def comparable(results: dict) -> dict:
    """results.json less what is not a result: the clocks and the process count."""
    results.pop("wall_time_s")
    results["settings"].pop("processes")
    for student in results["students"]:
        student.pop("seconds")
    return results


@pytest.mark.slow  # two torchrun processes; real task data and held-out chats
def test_two_processes_write_what_one_process_writes(models, tmp_path):
    long_qa = tmp_path / "qa.jsonl"
    items = [
        {"passages": [f"Note {i}: the key is {i * 7}."], "question": "What is the key?", "answer": str(i * 7)}
        for i in range(5)
    ]
    long_qa.write_text("".join(json.dumps(item) + "\n" for item in items))
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(eval_args(models, one, long_qa)) == 0
    run = torchrun(2, eval_args(models, two, long_qa))
    for rank in (0, 1):  # each process computed a share
        units = re.search(rf"process {rank} of 2: (\d+) units of work", run.stderr)
        assert units and int(units[1]) > 0, run.stderr[-2000:]
    results = {run: json.loads((run / "results.json").read_text()) for run in (one, two)}
    assert results[two]["settings"]["processes"] == 2 and results[one]["settings"]["processes"] == 1
    assert comparable(results[two]) == comparable(results[one])
    student = results[one]["students"][0]
    assert student["tasks"]["arc_easy"]["items"] == 7 and student["generation"]["prompts"] == 3
    assert student["teacher_forced"]["tokens"] > 0 and student["long_qa"]["qa"]["items"] == 5
    assert sorted(path.name for path in two.iterdir()) == ["report.md", "report.png", "results.json"]


@pytest.mark.slow  # two torchrun processes, each building the shipped student and its teacher from the GGUF
def test_two_processes_build_a_shipped_student_into_an_empty_cache(tmp_path, monkeypatch):
    """Once a process group exists, transformers writes a model folder on global rank 0 only: the
    models are opened (built into the cache) before it starts, or process 1 finds no config.json."""
    monkeypatch.setenv("SWIFTKV_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    only_instructions = ["--tasks", "none", "--chat-conversations", "0", "--gen-prompts", "0"]
    run = torchrun(
        2,
        [
            "eval", "smollm2-135m-instruct-swiftkv25", "--teacher", "smollm2-135m-instruct",
            *only_instructions, "--long-prompts", "0", "--instruction-following", "simple",
            "--instruction-items", "2", "--instruction-tokens", "4", "--out", str(out), "--no-progress",
        ],
    )  # fmt: skip
    assert "process 1 of 2: 0 units of work" in run.stderr, run.stderr[-2000:]  # one batch per model
    results = json.loads((out / "results.json").read_text())
    assert results["students"][0]["instruction_following"]["items"] == 2
