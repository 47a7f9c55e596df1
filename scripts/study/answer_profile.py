"""Where a SwiftKV student's long-prompt answers part from its teacher's, and why: one profile per set.

For each item of the named long-prompt sets (the eval's own, built the same way), with the teacher's and
the student's greedy answers (read from the eval's result cache, or generated):

- first divergence: the teacher's answer is fed to both paths (teacher forcing); the first answer position
  where the student's top token differs from the teacher's;
- facts or form: each answer's form (a claim, an abstention, the question echoed, a loop, nothing after
  "The answer is:"), and the gold answer's mean log-probability after a neutral frame ("The answer is ")
  on both paths, paired: a student that still ranks the gold high but writes another form lost the form,
  one whose gold log-probability fell lost the fact;
- hidden states: the relative distance ||student - teacher|| / ||teacher|| of the residual stream entering
  each later layer and after the final norm, at the last prompt position (where the first answer token is
  decided) and averaged over the prompt.

    python scripts/study/answer_profile.py smollm2-135m-instruct-swiftkv50 --teacher smollm2-135m-instruct \\
        --sets squad-500,squad-1500,passages-1500 --cache eval-cache.sqlite --out profile-n15.json

Prints one table per set and writes every per-item number to --out.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

import torch

from swiftkv.data.passage_qa import contains_answer, normalize_answer
from swiftkv.data.tokens import prompt_ids
from swiftkv.evaluate.chat import greedy_answers
from swiftkv.evaluate.long_formats import format_sets
from swiftkv.evaluate.long_qa import qa_sets
from swiftkv.evaluate.pair import STUDENT, TEACHER, load_pair
from swiftkv.evaluate.stats import paired_mean
from swiftkv.evaluate.store import ResultStore
from swiftkv.model.config import is_swiftkv

NEW_TOKENS = 24  # the eval's long-prompt answer budget (`long_prompt_format_tokens` / `long_qa_tokens`)
FRAME = "The answer is "  # what precedes the gold answer when its log-probability is read
ABSTAIN = re.compile(
    r"not (explicitly )?(mentioned|stated|provided|specified|given)|no information|fictional|cannot"
)
DIVERGENCE_BINS = ((0, 0), (1, 3), (4, 10), (11, NEW_TOKENS - 1))


def answer_form(answer: str, question: str) -> str:
    """What kind of answer this is, read from its text alone."""
    text = normalize_answer(answer)
    words = text.split()
    trigrams = Counter(zip(words, words[1:], words[2:], strict=False))
    if not text or re.fullmatch(r"(the )?answer (to (this|the) question )?is:?\s*", answer.lower().strip()):
        return "empty"
    if trigrams and max(trigrams.values()) >= 3:
        return "loop"
    if normalize_answer(question) in text:
        return "echo"
    if ABSTAIN.search(answer.lower()):
        return "abstain"
    return "claim"


def profile_item(pair, prompt: list[int], answer: list[int], gold: str) -> dict:
    """Teacher-forced divergence along the teacher's answer, per-layer distances, gold log-probabilities."""
    ids = torch.tensor([prompt + answer])
    later = [str(i) for i in pair.student.config.later_layers] + ["final"]
    states = {role: residual_streams(pair, role, ids) for role in (TEACHER, STUDENT)}
    rows = slice(len(prompt) - 1, len(prompt) - 1 + len(answer))
    with torch.inference_mode():  # the vocabulary only on the answer's rows
        top = pair.model_of(STUDENT).lm_head(states[STUDENT]["final"][rows]).argmax(-1).tolist()
    divergence = next((j for j, (t, s) in enumerate(zip(answer, top, strict=True)) if t != s), None)
    last = len(prompt) - 1
    spans = {"last_prompt_token": slice(last, last + 1), "prompt_mean": slice(0, len(prompt))}
    distance = {
        where: {
            name: relative_distance(states[STUDENT][name][span], states[TEACHER][name][span])
            for name in later
        }
        for where, span in spans.items()
    }
    return {"divergence": divergence, "distance": distance, "gold_logprob": gold_logprobs(pair, prompt, gold)}


