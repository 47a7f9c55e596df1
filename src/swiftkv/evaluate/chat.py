"""Agreement of student and teacher on held-out chat.

Teacher-forced: both read the same conversation; on every assistant token we measure
KL(teacher || student) of the next-token distributions and whether their top-1 tokens agree.
Generation: both answer the same prompts greedily; we count prompts whose first `new_tokens`
tokens are identical and where the two answers first diverge.

Results are cached per conversation / prompt, so an interrupted run resumes and a teacher's
generations serve every student compared with it.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ..data.chat import from_first_user
from ..data.tokens import prompt_ids, tokenize_chat
from ..generation import left_padded, length_batches
from ..metrics import kl_per_row, top1_matches
from ..model.config import is_swiftkv
from .pair import STUDENT, TEACHER, ModelPair
from .store import ResultStore, request_key

# --------------------------------------------------------------------------------------------------
# Teacher-forced agreement
# --------------------------------------------------------------------------------------------------


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def assistant_token_mask(
    tokenizer, messages: list[dict], max_tokens: int
) -> tuple[list[int], list[bool]] | None:
    """Token ids of the conversation from its first user turn on (at most `max_tokens`) and which
    tokens are assistant replies: the same target definition distillation trains on."""
    messages = from_first_user(messages)
    if messages is None:
        return None
    document = tokenize_chat(tokenizer, messages)
    return document.ids[:max_tokens], document.is_target[:max_tokens]


@torch.inference_mode()
def conversation_stats(pair: ModelPair, ids: list[int], mask: list[bool]) -> dict:
    """Sums over the assistant tokens of one conversation (position t predicts token t + 1)."""
    positions = [t for t in range(len(ids) - 1) if mask[t + 1]]
    if not positions:
        return {"tokens": 0, "kl": 0.0, "top1": 0, "nll_teacher": 0.0, "nll_student": 0.0}
    rows = torch.tensor(positions)
    hidden = pair.final_hidden(torch.tensor([ids]), rows, (TEACHER, STUDENT))
    logits = {role: pair.lm_head(role)(hidden[role][0]).float() for role in (TEACHER, STUDENT)}
    targets = torch.tensor([ids[t + 1] for t in positions], device=pair.device)
    nll = {
        role: -torch.log_softmax(x, -1).gather(-1, targets[:, None]).sum().item()
        for role, x in logits.items()
    }
    return {
        "tokens": len(positions),
        "kl": kl_per_row(logits[STUDENT], logits[TEACHER]).sum().item(),
        "top1": top1_matches(logits[STUDENT], logits[TEACHER]),
        "nll_teacher": nll[TEACHER],
        "nll_student": nll[STUDENT],
    }


def teacher_forced_agreement(
    pair: ModelPair,
    store: ResultStore,
    conversations: list[list[dict]],
    max_tokens: int = 512,
    progress: bool = True,
) -> dict:
    """Mean per-token KL(teacher || student), top-1 agreement and both NLLs on assistant tokens."""
    pair_key = f"{pair.cache_keys[STUDENT]}|{pair.cache_keys[TEACHER]}"
    keys = [request_key("teacher-forced", str(max_tokens), repr(messages)) for messages in conversations]
    done = store.get_many(pair_key, keys)
    missing = [(key, messages) for key, messages in zip(keys, conversations, strict=True) if key not in done]

    def stats(item):
        encoded = assistant_token_mask(pair.tokenizer, item[1], max_tokens)
        return conversation_stats(pair, *encoded) if encoded else {"tokens": 0, "skipped": True}

    bar = progress_bar(pair, progress, len(keys), len(keys) - len(missing), "chat (teacher-forced)", "conv")
    for (key, _), result in pair.processes.computed(missing, stats):
        done[key] = result
        store.put_many(pair_key, {key: result})
        bar.update()
    bar.close()
    return summarize_teacher_forced([done[key] for key in keys])


def progress_bar(pair: ModelPair, progress: bool, total: int, done: int, desc: str, unit: str) -> tqdm:
    """A bar drawn by the first process only (the others compute their share in silence)."""
    return tqdm(
        total=total, initial=done, desc=desc, unit=unit, disable=not (progress and pair.processes.is_main)
    )


def summarize_teacher_forced(stats: list[dict]) -> dict:
    tokens = sum(s["tokens"] for s in stats)
    used = sum(1 for s in stats if s["tokens"])
    if tokens == 0:
        return {"conversations": 0, "tokens": 0}
    return {
        "conversations": used,
        "tokens": tokens,
        "kl_mean": sum(s.get("kl", 0.0) for s in stats) / tokens,
        "top1_agreement": sum(s.get("top1", 0) for s in stats) / tokens,
        "nll_teacher": sum(s.get("nll_teacher", 0.0) for s in stats) / tokens,
        "nll_student": sum(s.get("nll_student", 0.0) for s in stats) / tokens,
    }


# --------------------------------------------------------------------------------------------------
# Generation agreement
# --------------------------------------------------------------------------------------------------


# Prompts answered together: up to GENERATION_BATCH, of similar lengths (sorted), their padded prompts plus
# the answer budget within GENERATION_TOKENS (the batch's KV cache and its prefill's attention). One prompt
# at a time leaves the device idle between tiny decode steps (the measured gain: docs/history.md).
GENERATION_BATCH = 64
GENERATION_TOKENS = 32_768


def generation_batches(
    prompts: list[list[int]], new_tokens: int, expected: list[int] | None = None
) -> list[list[int]]:
    """Indices of `prompts` in batches of similar lengths: shortest first, each batch within the limits (counted
    at the full answer budget). `expected`: each prompt's likely answer length (the teacher's, when a student
    answers the same prompts); batches then group answers that end alike, since `generate` runs a batch until
    its longest answer stops, and a batch of short answers ends long before the budget."""
    lengths = [len(p) + new_tokens for p in prompts]
    order = None
    if expected is not None:
        order = [(min(e, new_tokens), len(p)) for p, e in zip(prompts, expected, strict=True)]
    return length_batches(lengths, GENERATION_BATCH, GENERATION_TOKENS, order)


@torch.inference_mode()
def greedy_tokens(pair: ModelPair, role: str, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy answer (its stop token kept), the prompts left-padded into one `generate`."""
    model = pair.model_of(role)
    # In shared mode the same model plays the teacher: the path is chosen per call, nothing is flipped.
    path = {"swiftkv": role == STUDENT} if is_swiftkv(model) else {}
    pad = pair.tokenizer.eos_token_id
    width = max(map(len, prompts))
    input_ids, attention_mask = left_padded(prompts, width, pad, pair.device)
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad,
        **path,
    )
    stops = stop_ids(model)
    return [cut_at_stop(row, stops) for row in out[:, width:].tolist()]


