"""`swiftkv eval --long-qa`: the JSONL reader (each bad line one error naming its number), the SQuAD-style
scorer, the paired report on a tiny teacher against itself (exact agreement) and against a tiny SwiftKV
student (numbers recomputed from the per-item records), the command line, and the shipped default sets
(held-out passages only, one answer per item, rebuilt byte for byte by their script: slow)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swiftkv.cli import main
from swiftkv.data import sharegpt
from swiftkv.data.passage_qa import contains_answer, normalize_answer
from swiftkv.evaluate.long_qa import (
    DEFAULT_SETS,
    DEFAULT_SETS_DIR,
    QAItem,
    check_qa_context,
    long_qa_agreement,
    qa_sets,
    read_qa_file,
    score_answer,
)
from swiftkv.evaluate.pair import load_pair
from swiftkv.evaluate.stats import mcnemar_exact_p
from swiftkv.evaluate.store import ResultStore
from tests.tiny import WORDS, random_student, save_tiny_folder, tiny_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SwiftKV student (N=3 of 6, visibly different projections) and its plain teacher (same
    weights), over the word-level tokenizer: their answers decode to WORDS, which normalise to themselves."""
    root = tmp_path_factory.mktemp("long_qa_models")
    teacher, student = random_student("llama", 3, swiftkv_std=0.2, tie_word_embeddings=True)
    return {
        "teacher": save_tiny_folder(root / "teacher", teacher, tiny_tokenizer()),
        "student": save_tiny_folder(root / "student", student, tiny_tokenizer()),
    }


def tiny_items(count: int = 6) -> list[QAItem]:
    """Items of WORDS (the instruction's words are unknown tokens to the tiny tokenizer: still a prompt)."""
    return [
        QAItem(
            f"i{k}",
            tuple(" ".join(WORDS[(k * 7 + 3 * p + j) % 100] for j in range(12)) for p in range(2)),
            f"w{k} w{k + 1}",
            ("w99",),
        )
        for k in range(count)
    ]


# -- the reader -----------------------------------------------------------------------------------


def test_reads_a_good_file(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"passages": ["First passage.", "Second."], "question": "Who?", "answer": "Ada", "id": "q1"},
            {"passages": "One passage.", "question": "When?", "answer": ["1843", "in 1843"], "extra": 5},
        ],
    )
    path.write_text(path.read_text() + "\n  \n")  # blank lines are skipped
    items = read_qa_file(path)
    assert items == [
        QAItem("q1", ("First passage.", "Second."), "Who?", ("Ada",)),
        QAItem("mine-2", ("One passage.",), "When?", ("1843", "in 1843")),
    ]
    assert items[1].messages[0]["content"].endswith("Passage 1:\nOne passage.\n\nQuestion: When?")
    assert [len(items) for items in qa_sets(str(path), limit=1).values()] == [1]


GOOD = {"passages": ["p"], "question": "q?", "answer": "a1"}


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a JSON list; expected an object with passages"),
        (json.dumps({"question": "q", "answer": "a"}), "line 2: missing field 'passages'"),
        (
            json.dumps({**GOOD, "passages": 3}),
            "line 2: field 'passages' is int 3; expected a list of strings",
        ),
        (json.dumps({**GOOD, "passages": []}), "line 2: field 'passages' is an empty list"),
        (json.dumps({**GOOD, "passages": ["ok", 7]}), "line 2: field 'passages' is list [\"ok\", 7]"),
        (json.dumps({**GOOD, "passages": "  "}), "line 2: field 'passages' is str"),
        (json.dumps({"passages": ["p"], "answer": "a"}), "line 2: missing field 'question'"),
        (json.dumps({**GOOD, "question": ["q?"]}), "line 2: field 'question' is list"),
        (json.dumps({"passages": ["p"], "question": "q"}), "line 2: missing field 'answer'"),
        (
            json.dumps({**GOOD, "answer": 4471}),
            "line 2: field 'answer' is int 4471; expected a string or a list",
        ),
        (json.dumps({**GOOD, "answer": "The"}), "line 2: answer 'The' is empty once normalised"),
        (json.dumps({**GOOD, "id": 12}), "line 2: field 'id' is int; expected a string"),
    ],
)
def test_a_bad_line_is_one_error_naming_its_number(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(ValueError) as error:
        read_qa_file(path)
    assert f"{path} {message}" in str(error.value)


def test_an_empty_or_missing_file_is_one_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no items"):
        read_qa_file(tmp_path / "empty.jsonl")
    with pytest.raises(FileNotFoundError, match="is not a file; expected a JSONL file or 'default'"):
        qa_sets(str(tmp_path / "nope.jsonl"))


# -- the scorer -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The Access-Code is 4471!", "accesscode is 4471"),
        ("  an   apple,\tA pear\n", "apple pear"),
        ("Theatre the", "theatre"),  # articles as words only
        ("Rotterdam.", "rotterdam"),
    ],
)
def test_squad_normalisation(text, normalised):
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize(
    "answer, golds, expected",
    [
        ("It is 4471.", ("4471",), (1, 0)),
        ("4471.", ("4471",), (1, 1)),
        ("The code is 44712", ("4471",), (0, 0)),  # whole words only
        ("The teal box", ("Teal",), (1, 0)),
        ("the Teal!", ("teal",), (1, 1)),
        ("Maria", ("Maria Okafor",), (0, 0)),
        ("Okafor", ("Maria Okafor", "okafor"), (1, 1)),
        ("", ("4471",), (0, 0)),
    ],
)
def test_score_is_containment_and_exact_match_of_normalised_answers(answer, golds, expected):
    assert score_answer(answer, golds) == expected
    assert contains_answer(answer, golds[0]) == any(
        f" {normalize_answer(g)} " in f" {normalize_answer(answer)} " for g in golds[:1]
    )


