"""Paired comparison and argument parsing of `swiftkv eval`, on hand-made examples."""

import math

import pytest

from swiftkv.evaluate.chat import first_divergence
from swiftkv.evaluate.harness import available_tasks, parse_limits, parse_tasks
from swiftkv.evaluate.report import paired_greedy_table, paired_long_qa_table
from swiftkv.evaluate.stats import mcnemar_exact_p, paired_comparison, paired_divergences, paired_runs
from swiftkv.results import StudentResult, TaskResult


def test_mcnemar_exact_p_matches_hand_computation():
    # 10 discordant items, 8 favour the teacher: p = 2 * P(Bin(10, 1/2) <= 2) = 2 * (1 + 10 + 45) / 1024.
    assert mcnemar_exact_p(8, 2) == pytest.approx(112 / 1024, abs=1e-15)
    assert mcnemar_exact_p(2, 8) == pytest.approx(112 / 1024, abs=1e-15)
    assert mcnemar_exact_p(5, 5) == 1.0  # capped: the two tails overlap
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(6, 0) == pytest.approx(2 / 64, abs=1e-15)
    assert 0 < mcnemar_exact_p(3000, 2800) < 0.02  # large n stays exact (integers), no overflow


def test_paired_comparison_on_hand_made_items():
    teacher_correct = [1, 1, 1, 0, 0, 1]
    student_correct = [1, 0, 1, 0, 1, 0]
    teacher_pred = [2, 0, 1, 3, 1, 0]
    student_pred = [2, 1, 1, 2, 0, 3]  # same answer on items 0, 2 only (item 3: both wrong, different)
    result = paired_comparison(teacher_correct, student_correct, teacher_pred, student_pred)
    diffs = [0, -1, 0, 0, 1, -1]  # student - teacher; mean -1/6
    mean = -1 / 6
    stderr = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 5 / 6)
    assert result["n"] == 6
    assert result["teacher"] == pytest.approx(4 / 6)
    assert result["student"] == pytest.approx(3 / 6)
    assert result["diff"] == pytest.approx(mean)
    assert result["diff_stderr"] == pytest.approx(stderr)
    assert result["agreement"] == pytest.approx(2 / 6)
    assert (result["teacher_only_correct"], result["student_only_correct"]) == (2, 1)
    assert result["mcnemar_p"] == pytest.approx(1.0)  # 2 vs 1 discordant: no evidence


def test_paired_comparison_rejects_unpaired_input():
    with pytest.raises(ValueError, match="same items"):
        paired_comparison([1, 0], [1], [0, 1], [0, 1])


def test_first_divergence_pads_finished_answers_with_eos():
    assert first_divergence([5, 6, 7], [5, 6, 7], window=3, eos=2) == 3
    assert first_divergence([5, 6, 8], [5, 6, 7], window=3, eos=2) == 2
    assert first_divergence([5, 2], [5], window=4, eos=2) == 4  # both stopped after token 5
    assert first_divergence([5], [5, 9], window=4, eos=2) == 1


def test_parse_tasks_names_the_unknown_and_lists_the_available():
    assert parse_tasks("arc_easy, mmlu_anatomy") == ["arc_easy", "mmlu_anatomy"]
    with pytest.raises(
        ValueError, match=r"unknown task\(s\) \['arc_hard'\]; available: arc_easy, arc_challenge"
    ):
        parse_tasks("arc_easy,arc_hard")
    tasks = available_tasks()
    assert tasks[:6] == ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "mmlu"]
    assert sum(name.startswith("mmlu_") for name in tasks) == 57


