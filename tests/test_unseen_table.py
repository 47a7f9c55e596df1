"""scripts/study/eval/unseen_table.py: the one table of what each student keeps on unseen work, from eval records."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "study" / "eval" / "unseen_table.py"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("unseen_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paired(teacher: float, student: float, stderr: float, n: int = 64) -> dict:
    return {"n": n, "teacher": teacher, "student": student, "diff": student - teacher, "diff_stderr": stderr}


def test_the_suites_mean_drop_pairs_the_tasks_and_combines_their_errors(table):
    suite = {"students": [{"tasks": {"a": {"paired": {"acc": paired(0.5, 0.4, 0.03, 100)}},
                                     "b": {"paired": {"acc": paired(0.3, 0.3, 0.04, 300)}}}}]}  # fmt: skip
    drop = table.suite_drop(suite)
    assert drop["teacher"] == pytest.approx(0.4) and drop["diff"] == pytest.approx(-0.05)
    assert drop["diff_stderr"] == pytest.approx(0.025) and drop["n"] == 400  # sqrt(.03² + .04²) / 2


def records(table) -> tuple[dict, dict, dict]:
    """(long-prompt record, instructions record, suites by N) of students N = 15 and 22 with the floor."""

    def long_record(score: float) -> dict:
        sets = {name: {"items": 64, "paired": {"correct": paired(0.5, score, 0.05), "f1": paired(0.3, score / 2, 0.02)}}
                for name in table.UNSEEN_LONG_SETS}  # fmt: skip
        return {"long_qa": sets}

    def followed(score: float) -> dict:
        measures = {m: paired(0.6, score, 0.02, 490) for m in table.INSTRUCTION_MEASURES}
        return {"instruction_following": {"name": "simple", "items": 490, "paired": measures}}

    pair = {"num_key_value_layers": 15}, {"num_key_value_layers": 22}
    floor_pair = {"cache_keys": {"student": "1ed6-bfloat16"}}
    long_results = {"students": [{"pair": p, **long_record(s)} for p, s in zip(pair, (0.1, 0.4), strict=True)],
                    "floor": {"pair": floor_pair, **long_record(0.5)}}  # fmt: skip
    instructions = {"students": [{"pair": p, **followed(s)} for p, s in zip(pair, (0.3, 0.5), strict=True)],
                    "floor": followed(0.6)}  # fmt: skip
    suite = {"students": [{"tasks": {"a": {"paired": {"acc": paired(0.4, 0.39, 0.01, 1000)}}}}]}
    return long_results, instructions, {15: suite, 22: suite}


def test_a_partial_instruction_run_is_one_error_naming_what_it_lacks(table):
    long_results, instructions, suites = records(table)
    partial = {"students": instructions["students"][:1], "floor": None}  # the run stopped after N = 15
    with pytest.raises(
        ValueError,
        match=r"instructions records hold the students N = \[15\] and no floor: expected N = \[15, 22\], ",
    ):
        table.unseen_table(long_results, partial, suites)


def test_each_row_holds_the_teacher_the_floor_and_each_student_by_n(table):
    long_results, instructions, suites = records(table)
    lines = table.unseen_table(long_results, instructions, suites)
    assert lines[0] == "| measure | items | teacher | floor (bfloat16) | N = 15 | N = 22 |"
    assert lines[2] == (
        "| instructions followed (simple), strict | 490 | 0.600 | 0.600 (+0.000 ± 0.020) | "
        "0.300 (-0.300 ± 0.020) | 0.500 (-0.100 ± 0.020) |"
    )
    assert (
        "| SQuAD, ~500 tokens: F1 | 64 | 0.300 | 0.250 (-0.050 ± 0.020) | 0.050 (-0.250 ± 0.020) |"
        in lines[5]
    )
    assert lines[-1].startswith(
        "| lm-eval mean accuracy (6 tasks) | 1,000 | 0.400 | – | 0.390 (-0.010 ± 0.010)"
    )
    assert len(lines) == 2 + 2 + 2 * len(table.UNSEEN_LONG_SETS) + 1


def test_one_students_column_as_its_model_card_shows_it(table):
    long_results, instructions, suites = records(table)
    lines = table.unseen_table(long_results, instructions, {22: suites[22]}, ns=[22])
    assert lines[0] == "| measure | items | teacher | floor (bfloat16) | N = 22 |"
    assert lines[2].endswith("| 0.600 (+0.000 ± 0.020) | 0.500 (-0.100 ± 0.020) |")
    with pytest.raises(ValueError, match=r"suite records hold the students N = \[22\]: expected N = \[15\]$"):
        table.unseen_table(long_results, instructions, {22: suites[22]}, ns=[15])
