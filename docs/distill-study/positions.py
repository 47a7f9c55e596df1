"""Where along the teacher's greedy answer do students leave it? A diagnostic for the first-divergence
measure of `swiftkv eval`: until the first difference both greedy answers share their prefix, so the
first divergence is decided by argmax agreement along the teacher's own answer, position by position.

For each held-out generation prompt (the eval's own, `generation_prompts`), the teacher writes its greedy
answer once; each student then reads prompt + answer in one teacher-forced pass and we count, per
answer position, whether its argmax equals the teacher's token, and how sure the teacher was there
(top-1 minus top-2 probability).

usage: positions.py TEACHER STUDENT... [--prompts 128] [--tokens 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import torch

from swiftkv.dtypes import resolve_dtype
from swiftkv.evaluate.chat import generation_prompt_ids, greedy_tokens
from swiftkv.evaluate.pair import STUDENT, TEACHER, load_pair
from swiftkv.evaluate.run import generation_prompts
from swiftkv.evaluate.settings import EvalSettings

BUCKETS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32))
NEAR_TIE = 0.2  # teacher top-1 minus top-2 probability below this: a near tie


@torch.inference_mode()
def position_rows(pair, prompt: list[int], answer: list[int]) -> list[tuple[int, bool, float]]:
    """(answer position, student argmax == teacher's token, teacher margin) for each answer token."""
    ids = torch.tensor([prompt + answer])
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1)
    hidden = pair.final_hidden(ids, rows, (TEACHER, STUDENT))
    head = pair.student.lm_head
    teacher_p = torch.softmax(head(hidden[TEACHER][0]).float(), -1)
    student_top = head(hidden[STUDENT][0]).argmax(-1)
    top2 = teacher_p.topk(2, -1).values
    return [(k, int(student_top[k]) == answer[k], float(top2[k, 0] - top2[k, 1])) for k in range(len(answer))]


def summarize(rows: list[tuple[int, bool, float]]) -> dict:
    def rate(selected):
        return {"agree": sum(a for _, a, _ in selected) / max(1, len(selected)), "positions": len(selected)}

    return {
        "all": rate(rows),
        "by_position": {f"{lo}-{hi - 1}": rate([r for r in rows if lo <= r[0] < hi]) for lo, hi in BUCKETS},
        "teacher_near_tie": rate([r for r in rows if r[2] < NEAR_TIE]),
        "teacher_sure": rate([r for r in rows if r[2] >= NEAR_TIE]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("teacher")
    parser.add_argument("students", nargs="+")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json")
    args = parser.parse_args()
    dtype = resolve_dtype("auto", torch.device("cpu"))
    prompts, answers, results = None, None, {}
    for student in args.students:
        pair = load_pair(student, args.teacher, dtype)
        if answers is None:  # the same teacher (and tokenizer) for every student: prompts and answers once
            prompts = [
                generation_prompt_ids(pair.tokenizer, m)
                for m in generation_prompts(pair.tokenizer, EvalSettings(gen_prompts=args.prompts))
            ]
            answers = [greedy_tokens(pair, TEACHER, p, args.tokens) for p in prompts]
        rows = [r for p, a in zip(prompts, answers, strict=True) if a for r in position_rows(pair, p, a)]
        results[student] = summarize(rows) | {"prompts": len(prompts), "dtype": str(dtype)}
        print(student, json.dumps(results[student]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
