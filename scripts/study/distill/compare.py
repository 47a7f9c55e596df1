"""Two students' lm-eval answers compared item by item, from their full-suite results (same items):

    python scripts/study/distill/compare.py BEFORE/results.json AFTER/results.json [ALIAS_BEFORE ALIAS_AFTER]

(either may be a `.json.xz`)


Per task: after's accuracy minus before's, its paired standard error and McNemar's p; then the mean over the
tasks. It answers whether a student's accuracy drop grew beyond the tasks' noise, which each student's own
pairing with the teacher cannot. Where both runs kept each prompt's first greedy divergence
(`first_divergences`, results.json since 2026-11-28), the chat and long-prompt answers are paired the same
way, prompt by prompt: the sign test counts the prompts on which each student keeps to the teacher longer.
Where both ran the same long-prompt QA sets (`--long-qa`), their answers are paired item by item, with McNemar's p.
"""

from __future__ import annotations

import sys
from pathlib import Path

from card import read_json  # this script's neighbour: run as a script, its folder is on sys.path

from swiftkv.evaluate.report import paired_greedy_table, paired_long_qa_table
from swiftkv.evaluate.stats import paired_runs
from swiftkv.results import EvalResults


def student(path: str, alias: str | None):
    results = EvalResults.from_json(read_json(path))  # a results.json, or one xz-compressed
    return next(s for s in results.students if alias is None or Path(s.pair.student).name == alias)


def table(before, after) -> list[str]:
    lines = [
        "| task | before | after | after - before (± paired s.e.) | McNemar p |",
        "|---|---|---|---|---|",
    ]
    diffs = []
    for task, entry in before.tasks.items():
        paired = paired_runs(entry, after.tasks[task])
        diffs.append(paired["diff"])
        lines.append(
            f"| {task} | {paired['teacher']:.3f} | {paired['student']:.3f} | "
            f"{paired['diff']:+.3f} (± {paired['diff_stderr']:.3f}) | {paired['mcnemar_p']:.2g} |"
        )
    lines.append(f"| mean | | | {sum(diffs) / len(diffs) * 100:+.2f} points | |")
    return lines


if __name__ == "__main__":
    aliases = sys.argv[3:5] or [None, None]
    try:
        before, after = student(sys.argv[1], aliases[0]), student(sys.argv[2], aliases[1])
        tables = [
            table(before, after) if before.tasks else [],
            paired_greedy_table(before, after),
            paired_long_qa_table(before, after),
        ]
        print("\n\n".join("\n".join(lines) for lines in tables if lines))
    except ValueError as error:
        sys.exit(f"compare.py: {error}")