def stop_ids(model) -> set[int]:
    """The tokens that end a greedy answer (the generation config's end-of-sequence ids)."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def cut_at_stop(row: list[int], stops: set[int]) -> list[int]:
    """A batch row's answer as one prompt alone gets it: up to its first stop token (kept), without the
    padding `generate` appends once a row has stopped and others go on."""
    return next((row[: i + 1] for i, token in enumerate(row) if token in stops), row)


def first_divergence(a: list[int], b: list[int], window: int, eos: int | None) -> int:
    """First position < window where the answers differ (a finished answer continues as EOS);
    `window` if they agree throughout."""
    pad = [eos] * window
    a, b = (a + pad)[:window], (b + pad)[:window]
    return next((i for i in range(window) if a[i] != b[i]), window)


def greedy_answers(
    pair: ModelPair,
    store: ResultStore,
    prompt_ids: list[list[int]],
    new_tokens: int,
    desc: str = "chat (generation)",
    progress: bool = True,
) -> dict[str, list[list[int]]]:
    """Each role's greedy answer to each prompt, cached per model: a teacher's answers serve every
    student compared with it."""
    keys = [request_key("greedy", str(new_tokens), repr(ids)) for ids in prompt_ids]
    answers = {}
    for role in (TEACHER, STUDENT):
        done = store.get_many(pair.cache_keys[role], keys)
        missing = [(key, ids) for key, ids in zip(keys, prompt_ids, strict=True) if key not in done]
        bar = progress_bar(pair, progress, len(keys), len(keys) - len(missing), f"{desc}, {role}", "prompt")
        expected = None  # the student's answers are batched by the length of the teacher's, which come first
        if TEACHER in answers:
            teacher = dict(zip(keys, answers[TEACHER], strict=True))
            expected = [len(teacher[key]) for key, _ in missing]
        batches = [
            [missing[i] for i in batch]
            for batch in generation_batches([m[1] for m in missing], new_tokens, expected)
        ]
        for batch, batch_answers in pair.processes.computed(
            batches, lambda batch, role=role: greedy_tokens(pair, role, [ids for _, ids in batch], new_tokens)
        ):
            answered = {key: answer for (key, _), answer in zip(batch, batch_answers, strict=True)}
            done.update(answered)
            store.put_many(pair.cache_keys[role], answered)
            bar.update(len(batch))
        bar.close()
        answers[role] = [done[key] for key in keys]
    return answers


def divergences(answers: dict[str, list[list[int]]], new_tokens: int, eos: int | None) -> list[int]:
    return [
        first_divergence(t, s, new_tokens, eos)
        for t, s in zip(answers[TEACHER], answers[STUDENT], strict=True)
    ]


def generation_agreement(
    pair: ModelPair,
    store: ResultStore,
    prompts: list[list[dict]],
    new_tokens: int = 32,
    examples: int = 3,
    progress: bool = True,
) -> dict:
    """Fraction of prompts with identical greedy answers (first `new_tokens` tokens), each prompt's first
    divergence position and their mean, and a few side-by-side answers."""
    tokenizer = pair.tokenizer
    ids = [prompt_ids(tokenizer, messages) for messages in prompts]
    answers = greedy_answers(pair, store, ids, new_tokens, progress=progress)
    divergence = divergences(answers, new_tokens, tokenizer.eos_token_id)
    return {
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "identical_fraction": sum(d == new_tokens for d in divergence) / max(1, len(prompts)),
        "mean_first_divergence": sum(divergence) / max(1, len(prompts)),
        "first_divergences": divergence,
        "examples": side_by_side(tokenizer, prompts, answers, divergence, new_tokens, examples),
    }


def side_by_side(tokenizer, prompts, answers, divergence, new_tokens: int, count: int) -> list[dict]:
    """The first `count` prompts where the answers differ (then identical ones, if too few differ)."""
    order = [i for i, d in enumerate(divergence) if d < new_tokens] + [
        i for i, d in enumerate(divergence) if d == new_tokens
    ]
    return [
        {
            "prompt": prompts[i][-1]["content"][:300],
            "first_divergence": divergence[i],
            "teacher": tokenizer.decode(answers[TEACHER][i], skip_special_tokens=True),
            "student": tokenizer.decode(answers[STUDENT][i], skip_special_tokens=True),
        }
        for i in order[:count]
    ]