def test_parse_limits_global_and_per_task():
    tasks = ["arc_easy", "hellaswag", "mmlu"]
    assert parse_limits(None, tasks) == {"arc_easy": None, "hellaswag": None, "mmlu": None}
    assert parse_limits("7", tasks) == {"arc_easy": 7, "hellaswag": 7, "mmlu": 7}
    assert parse_limits("hellaswag=2000,mmlu=2000", tasks) == {
        "arc_easy": None,
        "hellaswag": 2000,
        "mmlu": 2000,
    }
    with pytest.raises(ValueError, match="'piqa', which is not in --tasks"):
        parse_limits("piqa=5", tasks)
    with pytest.raises(ValueError, match="not a positive integer"):
        parse_limits("hellaswag=lots", tasks)


def test_sweep_points_follow_fractions_and_group_sizes():
    from swiftkv.evaluate.sweep import parse_fractions, parse_group_sizes, sweep_points

    assert parse_fractions("25%,40%, 0.5") == [0.25, 0.40, 0.5]
    assert sweep_points(30, [0.25, 0.4, 0.5], [1, 2]) == [(22, 1), (22, 2), (18, 1), (18, 2), (15, 1)]
    with pytest.raises(ValueError, match="'150%' is not a fraction"):
        parse_fractions("150%")
    with pytest.raises(ValueError, match="not a list of positive integers"):
        parse_group_sizes("1,x")


def test_tasks_none_means_chat_only():
    assert parse_tasks("none") == [] and parse_tasks(" None ") == []
    with pytest.raises(ValueError, match="unknown task"):
        parse_tasks("none,arc_easy")


def task_run(correct, answers, ids=("t/0", "t/1", "t/2", "t/3")) -> TaskResult:
    return TaskResult.from_json(
        {"item_ids": list(ids), "answers": {"student": answers}, "correct": {"student": correct}}
    )


def test_paired_runs_pairs_two_runs_students_item_by_item():
    before = task_run([1, 1, 0, 0], [0, 1, 2, 3])
    after = task_run([1, 0, 1, 1], [0, 2, 1, 1])
    paired = paired_runs(before, after)
    assert (paired["teacher"], paired["student"], paired["diff"]) == (0.5, 0.75, 0.25)
    assert (paired["teacher_only_correct"], paired["student_only_correct"]) == (1, 2)
    assert paired["agreement"] == 0.25 and paired["mcnemar_p"] == mcnemar_exact_p(1, 2)
    with pytest.raises(ValueError, match="different items"):
        paired_runs(before, task_run([1, 0, 1], [0, 2, 1], ids=("t/0", "t/1", "t/2")))
    with pytest.raises(ValueError, match="without per-item correctness"):
        paired_runs(TaskResult.from_json({"item_ids": list(before.item_ids), "answers": {}}), after)


def test_paired_divergences_pair_two_students_prompt_by_prompt():
    before, after = [3, 0, 32, 5, 7], [4, 2, 32, 1, 9]  # after - before: 1, 2, 0, -4, 2 (mean 1/5)
    paired = paired_divergences(before, after)
    diffs, mean = [1, 2, 0, -4, 2], 1 / 5
    assert (paired["n"], paired["before"], paired["after"]) == (5, 47 / 5, 48 / 5)
    assert paired["diff"] == pytest.approx(mean)
    assert paired["diff_stderr"] == pytest.approx(math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4 / 5))
    assert (paired["before_longer"], paired["after_longer"]) == (1, 3)  # the tie drops out
    assert paired["sign_p"] == mcnemar_exact_p(1, 3)
    with pytest.raises(ValueError, match="the same prompts for both students; got 5 and 4"):
        paired_divergences(before, after[:4])


def greedy_student(chat: list[int] | None, long: list[int] | None, new_tokens: int = 32) -> StudentResult:
    def greedy(divergences):
        return {"prompts": 4, "new_tokens": new_tokens, "first_divergences": divergences}

    return StudentResult.from_json({"generation": greedy(chat), "long_prompt": greedy(long)})


