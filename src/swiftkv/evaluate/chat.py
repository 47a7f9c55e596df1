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

from .pair import STUDENT, TEACHER, ModelPair, is_swiftkv
from .store import ResultStore, request_key

# --------------------------------------------------------------------------------------------------
# Teacher-forced agreement
# --------------------------------------------------------------------------------------------------


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def assistant_token_mask(tokenizer, messages: list[dict], max_tokens: int) -> tuple[list[int], list[bool]] | None:
    """Token ids of the rendered conversation and which tokens belong to assistant replies. Replies are
    located by rendering the conversation prefix before and after each reply (chat templates render
    prefixes as prefixes); None if the template does not."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return None
    messages = messages[first_user:]  # a reply with no question before it is not a chat turn to learn
    full = render(tokenizer, messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(tokenizer, messages[:index], add_generation_prompt=True))
        end_text = render(tokenizer, messages[:index + 1])
        if not full.startswith(end_text):
            return None
        spans.append((start, len(end_text)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_tokens]
    mask = [any(s <= offset[0] < e for s, e in spans) for offset in encoded["offset_mapping"][:max_tokens]]
    return ids, mask


@torch.inference_mode()
def conversation_stats(pair: ModelPair, ids: list[int], mask: list[bool]) -> dict:
    """Sums over the assistant tokens of one conversation (position t predicts token t + 1)."""
    positions = [t for t in range(len(ids) - 1) if mask[t + 1]]
    if not positions:
        return {"tokens": 0, "kl": 0.0, "top1": 0, "nll_teacher": 0.0, "nll_student": 0.0}
    input_ids = torch.tensor([ids])
    hidden = pair.final_hidden(input_ids, None, (TEACHER, STUDENT))
    targets = torch.tensor([ids[t + 1] for t in positions])
    logp = {role: torch.log_softmax(pair.lm_head(role)(hidden[role][0, positions]).float(), dim=-1)
            for role in (TEACHER, STUDENT)}
    kl = (logp[TEACHER].exp() * (logp[TEACHER] - logp[STUDENT])).sum(-1)
    nll = {role: -logp[role].gather(-1, targets[:, None]).sum().item() for role in logp}
    return {"tokens": len(positions), "kl": kl.sum().item(),
            "top1": int((logp[TEACHER].argmax(-1) == logp[STUDENT].argmax(-1)).sum()),
            "nll_teacher": nll[TEACHER], "nll_student": nll[STUDENT]}


def teacher_forced_agreement(pair: ModelPair, store: ResultStore, conversations: list[list[dict]],
                             max_tokens: int = 512, progress: bool = True) -> dict:
    """Mean per-token KL(teacher || student), top-1 agreement and both NLLs on assistant tokens."""
    pair_key = f"{pair.cache_keys[STUDENT]}|{pair.cache_keys[TEACHER]}"
    keys = [request_key("teacher-forced", str(max_tokens), repr(messages)) for messages in conversations]
    done = store.get_many(pair_key, keys)
    for key, messages in tqdm(list(zip(keys, conversations, strict=True)), desc="chat (teacher-forced)",
                              unit="conv", disable=not progress):
        if key in done:
            continue
        encoded = assistant_token_mask(pair.tokenizer, messages, max_tokens)
        done[key] = conversation_stats(pair, *encoded) if encoded else {"tokens": 0, "skipped": True}
        store.put_many(pair_key, {key: done[key]})
    return summarize_teacher_forced([done[key] for key in keys])


def summarize_teacher_forced(stats: list[dict]) -> dict:
    tokens = sum(s["tokens"] for s in stats)
    used = sum(1 for s in stats if s["tokens"])
    if tokens == 0:
        return {"conversations": 0, "tokens": 0}
    return {"conversations": used, "tokens": tokens,
            "kl_mean": sum(s.get("kl", 0.0) for s in stats) / tokens,
            "top1_agreement": sum(s.get("top1", 0) for s in stats) / tokens,
            "nll_teacher": sum(s.get("nll_teacher", 0.0) for s in stats) / tokens,
            "nll_student": sum(s.get("nll_student", 0.0) for s in stats) / tokens}


# --------------------------------------------------------------------------------------------------
# Generation agreement
# --------------------------------------------------------------------------------------------------


@torch.inference_mode()
def greedy_tokens(pair: ModelPair, role: str, prompt_ids: list[int], new_tokens: int) -> list[int]:
    model = pair.model_of(role)
    if is_swiftkv(model):  # shared mode: the same model plays the teacher with swiftkv off
        model.set_swiftkv(role == STUDENT)
    try:
        input_ids = torch.tensor([prompt_ids])
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pair.tokenizer.eos_token_id)
    finally:
        if is_swiftkv(model):
            model.set_swiftkv(model is pair.student)
    return out[0, len(prompt_ids):].tolist()


def first_divergence(a: list[int], b: list[int], window: int, eos: int | None) -> int:
    """First position < window where the answers differ (a finished answer continues as EOS);
    `window` if they agree throughout."""
    pad = [eos] * window
    a, b = (a + pad)[:window], (b + pad)[:window]
    return next((i for i in range(window) if a[i] != b[i]), window)


def generation_agreement(pair: ModelPair, store: ResultStore, prompts: list[list[dict]], new_tokens: int = 32,
                         examples: int = 3, progress: bool = True) -> dict:
    """Fraction of prompts with identical greedy answers (first `new_tokens` tokens), mean first
    divergence position, and a few side-by-side answers."""
    tokenizer, eos = pair.tokenizer, pair.tokenizer.eos_token_id
    answers = {TEACHER: [], STUDENT: []}
    for messages in tqdm(prompts, desc="chat (generation)", unit="prompt", disable=not progress):
        ids = tokenizer(render(tokenizer, messages, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        key = request_key("greedy", str(new_tokens), repr(ids))
        for role in (TEACHER, STUDENT):
            cached = store.get_many(pair.cache_keys[role], [key])
            if key not in cached:
                cached[key] = greedy_tokens(pair, role, ids, new_tokens)
                store.put_many(pair.cache_keys[role], cached)
            answers[role].append(cached[key])
    divergence = [first_divergence(t, s, new_tokens, eos) for t, s in zip(answers[TEACHER], answers[STUDENT],
                                                                          strict=True)]
    return {
        "prompts": len(prompts), "new_tokens": new_tokens,
        "identical_fraction": sum(d == new_tokens for d in divergence) / max(1, len(prompts)),
        "mean_first_divergence": sum(divergence) / max(1, len(prompts)),
        "examples": side_by_side(tokenizer, prompts, answers, divergence, new_tokens, examples),
    }


def side_by_side(tokenizer, prompts, answers, divergence, new_tokens: int, count: int) -> list[dict]:
    """The first `count` prompts where the answers differ (then identical ones, if too few differ)."""
    order = [i for i, d in enumerate(divergence) if d < new_tokens] + \
            [i for i, d in enumerate(divergence) if d == new_tokens]
    return [{"prompt": prompts[i][-1]["content"][:300], "first_divergence": divergence[i],
             "teacher": tokenizer.decode(answers[TEACHER][i], skip_special_tokens=True),
             "student": tokenizer.decode(answers[STUDENT][i], skip_special_tokens=True)}
            for i in order[:count]]
