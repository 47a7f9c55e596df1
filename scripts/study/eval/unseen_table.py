"""What each shipped student keeps on work no distillation data had the shape of, in one table: instruction
following, long prompts in three held-back formats (SQuAD, DROP, CoQA) at two lengths, the default long-QA sets
and the lm-eval suite's mean accuracy; columns the teacher, the floor (the teacher at another dtype) and each
student, each cell its score, its difference to the teacher and that difference's paired standard error.

    python scripts/study/eval/unseen_table.py LONG.json INSTRUCTIONS.json N=SUITE.json[.xz] ... > table.md

LONG.json: `swiftkv eval ... --floor --long-prompt-formats all --long-qa default` results.json; INSTRUCTIONS.json:
`swiftkv eval ... --floor --instruction-following simple` results.json (both with every student); SUITE.json: a
student's full-suite results.json (lm-eval tasks), by its N.
"""

from __future__ import annotations

import json
import lzma
import math
import sys

UNSEEN_LONG_SETS = {
    "squad-500": "SQuAD, ~500 tokens",
    "squad-1500": "SQuAD, ~1,500 tokens",
    "drop-500": "DROP, ~500 tokens",
    "drop-1500": "DROP, ~1,500 tokens",
    "coqa-500": "CoQA, ~500 tokens",
    "coqa-1500": "CoQA, ~1,500 tokens",
    "passages-200": "long-QA default, ~200 tokens",
    "passages-1500": "long-QA default, ~1,500 tokens",
}
INSTRUCTION_MEASURES = {"prompt_strict": "strict", "prompt_loose": "loose"}


def paired_cell(paired: dict) -> str:
    """A model's score, its difference to the teacher and the difference's paired standard error."""
    return f"{paired['student']:.3f} ({paired['diff']:+.3f} ± {paired['diff_stderr']:.3f})"


def suite_drop(suite: dict) -> dict:
    """The lm-eval suite's mean accuracy, teacher and student, paired: the tasks' own paired differences
    averaged, their standard errors combined as independent (the tasks share no item)."""
    tasks = [task["paired"]["acc"] for task in suite["students"][0]["tasks"].values()]

    def mean(key: str) -> float:
        return sum(t[key] for t in tasks) / len(tasks)

    stderr = math.sqrt(sum(t["diff_stderr"] ** 2 for t in tasks)) / len(tasks)
    return {
        "teacher": mean("teacher"),
        "student": mean("student"),
        "diff": mean("diff"),
        "diff_stderr": stderr,
        "n": sum(t["n"] for t in tasks),
    }


def unseen_table(
    long_results: dict, instructions: dict, suites: dict[int, dict], ns: list[int] | None = None
) -> list[str]:
    """The table's lines: a row per measure; columns the teacher, the floor and each student by N (`suites`:
    N -> the student's suite results.json; `ns`: the students to show, all the long-prompt record's if None,
    as a model card shows its own)."""
    students = {s["pair"]["num_key_value_layers"]: s for s in long_results["students"]}
    followed = {s["pair"]["num_key_value_layers"]: s for s in instructions["students"]}
    ns = sorted(students) if ns is None else ns
    for name, record, found in (
        ("long-prompt", long_results, students),
        ("instructions", instructions, followed),
        ("suite", None, suites),
    ):
        if not set(ns) <= set(found) or (record is not None and not record.get("floor")):
            raise ValueError(
                f"the {name} records hold the students N = {sorted(found)}"
                + ("" if record is None or record.get("floor") else " and no floor")
                + f": expected N = {ns}"
                + ("" if record is None else ", and the floor")
            )
    floor_dtype = long_results["floor"]["pair"]["cache_keys"]["student"].rsplit("-", 1)[
        1
    ]  # "<model>-<dtype>"
    lines = [
        f"| measure | items | teacher | floor ({floor_dtype}) | " + " | ".join(f"N = {n}" for n in ns) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(ns),
    ]
    for measure, label in INSTRUCTION_MEASURES.items():
        first = followed[ns[0]]["instruction_following"]
        cells = [paired_cell(followed[n]["instruction_following"]["paired"][measure]) for n in ns]
        floor = paired_cell(instructions["floor"]["instruction_following"]["paired"][measure])
        teacher = first["paired"][measure]["teacher"]
        lines.append(
            f"| instructions followed ({first['name']}), {label} | {first['items']} | {teacher:.3f} | {floor} | "
            + " | ".join(cells)
            + " |"
        )
    for name, label in UNSEEN_LONG_SETS.items():
        for score in ("correct", "f1"):
            first = students[ns[0]]["long_qa"][name]
            cells = [paired_cell(students[n]["long_qa"][name]["paired"][score]) for n in ns]
            floor = paired_cell(long_results["floor"]["long_qa"][name]["paired"][score])
            teacher = first["paired"][score]["teacher"]
            lines.append(
                f"| {label}: {'correct' if score == 'correct' else 'F1'} | {first['items']} | {teacher:.3f} | {floor} | "
                + " | ".join(cells)
                + " |"
            )
    drops = {n: suite_drop(suites[n]) for n in ns}
    first = drops[ns[0]]
    lines.append(
        f"| lm-eval mean accuracy (6 tasks) | {first['n']:,} | {first['teacher']:.3f} | – | "
        + " | ".join(paired_cell(drops[n]) for n in ns)
        + " |"
    )
    return lines


def read_json(path: str) -> dict:
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as file:
        return json.load(file)


def main(argv: list[str]) -> str:
    if len(argv) < 3 or not all("=" in a for a in argv[2:]):
        raise SystemExit(__doc__)
    suites = {int(n): read_json(path) for n, path in (a.split("=", 1) for a in argv[2:])}
    return "\n".join(unseen_table(read_json(argv[0]), read_json(argv[1]), suites)) + "\n"


if __name__ == "__main__":
    sys.stdout.write(main(sys.argv[1:]))