def test_paired_greedy_table_pairs_two_runs_prompt_by_prompt():
    """compare.py's and the soup cards' table: each row one kind of greedy answer, paired prompt by prompt."""
    before, after = greedy_student([1, 4, 32, 2], [3, 3, 3, 3]), greedy_student([2, 9, 32, 1], [3, 5, 6, 3])
    lines = paired_greedy_table(before, after, ("old", "new"))
    assert lines[0].startswith("| greedy answers | prompts | old | new |") and "longer: old / new" in lines[0]
    chat = paired_divergences([1, 4, 32, 2], [2, 9, 32, 1])
    assert lines[2] == (
        f"| chat | 4 | 9.75 | 11.00 | +1.25 (± {chat['diff_stderr']:.2f}) | 1 / 2 | {chat['sign_p']:.2g} |"
    )
    assert lines[3].startswith("| long prompts | 4 | 3.00 | 4.25 | +1.25 ") and "| 0 / 2 |" in lines[3]
    assert paired_greedy_table(greedy_student(None, None), after) == []  # an older run: no per-prompt record
    with pytest.raises(ValueError, match="answers of 32 and 64 tokens"):
        paired_greedy_table(before, greedy_student([2, 9, 32, 1], None, new_tokens=64))


def long_qa_student(
    sets: dict[str, list[int]], teacher: list[int] | None = None, identical: list[int] | None = None
) -> StudentResult:
    def qa_set(correct):
        ids = [f"q{i}" for i in range(len(correct))]
        roles = {"student": correct} | ({"teacher": teacher} if teacher else {})
        return {
            "item_ids": ids,
            "answers": {"student": [str(c) for c in correct]},
            "correct": roles,
            "identical": identical,
        }

    return StudentResult.from_json({"long_qa": {name: qa_set(correct) for name, correct in sets.items()}})


def test_paired_long_qa_table_pairs_two_students_item_by_item():
    """compare.py's long-QA table: each set both runs scored, after against before, item by item: correct, and
    (where both runs recorded the teacher's answers) the teacher's verdict and the teacher's very answer."""
    teacher = [1, 0, 0, 1]
    before = long_qa_student({"short": [1, 1, 0, 0], "long": [0, 0, 0, 1]}, teacher, identical=[1, 0, 0, 0])
    after = long_qa_student(
        {"short": [1, 0, 1, 1], "long": [1, 1, 0, 1], "own": [1, 1, 1, 1]}, teacher, identical=[1, 1, 0, 1]
    )
    lines = paired_long_qa_table(before, after, ("shipped", "mix"))
    assert (
        lines[0].startswith("| long-QA set | items | measure | shipped | mix |")
        and "only: shipped / mix" in lines[0]
    )
    short = paired_runs(before.long_qa["short"], after.long_qa["short"])
    assert lines[2] == (
        f"| short | 4 | correct | 0.500 | 0.750 | +0.250 (± {short['diff_stderr']:.3f}) | 1 / 2 | "
        f"{mcnemar_exact_p(1, 2):.2g} |"
    )
    # the teacher's verdict ([1, 0, 0, 1]): before's agrees on items 0 and 2, after's on 0, 1 and 3
    assert (
        lines[3].startswith("| short | 4 | teacher's verdict | 0.500 | 0.750 | +0.250 ")
        and "| 1 / 2 |" in lines[3]
    )
    assert (
        lines[4].startswith("| short | 4 | teacher's answer | 0.250 | 0.750 | +0.500 ")
        and "| 0 / 2 |" in lines[4]
    )
    assert lines[5].startswith("| long | 4 | correct | 0.250 | 0.750 | +0.500 ") and "| 0 / 2 |" in lines[5]
    assert len(lines) == 8  # "own" is in one run only
    plain = long_qa_student({"short": [1, 1, 0, 0]})  # a run that kept only the student's verdicts
    assert [line.split(" | ")[2] for line in paired_long_qa_table(plain, after)[2:]] == ["correct"]
    assert paired_long_qa_table(StudentResult.from_json({}), after) == []  # a run without --long-qa
    with pytest.raises(ValueError, match="different items"):
        paired_long_qa_table(before, long_qa_student({"short": [1, 0, 1]}))
