"""The evaluation report: `results.json` (every number), `report.md` (tables), `report.png` (bars).

`results` is what `run.evaluate_models` returns (a `results.EvalResults`, or its JSON dict): the
teacher, and per student its pair facts, per-task metrics with the paired comparison, chat agreement and
generation agreement.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..files import atomic_file, portable_path, write_atomic
from ..model.config import is_swiftkv
from ..plots import figure
from ..results import EvalResults, FloorResult, LongQA, StudentResult
from .instructions import MEASURES
from .pair import STUDENT, TEACHER
from .stats import check_same_items, paired_divergences, paired_hits, same_per_item


def write_report(results: EvalResults | dict, out: Path) -> list[Path]:
    """Write the three files atomically (temp name, then rename) and return their paths."""
    results = EvalResults.of(results)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "report.md", out / "report.png"]
    write_atomic(paths[0], json.dumps(results.to_json(), indent=2).encode())
    write_atomic(paths[1], markdown(results).encode())
    with atomic_file(paths[2]) as tmp_png:
        plot(results, tmp_png)
    return paths


def student_label(student: StudentResult) -> str:
    info = StudentResult.of(student).pair
    name = portable_path(info.student)
    if is_swiftkv(info):
        return f"{name} (N={info.num_key_value_layers}, G={info.key_value_group_size})"
    return name


def task_metric_rows(results: EvalResults) -> list[tuple[str, str]]:
    rows = []
    for task, entry in EvalResults.of(results).students[0].tasks.items():
        rows += [(task, metric) for metric in entry.paired]
    return rows


# --------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------


def markdown(results: EvalResults | dict) -> str:
    results = EvalResults.of(results)
    students = results.students
    teacher = portable_path(results.teacher)
    lines = [
        "# SwiftKV evaluation",
        "",
        f"Teacher: `{teacher}`; weights in {results.dtype}; wall time {results.wall_time_s:.0f} s.",
        "",
    ]
    if results.engines:
        scored = "; ".join(f"{measure}: {engine}" for measure, engine in results.engines.items())
        lines += [f"Scored by {scored}.", ""]
    for i, student in enumerate(students):
        lines.append(
            f"- S{i + 1}: `{student_label(student)}`, {student.pair.mode} pass, {student.seconds:.0f} s"
        )
    if students:
        lines += ["", *summary_table(results)]
    if students and students[0].tasks:
        lines += ["", *task_table(results)]
    lines += ["", *chat_tables(students), *long_prompt_table(results), *long_qa_table(results)]
    lines += instruction_table(results)
    lines += recipe_table(results.recipe)
    return "\n".join(lines) + "\n"


def recipe_table(recipe: dict | None) -> list[str]:
    """`--tasks snowflake`: one row per model, one column per task (its headline metric)."""
    if not recipe:
        return []
    tasks = recipe["tasks"]
    header = [
        f"{name} ({task['shots']}-shot{', chat' if task['chat'] else ''})" for name, task in tasks.items()
    ]
    lines = [
        f"## The {recipe['name']} recipe",
        "",
        f"Scored by {recipe['engine']}. Metric per task: "
        + ", ".join(f"{name} `{task['metric']}`" for name, task in tasks.items())
        + ".",
        "",
        "| model | " + " | ".join(header) + " |",
        "|---" * (len(tasks) + 1) + "|",
    ]
    for model, scores in recipe["models"].items():
        cells = [scores.get(name, {}).get(task["metric"]) for name, task in tasks.items()]
        lines.append(f"| {model} | " + " | ".join("-" if c is None else f"{c:.4f}" for c in cells) + " |")
    return [*lines, ""]


def summary_table(results: EvalResults) -> list[str]:
    """One row per model: what a reader compares first (accuracy per task, their mean, chat agreement)."""
    results = EvalResults.of(results)
    students = results.students
    tasks = list(students[0].tasks)
    header = (
        ["model", *tasks]
        + (["mean acc"] if tasks else [])
        + [
            "chat KL",
            "chat top-1",
            "greedy identical",
            "first divergence",
            "long top-1",
            "long first divergence",
        ]
    )
    lines = [
        "## Summary",
        "",
        "Accuracy is lm-eval's `acc`; the mean is unweighted over the tasks. Chat columns: "
        "teacher-forced KL(teacher‖student) and top-1 agreement on held-out ShareGPT; greedy identical: "
        "fraction of prompts whose first generated tokens equal the teacher's; first divergence: mean index of "
        "the first generated token that differs. Long: the same after 1-2k-token prompts (passages + a "
        "question, a document + a summary request), top-1 along the teacher's answer. The floor row is the "
        "teacher against itself at another dtype: the most agreement a student can be asked for.",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    teacher = [students[0].tasks[t].metrics[TEACHER]["acc"] for t in tasks]
    lines.append(summary_row("teacher", teacher, FloorResult()))
    if results.floor:
        floor = portable_path(results.floor.pair.student)
        lines.append(summary_row(f"floor: {floor}", [None] * len(tasks), results.floor))
    for i, student in enumerate(students):
        accuracy = [student.tasks[t].metrics[STUDENT]["acc"] for t in tasks]
        lines.append(summary_row(f"S{i + 1}", accuracy, student))
    return lines


def summary_row(name: str, accuracy: list[float | None], measured: StudentResult | FloorResult) -> str:
    """Accuracy cells, their mean, then the agreement measures of `measured` (a student or the floor)."""
    known = [value for value in accuracy if value is not None]
    mean = [sum(known) / len(known) if len(known) == len(accuracy) else None] if accuracy else []
    forced, generated, long = measured.teacher_forced, measured.generation, measured.long_prompt
    values = [
        *accuracy,
        *mean,
        forced.kl_mean if forced else None,
        forced.top1_agreement if forced else None,
        generated.identical_fraction if generated else None,
    ]
    cells = ["–" if value is None else f"{value:.3f}" for value in values]
    cells.append("–" if not generated else f"{generated.mean_first_divergence:.1f}")
    cells.append("–" if not long else f"{long.top1_agreement:.3f}")
    cells.append("–" if not long else f"{long.mean_first_divergence:.1f}")
    return f"| {name} | " + " | ".join(cells) + " |"


def task_table(results: EvalResults) -> list[str]:
    results = EvalResults.of(results)
    students = results.students
    header = (
        "| task | metric | items | teacher | " + " | ".join(f"S{i + 1}" for i in range(len(students))) + " |"
    )
    lines = [
        "## Multiple choice (lm-eval, zero-shot)",
        "",
        "Each student cell: accuracy; difference to the teacher ± paired standard error; agreement "
        "(same answer picked, right or wrong); McNemar exact p of the difference.",
        "",
        header,
        "|" + "---|" * (4 + len(students)),
    ]
    for task, metric in task_metric_rows(results):
        first = students[0].tasks[task]
        teacher = first.metrics[TEACHER]
        stderr = teacher.get(metric + "_stderr")
        cells = [f"{teacher[metric]:.4f} ± " + (f"{stderr:.4f}" if stderr is not None else "n/a")]
        for student in students:
            paired = student.tasks[task].paired[metric]
            cells.append(
                f"{paired.student:.4f} ({paired.diff:+.4f} ± {paired.diff_stderr:.4f}; "
                f"agree {paired.agreement:.3f}; p={paired.mcnemar_p:.2g})"
            )
        lines.append(f"| {task} | {metric} | {first.items} | " + " | ".join(cells) + " |")
    return lines


def chat_tables(students: list[StudentResult]) -> list[str]:
    lines = []
    students = [StudentResult.of(student) for student in students]
    forced = [(i, s.teacher_forced) for i, s in enumerate(students) if s.teacher_forced]
    if forced:
        lines += [
            "## Held-out chat, teacher-forced (assistant tokens)",
            "",
            "| student | conversations | tokens | KL(teacher‖student) per token | top-1 agreement | "
            "NLL teacher | NLL student |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| S{i + 1} | {f.conversations} | {f.tokens} | {or_zero(f.kl_mean):.4f} | "
            f"{or_zero(f.top1_agreement):.4f} | {or_zero(f.nll_teacher):.3f} | {or_zero(f.nll_student):.3f} |"
            for i, f in forced
        ]
        lines.append("")
    generated = [(i, s.generation) for i, s in enumerate(students) if s.generation]
    if generated:
        lines += [
            "## Held-out chat, greedy generation",
            "",
            "| student | prompts | identical first tokens | mean first divergence |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| S{i + 1} | {g.prompts} | {g.identical_fraction:.3f} (of {g.new_tokens}) | "
            f"{g.mean_first_divergence:.1f} |"
            for i, g in generated
        ]
        for i, g in generated:
            lines += ["", f"### Examples, S{i + 1}", ""]
            for example in g.examples:
                lines += [
                    f"**Prompt** (diverges at token {example.first_divergence}): {quote(example.prompt)}",
                    "",
                    f"- teacher: {quote(example.teacher)}",
                    f"- student: {quote(example.student)}",
                    "",
                ]
    return lines


def or_zero(value: float | None) -> float:
    """A teacher-forced measure the run did not record prints as 0."""
    return 0 if value is None else value


def long_prompt_table(results: EvalResults) -> list[str]:
    results = EvalResults.of(results)
    rows = [(f"S{i + 1}", s.long_prompt) for i, s in enumerate(results.students) if s.long_prompt]
    if results.floor and results.floor.long_prompt:
        rows.insert(0, ("floor", results.floor.long_prompt))
    if not rows:
        return []
    lines = [
        "## Long prompts (1-2k tokens), short answers",
        "",
        "| model | prompts | mean prompt tokens | KL along the teacher's answer | top-1 | identical first tokens "
        "| mean first divergence |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {lp.prompts} | {lp.prompt_tokens_mean:.0f} | {lp.kl_mean:.4f} | "
        f"{lp.top1_agreement:.3f} | {lp.identical_fraction:.3f} (of {lp.new_tokens}) | "
        f"{lp.mean_first_divergence:.1f} |"
        for name, lp in rows
    ]
    return [*lines, ""]


def long_qa_table(results: EvalResults) -> list[str]:
    """Per long-QA set, the floor and each student: correctness and exact match against the gold answer,
    paired against the teacher, the correctness verdicts shared with it, and identical answers."""
    results = EvalResults.of(results)
    models = [(f"S{i + 1}", s) for i, s in enumerate(results.students)]
    if results.floor:
        models.insert(0, ("floor", results.floor))
    rows = [(name, set_name, qa) for name, m in models for set_name, qa in (m.long_qa or {}).items()]
    if not rows:
        return []
    lines = [
        "## Long-prompt QA (passages + a question, greedy short answers)",
        "",
        f"Correct: {rows[0][2].match}, after SQuAD normalisation (lowercase, punctuation and a/an/the "
        "removed, whitespace collapsed); exact: the normalised answer equals a gold answer; F1: SQuAD's word "
        "overlap with the best gold (its p: the sign test). Each cell: "
        "teacher → model (difference ± paired s.e.; McNemar p). Verdicts: both right / both wrong / only the "
        "teacher / only the model right, and the share of items with the same verdict ± s.e. Identical: the "
        "same answer tokens. The floor is the teacher against itself at another dtype.",
        "",
        "| set | model | items | prompt tokens | correct | exact | F1 | verdicts (same ± s.e.) | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(dict.fromkeys(set_name for _, set_name, _ in rows))  # sets as run; floor, S1, ... within
    for name, set_name, qa in sorted(rows, key=lambda row: order.index(row[1])):
        correct, exact = qa.paired["correct"], qa.paired["exact_match"]
        f1 = paired_cell(qa.paired["f1"]) if "f1" in qa.paired else "–"  # runs before F1 was kept
        lines.append(
            f"| {set_name} | {name} | {qa.items} | {qa.prompt_tokens_mean:.0f} | {paired_cell(correct)} | "
            f"{paired_cell(exact)} | {f1} | {qa.both_right} / {qa.both_wrong} / {correct.teacher_only_correct} / "
            f"{correct.student_only_correct} ({correct.agreement:.3f} ± {qa.agreement_stderr:.3f}) | "
            f"{qa.identical_fraction:.3f} ± {qa.identical_stderr:.3f} |"
        )
    return [*lines, ""]


def instruction_table(results: EvalResults) -> list[str]:
    """The instruction set, the floor and each student: strict and loose prompt- and instruction-level
    accuracy, each paired against the teacher."""
    results = EvalResults.of(results)
    models = [(f"S{i + 1}", s.instruction_following) for i, s in enumerate(results.students)]
    if results.floor:
        models.insert(0, ("floor", results.floor.instruction_following))
    rows = [(name, run) for name, run in models if run]
    if not rows:
        return []
    first = rows[0][1]
    left_out = (
        f"; {first.left_out} prompts left out (their checkers need NLTK data no pip package carries)"
        if first.left_out
        else ""
    )
    lines = [
        "## Instruction following (greedy replies checked by the benchmark's checkers)",
        "",
        f"Set `{first.name}`: {first.items} prompts, {first.instructions} instructions{left_out}; "
        f"replies of up to {first.new_tokens} tokens. Prompt level: the reply follows every instruction of its "
        "prompt; instruction level: each instruction on its own. Strict checks the reply as it is; loose also "
        "accepts it without its first or last line or its asterisks. Each cell: teacher → model (difference ± "
        "paired s.e.; McNemar p). The floor is the teacher against itself at another dtype.",
        "",
        "| model | prompts | prompt strict | prompt loose | instruction strict | instruction loose |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in rows:
        cells = " | ".join(paired_cell(run.paired[measure]) for measure in MEASURES)
        lines.append(f"| {name} | {run.items} | {cells} |")
    return [*lines, ""]


def paired_cell(paired) -> str:
    return (
        f"{paired.teacher:.3f} → {paired.student:.3f} ({paired.diff:+.3f} ± {paired.diff_stderr:.3f}; "
        f"p={paired.mcnemar_p:.2g})"
    )


def paired_greedy_table(
    before: StudentResult, after: StudentResult, names: tuple[str, str] = ("before", "after")
) -> list[str]:
    """Two students' greedy answers to the same prompts, paired prompt by prompt (`first_divergences`: chat,
    then long prompts; either left out where a run did not keep it): each one's mean first divergence from
    the teacher, the paired difference, the prompts on which each keeps to the teacher longer, the sign test."""
    lines = [
        f"| greedy answers | prompts | {names[0]} | {names[1]} | difference (± paired s.e.) | "
        f"longer: {names[0]} / {names[1]} | sign p |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("generation", "long_prompt"):
        runs = getattr(before, name), getattr(after, name)
        if not all(run and run.first_divergences for run in runs):
            continue
        if runs[0].new_tokens != runs[1].new_tokens:
            raise ValueError(f"{name}: answers of {runs[0].new_tokens} and {runs[1].new_tokens} tokens")
        paired = paired_divergences(runs[0].first_divergences, runs[1].first_divergences)
        lines.append(
            f"| {'chat' if name == 'generation' else 'long prompts'} | {paired['n']} | {paired['before']:.2f} | "
            f"{paired['after']:.2f} | {paired['diff']:+.2f} (± {paired['diff_stderr']:.2f}) | "
            f"{paired['before_longer']} / {paired['after_longer']} | {paired['sign_p']:.2g} |"
        )
    return lines if len(lines) > 2 else []


def long_qa_hits(qa: LongQA) -> dict[str, list[int]]:
    """One student's long-QA set, per item: 1 where its answer is right, where its verdict is the teacher's
    (right or wrong alike) and where it is the teacher's very answer (the same tokens); the last two where the
    run recorded them. A student that answers like its teacher scores the last two higher even where the set
    is too small to resolve correctness."""
    student = qa.correct["student"]
    hits = {"correct": student}
    if "teacher" in qa.correct:
        hits["teacher's verdict"] = same_per_item(student, qa.correct["teacher"])
    if qa.identical is not None:
        hits["teacher's answer"] = qa.identical
    return hits


def paired_long_qa_table(
    before: StudentResult, after: StudentResult, names: tuple[str, str] = ("before", "after")
) -> list[str]:
    """Two students' long-prompt QA answers to the same items, paired item by item (each set both runs scored;
    none where a run did not): for each of `long_qa_hits`' measures both runs hold, each one's rate, the paired
    difference and McNemar's test on the items only one of them hits. It tells whether a change to a student
    moved its answers beyond the set's noise, which each one's own pairing with the teacher cannot."""
    lines = [
        f"| long-QA set | items | measure | {names[0]} | {names[1]} | difference (± paired s.e.) | "
        f"only: {names[0]} / {names[1]} | McNemar p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in (before.long_qa or {}).items():
        if name not in (after.long_qa or {}):
            continue
        check_same_items(run, after.long_qa[name])
        hits = long_qa_hits(run), long_qa_hits(after.long_qa[name])
        for measure in [measure for measure in hits[0] if measure in hits[1]]:
            paired = paired_hits(hits[0][measure], hits[1][measure])
            lines.append(
                f"| {name} | {paired['n']} | {measure} | {paired['teacher']:.3f} | {paired['student']:.3f} | "
                f"{paired['diff']:+.3f} (± {paired['diff_stderr']:.3f}) | "
                f"{paired['teacher_only_correct']} / {paired['student_only_correct']} | {paired['mcnemar_p']:.2g} |"
            )
    return lines if len(lines) > 2 else []


def quote(text: str) -> str:
    return "`" + " ".join(text.split()).replace("`", "'") + "`"


# --------------------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------------------


def plot(results: EvalResults | dict, path: Path) -> None:
    results = EvalResults.of(results)
    students = results.students
    with figure(path, (14, 5), ncols=2) as (_, (left, right)):
        draw_report(results, students, left, right)


def draw_report(results: EvalResults, students: list[StudentResult], left, right) -> None:
    tasks = list(students[0].tasks) if students else []
    width = 0.8 / (1 + len(students))
    for j, (label, values, errors) in enumerate(accuracy_series(students, tasks)):
        left.bar(
            [i + j * width for i in range(len(tasks))], values, width, yerr=errors, label=label, capsize=2
        )
    left.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks, rotation=20)
    left.set_ylabel("accuracy (acc)")
    left.set_title(f"Accuracy, teacher vs students (teacher: {portable_path(results.teacher)})", fontsize=9)
    left.legend(fontsize=7)
    groups = [*tasks, "chat top-1", "gen identical"]
    width = 0.8 / max(1, len(students))
    for j, student in enumerate(students):
        right.bar(
            [i + j * width for i in range(len(groups))],
            agreement_values(student, tasks),
            width,
            label=f"S{j + 1}: {student_label(student)}",
        )
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=20)
    right.set_ylim(0, 1.3)  # headroom: the legend sits above the bars instead of on them
    right.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    right.set_ylabel("agreement with the teacher")
    right.set_title("Agreement per task (same answer), chat top-1, identical greedy answers", fontsize=9)
    right.legend(fontsize=7, loc="upper center", ncol=2)


def accuracy_series(students: list[StudentResult], tasks: list[str]):
    if not students:
        return []
    students = [StudentResult.of(student) for student in students]
    teacher = [students[0].tasks[t].metrics[TEACHER] for t in tasks]
    series = [("teacher", [m["acc"] for m in teacher], [m.get("acc_stderr") or 0 for m in teacher])]
    for j, student in enumerate(students):
        metrics = [student.tasks[t].metrics[STUDENT] for t in tasks]
        series.append((f"S{j + 1}", [m["acc"] for m in metrics], [m.get("acc_stderr") or 0 for m in metrics]))
    return series


def agreement_values(student: StudentResult, tasks: list[str]) -> list[float]:
    student = StudentResult.of(student)
    forced, generated = student.teacher_forced, student.generation
    values = [student.tasks[t].paired["acc"].agreement for t in tasks]
    values.append(forced.top1_agreement if forced and forced.top1_agreement is not None else 0.0)
    values.append(
        generated.identical_fraction if generated and generated.identical_fraction is not None else 0.0
    )
    return values
