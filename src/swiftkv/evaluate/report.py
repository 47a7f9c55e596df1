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
    summary = summary_table(results) if students else []
    if summary:
        lines += ["", *summary]
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
    """One row per model: what a reader compares first (accuracy per task, their mean, chat agreement);
    a column no model has a value in is left out, and the table with it where none is left."""
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
    teacher = [students[0].tasks[t].metrics[TEACHER]["acc"] for t in tasks]
    rows = [summary_cells("teacher", teacher, FloorResult())]
    if results.floor:
        floor = portable_path(results.floor.pair.student)
        rows.append(summary_cells(f"floor: {floor}", [None] * len(tasks), results.floor))
    for i, student in enumerate(students):
        accuracy = [student.tasks[t].metrics[STUDENT]["acc"] for t in tasks]
        rows.append(summary_cells(f"S{i + 1}", accuracy, student))
    kept = [c for c in range(len(header)) if c == 0 or any(row[c] != "–" for row in rows)]
    if len(kept) == 1:
        return []
    return [
        "## Summary",
        "",
        "Accuracy is lm-eval's `acc`; the mean is unweighted over the tasks. Chat columns: "
        "teacher-forced KL(teacher‖student) and top-1 agreement on held-out ShareGPT; greedy identical: "
        "fraction of prompts whose first generated tokens equal the teacher's; first divergence: mean index of "
        "the first generated token that differs. Long: the same after 1-2k-token prompts (passages + a "
        "question, a document + a summary request), top-1 along the teacher's answer. The floor row is the "
        "teacher against itself at another dtype: the most agreement a student can be asked for.",
        "",
        "| " + " | ".join(header[c] for c in kept) + " |",
        "|---" * len(kept) + "|",
        *("| " + " | ".join(row[c] for c in kept) + " |" for row in rows),
    ]


def summary_cells(
    name: str, accuracy: list[float | None], measured: StudentResult | FloorResult
) -> list[str]:
    """A model's name, its accuracy cells, their mean, then the agreement measures of `measured` (a student or
    the floor)."""
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
    cells = [name, *("–" if value is None else f"{value:.3f}" for value in values)]
    cells.append("–" if not generated else f"{generated.mean_first_divergence:.1f}")
    cells.append("–" if not long else f"{long.top1_agreement:.3f}")
    cells.append("–" if not long else f"{long.mean_first_divergence:.1f}")
    return cells


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
    """Bars of what the run measured: each model's scores (left) and its agreement with the teacher (right),
    a panel left out where the run measured nothing of its kind."""
    results = EvalResults.of(results)
    panels = [
        (
            *score_series(results),
            "score",
            "Scores (error bars: each score's standard error), teacher: " + portable_path(results.teacher),
            0,
        ),
        (*agreement_series(results), "agreement with the teacher", "Agreement with the teacher", 1),
    ]
    panels = [panel for panel in panels if panel[0]]
    with figure(path, (7 * max(1, len(panels)), 5), ncols=max(1, len(panels))) as (_, axes):
        for axis, panel in zip(axes if len(panels) > 1 else [axes], panels, strict=False):
            draw_bars(axis, *panel)


def draw_bars(axis, groups: list[str], series: list, ylabel: str, title: str, first_color: int) -> None:
    """One panel: a cluster of bars per group, a bar per series (label, values, errors; None where the
    series lacks the group), colours from `first_color` on (a model keeps its colour in both panels)."""
    width = 0.8 / max(1, len(series))
    top = 0.0
    for j, (label, values, errors) in enumerate(series):
        shown = [(i, v, errors[i] if errors else 0) for i, v in enumerate(values) if v is not None]
        axis.bar(
            [i + j * width for i, _, _ in shown],
            [v for _, v, _ in shown],
            width,
            yerr=[e for _, _, e in shown] if errors else None,
            label=label,
            capsize=2,
            color=f"C{first_color + j}",
        )
        top = max([top, *(v + e for _, v, e in shown)])
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=20, fontsize=8)
    long_labels = max(len(label) for label, _, _ in series) > 24  # a student's folder and its N
    columns = 1 if long_labels else min(4, len(series))
    rows = -(-len(series) // columns)
    axis.set_ylim(0, max(top, 1e-3) * (1.15 + 0.07 * rows))  # headroom: the legend sits above the bars
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7, loc="upper center", ncol=columns)


