"""Agreement after long prompts (1-2k tokens: passages + a question, a document + a summary request),
where the student's approximated K/V of the whole prompt decide its short answer.

Per prompt, both models answer greedily (`gen_tokens`); we report the first divergence and identical
answers, and, teacher-forced along the teacher's own answer, KL(teacher || student) and top-1
agreement at each answer position. Cached like the chat measures."""

from __future__ import annotations

from ..data.heldout import heldout_conversations
from ..data.long_prompts import LONG_PROMPT_TOKENS, long_prompts, text_counter
from ..data.tokens import prompt_ids
from .chat import conversation_stats, divergences, greedy_answers, progress_bar
from .pair import STUDENT, TEACHER, ModelPair
from .store import ResultStore, request_key


def check_long_context(max_length: int, new_tokens: int) -> None:
    """Long prompts need the context for the longest prompt plus its answer (checked before any scoring)."""
    needed = LONG_PROMPT_TOKENS[1] + 64 + new_tokens  # + the chat template's tokens around the text
    if needed > max_length:
        raise ValueError(
            f"--long-prompts needs a context of {needed} tokens; the model has {max_length} "
            "(pass --long-prompts 0)"
        )


def heldout_long_prompts(tokenizer, count: int) -> list[list[dict]]:
    """`count` long prompts from the held-out chats (never trained on)."""
    return long_prompts(heldout_conversations(), count, text_counter(tokenizer), *LONG_PROMPT_TOKENS)


def long_prompt_agreement(
    pair: ModelPair, store: ResultStore, prompts: list[list[dict]], new_tokens: int, progress: bool = True
) -> dict:
    ids = [prompt_ids(pair.tokenizer, messages) for messages in prompts]
    answers = greedy_answers(
        pair, store, ids, new_tokens, desc="long prompts (generation)", progress=progress
    )
    divergence = divergences(answers, new_tokens, pair.tokenizer.eos_token_id)
    forced = along_teacher_answers(pair, store, list(zip(ids, answers[TEACHER], strict=True)), progress)
    tokens = sum(f["tokens"] for f in forced)
    return {
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "prompt_tokens_mean": sum(map(len, ids)) / max(1, len(ids)),
        "kl_mean": sum(f["kl"] for f in forced) / max(1, tokens),
        "top1_agreement": sum(f["top1"] for f in forced) / max(1, tokens),
        "identical_fraction": sum(d == new_tokens for d in divergence) / max(1, len(prompts)),
        "mean_first_divergence": sum(divergence) / max(1, len(prompts)),
        "first_divergences": divergence,
    }


def along_teacher_answers(
    pair: ModelPair, store: ResultStore, prompts: list[tuple[list[int], list[int]]], progress: bool
) -> list[dict]:
    """KL / top-1 sums at the positions that predict the teacher's answer tokens, per (prompt, answer)."""
    pair_key = f"{pair.cache_keys[STUDENT]}|{pair.cache_keys[TEACHER]}"
    keys = [request_key("long-teacher-forced", repr(prompt), repr(answer)) for prompt, answer in prompts]
    done = store.get_many(pair_key, keys)
    missing = [(key, item) for key, item in zip(keys, prompts, strict=True) if key not in done]

    def stats(item):
        prompt, answer = item[1]
        return conversation_stats(pair, prompt + answer, [False] * len(prompt) + [True] * len(answer))

    bar = progress_bar(
        pair, progress, len(keys), len(keys) - len(missing), "long prompts (teacher-forced)", "prompt"
    )
    for (key, _), result in pair.processes.computed(missing, stats):
        done[key] = result
        store.put_many(pair_key, {key: result})
        bar.update()
    bar.close()
    return [done[key] for key in keys]