# -- the paired measure ---------------------------------------------------------------------------


def test_teacher_against_itself_agrees_exactly(models):
    items = tiny_items()
    pair = load_pair(str(models["teacher"]), str(models["teacher"]), torch.float32)
    first = long_qa_agreement(pair, ResultStore(None), "t", items, 6, progress=False)
    gold = first["answers"]["teacher"][0].split()[0]  # one item right for both
    items[0] = QAItem("i0", items[0].passages, items[0].question, (gold,))
    qa = long_qa_agreement(pair, ResultStore(None), "t", items, 6, progress=False)
    assert qa["answers"]["teacher"] == qa["answers"]["student"] == first["answers"]["teacher"]
    assert qa["identical"] == [1] * 6 and qa["identical_fraction"] == 1 and qa["identical_stderr"] == 0
    correct = qa["paired"]["correct"]
    assert correct["teacher"] == correct["student"] == pytest.approx(sum(qa["correct"]["teacher"]) / 6)
    assert qa["correct"]["teacher"][0] == 1
    assert correct["diff"] == 0 and correct["diff_stderr"] == 0 and correct["agreement"] == 1
    assert correct["mcnemar_p"] == 1 and qa["agreement_stderr"] == 0
    assert qa["both_right"] + qa["both_wrong"] == 6 and qa["both_right"] >= 1