def plotted_models(results: EvalResults) -> list[tuple[str, str, StudentResult | FloorResult]]:
    """(short label, full label, result) of each student, then the floor (so the groups come in the students'
    order: their tasks first), labelled as the tables label them."""
    models = [(f"S{i + 1}", f"S{i + 1}: {student_label(s)}", s) for i, s in enumerate(results.students)]
    return models + ([("floor", "floor", results.floor)] if results.floor else [])


def model_scores(model: StudentResult | FloorResult, role: str) -> dict[str, tuple[float, float]]:
    """Group -> (score, its standard error) of one side (`role`) of a model's pairs with the teacher: each
    lm-eval task's acc, each long-QA set's correct, the instruction set's prompt-level strict."""
    side = "teacher" if role == TEACHER else "student"
    scores = {
        task: (result.metrics[role]["acc"], result.metrics[role].get("acc_stderr") or 0)
        for task, result in (getattr(model, "tasks", None) or {}).items()
    }
    for name, qa in (model.long_qa or {}).items():
        scores[f"{name} correct"] = binomial(getattr(qa.paired["correct"], side), qa.items)
    run = model.instruction_following
    if run:
        scores[f"{run.name} strict"] = binomial(getattr(run.paired["prompt_strict"], side), run.items)
    return scores


def binomial(share: float, n: int) -> tuple[float, float]:
    return share, (share * (1 - share) / n) ** 0.5


def score_series(results: EvalResults | dict) -> tuple[list[str], list]:
    """The score groups, and a (label, values, errors) series for the teacher and each model."""
    models = plotted_models(EvalResults.of(results))
    teacher = {}
    for _, _, model in models:
        teacher.update(model_scores(model, TEACHER))  # the same teacher in every pair
    # short labels: the agreement panel names the models in full
    measured = [(short, model_scores(model, STUDENT)) for short, _, model in models]
    return aligned([("teacher", teacher), *measured], with_errors=True)


def model_agreements(model: StudentResult | FloorResult) -> dict[str, float]:
    """Group -> a model's agreement with the teacher: each task's same answer, chat top-1, identical greedy
    answers, long-prompt top-1, each long-QA set's and the instruction set's same verdict."""
    forced, generated, long = model.teacher_forced, model.generation, model.long_prompt
    values = {
        task: result.paired["acc"].agreement for task, result in (getattr(model, "tasks", None) or {}).items()
    }
    if forced and forced.top1_agreement is not None:
        values["chat top-1"] = forced.top1_agreement
    if generated and generated.identical_fraction is not None:
        values["gen identical"] = generated.identical_fraction
    if long and long.top1_agreement is not None:
        values["long top-1"] = long.top1_agreement
    for name, qa in (model.long_qa or {}).items():
        values[f"{name} same"] = qa.paired["correct"].agreement
    run = model.instruction_following
    if run:  # its pairs keep the discordant counts, not the agreement
        strict = run.paired["prompt_strict"]
        values[f"{run.name} same"] = (
            1 - (strict.teacher_only_correct + strict.student_only_correct) / strict.n
        )
    return values


def agreement_series(results: EvalResults | dict) -> tuple[list[str], list]:
    """The agreement groups, and a (label, values, None) series per model."""
    models = plotted_models(EvalResults.of(results))
    return aligned([(label, model_agreements(m)) for _, label, m in models], with_errors=False)


def aligned(by_model: list[tuple[str, dict]], with_errors: bool) -> tuple[list[str], list]:
    """Groups in first-seen order, each model's values (and errors) on them, None where it lacks one; a model
    without any is left out."""
    by_model = [(label, values) for label, values in by_model if values]
    groups = list(dict.fromkeys(group for _, values in by_model for group in values))
    series = []
    for label, values in by_model:
        cells = [values.get(group) for group in groups]
        if with_errors:
            points = [c[0] if c else None for c in cells]
            series.append((label, points, [c[1] if c else 0 for c in cells]))
        else:
            series.append((label, cells, None))
    return groups, series