def residual_streams(pair, role: str, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The residual stream entering each decoder layer (by index) and after the final norm ("final"), over
    every position of one sequence, on `role`'s path (the decoder alone: no vocabulary projection)."""
    model = pair.model_of(role)
    streams: dict[str, torch.Tensor] = {}

    def entering(index):
        def hook(module, args, kwargs):
            streams[str(index)] = (args[0] if args else kwargs["hidden_states"])[0].detach()

        return hook

    layers = model.model.layers
    hooks = [layer.register_forward_pre_hook(entering(i), with_kwargs=True) for i, layer in enumerate(layers)]
    hooks.append(
        model.model.norm.register_forward_hook(lambda m, a, out: streams.update(final=out[0].detach()))
    )
    try:
        with torch.inference_mode():
            model.model(ids, **path_of(model, role))
    finally:
        for hook in hooks:
            hook.remove()
    return streams


def path_of(model, role: str) -> dict:
    """The forward's path argument: a SwiftKV model runs the role's path, a plain model its only one."""
    return {"swiftkv": role == STUDENT} if is_swiftkv(model) else {}


def relative_distance(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """Mean over rows of ||student - teacher|| / ||teacher||."""
    return float(((student - teacher).norm(dim=-1) / teacher.norm(dim=-1)).mean())


def gold_logprobs(pair, prompt: list[int], gold: str) -> dict[str, float]:
    """Each path's mean log-probability of the gold answer's tokens after FRAME."""
    tokenizer = pair.tokenizer
    frame = tokenizer(FRAME, add_special_tokens=False)["input_ids"]
    gold_ids = tokenizer(gold, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + frame + gold_ids])
    out = {}
    with torch.inference_mode():
        for role in (TEACHER, STUDENT):
            model = pair.model_of(role)
            # the vocabulary only on the rows that predict the gold tokens (the frame's last to the last but one)
            kept = model(ids, logits_to_keep=len(gold_ids) + 1, **path_of(model, role)).logits
            logits = kept[0, :-1]
            logprobs = logits.float().log_softmax(-1)
            out[role] = float(logprobs.gather(1, torch.tensor(gold_ids)[:, None]).mean())
    return out


def profile_set(pair, store, items) -> dict:
    prompts = [prompt_ids(pair.tokenizer, item.messages) for item in items]
    answers = greedy_answers(pair, store, prompts, NEW_TOKENS, progress=False)
    records = []
    for k, item in enumerate(items):
        texts = {
            role: pair.tokenizer.decode(answers[role][k], skip_special_tokens=True).strip()
            for role in answers
        }
        record = profile_item(pair, prompts[k], answers[TEACHER][k], item.answers[0])
        record |= {
            "item_id": item.item_id,
            "answers": texts,
            "correct": {role: any(contains_answer(texts[role], g) for g in item.answers) for role in texts},
            "form": {role: answer_form(texts[role], item.question) for role in texts},
        }
        records.append(record)
    return {"items": records, "summary": summarize(records)}


def summarize(records: list[dict]) -> dict:
    n = len(records)
    divergences = [r["divergence"] for r in records]
    bins = {
        f"{lo}-{hi}": sum(d is not None and lo <= d <= hi for d in divergences) for lo, hi in DIVERGENCE_BINS
    }
    gold_diff = [r["gold_logprob"][STUDENT] - r["gold_logprob"][TEACHER] for r in records]
    layers = list(records[0]["distance"]["last_prompt_token"])
    return {
        "items": n,
        "correct": {role: sum(r["correct"][role] for r in records) / n for role in (TEACHER, STUDENT)},
        "first_divergence": bins | {"none": divergences.count(None)},
        "form": {role: dict(Counter(r["form"][role] for r in records)) for role in (TEACHER, STUDENT)},
        "gold_logprob": {
            role: sum(r["gold_logprob"][role] for r in records) / n for role in (TEACHER, STUDENT)
        },
        "gold_logprob_diff": paired_mean(gold_diff),
        "distance": {
            where: {name: sum(r["distance"][where][name] for r in records) / n for name in layers}
            for where in ("last_prompt_token", "prompt_mean")
        },
    }


def print_summary(name: str, summary: dict) -> None:
    print(f"\n== {name}: {summary['items']} items")
    print("correct", {k: round(v, 3) for k, v in summary["correct"].items()})
    print("first divergence along the teacher's answer (position: items)", summary["first_divergence"])
    print("answer form", summary["form"])
    diff, stderr = summary["gold_logprob_diff"]
    logprobs = {k: round(v, 3) for k, v in summary["gold_logprob"].items()}
    print(f"gold mean log-prob after '{FRAME}': {logprobs}, student - teacher {diff:+.3f} ± {stderr:.3f}")
    for where, by_layer in summary["distance"].items():
        print(f"relative distance, {where}:", " ".join(f"{k}:{v:.3f}" for k, v in by_layer.items()))


def named_sets(spec: str) -> dict:
    """The eval's sets by name: `passages-200`/`passages-1500` (the default long-QA sets, all items) and
    `FORMAT-LENGTH` (built as --long-prompt-formats builds them, 64 items)."""
    shipped = qa_sets("default")
    sets = {}
    for name in spec.split(","):
        if name in shipped:
            sets[name] = shipped[name]
        else:
            source, length = name.rsplit("-", 1)
            sets[name] = format_sets(source, length, 64)[name]
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("student")
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--sets", default="squad-500,squad-1500,passages-1500")
    parser.add_argument(
        "--cache", type=Path, help="the eval's result cache (greedy answers are read from it)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sets = named_sets(args.sets)
    pair = load_pair(args.student, args.teacher, dtype=torch.float32)
    store = ResultStore(args.cache)
    report = {"student": args.student, "teacher": args.teacher, "sets": {}}
    for name, items in sets.items():
        report["sets"][name] = profile_set(pair, store, items)
        print_summary(name, report["sets"][name]["summary"])
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