def test_student_against_teacher_from_the_command_line(models, tmp_path, capsys):
    """Golds are taken from a first pass so that each verdict occurs; the CLI's numbers are then recomputed
    from its per-item records, and those records from the answers by a scorer written out here."""
    pair = load_pair(str(models["student"]), str(models["teacher"]), torch.float32)
    assert pair.mode == "shared"
    items = tiny_items()
    answers = long_qa_agreement(pair, ResultStore(None), "x", items, 6, progress=False)["answers"]
    teacher_words = [a.split() for a in answers["teacher"]]
    student_words = [a.split() for a in answers["student"]]
    golds = [
        [teacher_words[0][0]],  # teacher right
        [student_words[1][0]],  # student right
        [teacher_words[2][0], student_words[2][0]],  # both right
        ["w99 w98"],  # both wrong
        [answers["teacher"][4]],  # the teacher's whole answer: its exact match
        [student_words[5][-1]],
    ]
    records = [
        {"passages": list(item.passages), "question": item.question, "answer": gold}
        for item, gold in zip(items, golds, strict=True)
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", records)
    out = tmp_path / "report"
    argv = ["eval", str(models["student"]), "--teacher", str(models["teacher"]), "--tasks", "none"]
    argv += ["--chat-conversations", "0", "--gen-prompts", "0", "--long-prompts", "0", "--floor"]
    argv += ["--long-qa", str(path), "--long-qa-tokens", "6", "--dtype", "float32", "--out", str(out)]
    assert main([*argv, "--cache", str(tmp_path / "c.sqlite"), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    qa = results["students"][0]["long_qa"]["mine"]
    printed = f"long-QA mine: 6 items, correct teacher {qa['paired']['correct']['teacher']:.3f} student "
    assert printed in capsys.readouterr().out
    assert qa["answers"] == answers and qa["item_ids"] == [f"mine-{k}" for k in range(1, 7)]
    for role in ("teacher", "student"):
        padded = [f" {a} " for a in answers[role]]  # WORDS answers: already normalised
        assert qa["correct"][role] == [
            int(any(f" {g} " in a for g in gs)) for a, gs in zip(padded, golds, strict=True)
        ]
        assert qa["exact_match"][role] == [int(a in gs) for a, gs in zip(answers[role], golds, strict=True)]
    teacher, student = qa["correct"]["teacher"], qa["correct"]["student"]
    assert teacher[:4] == [1, 0, 1, 0] and student[1:4] == [1, 1, 0] and qa["exact_match"]["teacher"][4] == 1
    correct = qa["paired"]["correct"]
    assert correct["teacher"] == pytest.approx(sum(teacher) / 6)
    assert correct["student"] == pytest.approx(sum(student) / 6)
    diffs = [s - t for t, s in zip(teacher, student, strict=True)]
    mean = sum(diffs) / 6
    assert correct["diff"] == pytest.approx(mean)
    assert correct["diff_stderr"] == pytest.approx((sum((d - mean) ** 2 for d in diffs) / 5 / 6) ** 0.5)
    only = (
        sum(t > s for t, s in zip(teacher, student, strict=True)),
        sum(s > t for t, s in zip(teacher, student, strict=True)),
    )
    assert (correct["teacher_only_correct"], correct["student_only_correct"]) == only
    assert correct["mcnemar_p"] == pytest.approx(mcnemar_exact_p(*only))
    assert qa["both_right"] == sum(t and s for t, s in zip(teacher, student, strict=True))
    assert qa["both_right"] + qa["both_wrong"] + sum(only) == 6
    assert correct["agreement"] == pytest.approx((qa["both_right"] + qa["both_wrong"]) / 6)
    assert qa["identical"] == [
        int(t == s) for t, s in zip(answers["teacher"], answers["student"], strict=True)
    ]
    assert qa["identical_fraction"] == pytest.approx(sum(qa["identical"]) / 6)
    floor = results["floor"]["long_qa"]["mine"]  # the teacher in bfloat16 against itself in float32
    assert floor["answers"]["teacher"] == answers["teacher"] and floor["items"] == 6
    report = (out / "report.md").read_text()
    assert "## Long-prompt QA" in report and "| mine | floor | 6 |" in report
    row = f"| mine | S1 | 6 | {qa['prompt_tokens_mean']:.0f} | {correct['teacher']:.3f} → {correct['student']:.3f} ("
    assert row in report
    assert results["settings"]["long_qa"] == str(path) and results["settings"]["long_qa_tokens"] == 6


def test_a_bad_file_fails_on_the_command_line_before_any_model_loads(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"passages": ["p"], "answer": "a"}) + "\n")
    code = main(
        ["eval", str(tmp_path / "no-such-model"), "--long-qa", str(path), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"swiftkv eval: error: {path} line 2: missing field 'question'; expected a string"
    assert not any("no-such-model" in line for line in err)


def test_a_prompt_longer_than_the_context_is_refused_before_scoring(models):
    tokenizer = tiny_tokenizer()
    long = QAItem("big", (" ".join(WORDS * 3),), "w1", ("w2",))
    with pytest.raises(ValueError, match=r"--long-qa mine: item 'big' needs \d+ tokens .* context is 256"):
        check_qa_context(tokenizer, {"mine": [*tiny_items(1), long]}, 256, 6)
    check_qa_context(tokenizer, {"mine": tiny_items(1)}, 256, 6)


# -- the shipped default sets ---------------------------------------------------------------------


def test_the_default_sets_answer_each_question_from_one_held_out_passage():
    sets = qa_sets("default")
    assert list(sets) == list(DEFAULT_SETS) and [len(items) for items in sets.values()] == [64, 64]
    for name in DEFAULT_SETS:
        for line in (DEFAULT_SETS_DIR / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            holders = [
                i + 1 for i, p in enumerate(record["passages"]) if contains_answer(p, record["answer"])
            ]
            assert holders == [record["answer_passage"]], record["id"]
            assert not contains_answer(record["question"], record["answer"])
            indexes = [int(part.split()[2]) for part in record["source"].split("; ")]
            assert len(indexes) == len(record["passages"])
            assert all(sharegpt.HELDOUT_START <= i < sharegpt.COMPLETE_RECORDS for i in indexes)
    sources = [
        s
        for name in DEFAULT_SETS
        for line in (DEFAULT_SETS_DIR / f"{name}.jsonl").open()
        for s in json.loads(line)["source"].split("; ")
    ]
    assert len(sources) == len(set(sources))  # each passage serves one item


@pytest.mark.slow  # the 125 MB ShareGPT file and the SmolLM2 tokenizer
def test_the_script_rebuilds_the_default_sets_byte_for_byte(tmp_path):
    script = ROOT / "scripts" / "build_long_qa.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    for name in DEFAULT_SETS:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (DEFAULT_SETS_DIR / f"{name}.jsonl").read_bytes()
