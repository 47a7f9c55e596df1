"""Log-likelihood of (context, continuation) requests for the teacher and the student together.

Why not lm-eval's HFLM: it scores one model per run. Here one batch feeds both roles (in shared mode
layers < N run once), the student runs its later layers only on the scored rows (the SwiftKV prefill
skip, exact because its later K/V come from every token's h_N), requests with the same input tokens
(MMLU's four one-token answers) share one forward, and every result is cached per model.

Tokenisation follows HFLM: trailing spaces of the context move to the continuation, the pair is
encoded whole and split where the context's encoding ends, no special tokens are added, an empty
context becomes the BOS/EOS token, and inputs longer than the model's window keep their last tokens.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .pair import ModelPair
from .store import ResultStore, request_key


@dataclass(frozen=True)
class Encoded:
    inputs: tuple[int, ...]  # tokens fed to the model (context + continuation minus the last token)
    targets: tuple[int, ...]  # continuation tokens, predicted by the last len(targets) input rows


def encode_request(tokenizer, context: str, continuation: str, max_length: int) -> Encoded:
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    if context:
        context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
        targets = whole[len(context_ids) :]
    else:
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        whole, targets = [prefix, *whole], whole
    if not targets:
        raise ValueError(
            f"continuation {continuation!r} encodes to no tokens after context {context[-40:]!r}"
        )
    sequence = whole[-(max_length + 1) :]
    return Encoded(tuple(sequence[:-1]), tuple(targets[-(len(sequence) - 1) :]))


def score_rows(logits: torch.Tensor, targets: tuple[int, ...]) -> tuple[float, bool]:
    """Sum of log p(target) over the continuation and whether greedy decoding would produce it."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(targets, device=logits.device)
    total = logprobs.gather(-1, target[:, None]).sum().item()
    return total, bool((logprobs.argmax(-1) == target).all())


def batches(inputs: list[tuple[int, ...]], batch_tokens: int) -> list[list[tuple[int, ...]]]:
    """Longest first, as many per batch as fit in `batch_tokens` padded tokens."""
    ordered = sorted(inputs, key=len, reverse=True)
    out, current = [], []
    for item in ordered:
        if current and (len(current) + 1) * len(current[0]) > batch_tokens:
            out.append(current)
            current = []
        current.append(item)
    return out + [current] if current else out


class LoglikelihoodScorer:
    """Scores requests for both roles, computing only what the cache lacks."""

    def __init__(
        self,
        pair: ModelPair,
        store: ResultStore,
        batch_tokens: int = 4096,
        progress: bool = True,
        roles: tuple[str, ...] | None = None,
    ):
        self.pair, self.store = pair, store
        # Roles computed together whenever a request is missing (default both: one pass serves both).
        self.keys = {role: pair.cache_keys[role] for role in (roles or pair.cache_keys)}
        self.batch_tokens, self.progress = batch_tokens, progress
        self.computed = 0  # requests scored by the models (not served from the cache)

    def loglikelihood(self, requests: list[tuple[str, str]], role: str) -> list[tuple[float, bool]]:
        keys = [request_key("ll", context, continuation) for context, continuation in requests]
        cached = {r: self.store.get_many(self.keys[r], keys) for r in self.keys}
        todo = {
            key: request
            for key, request in zip(keys, requests, strict=True)
            if any(key not in cached[r] for r in cached)
        }
        if todo:
            for r, results in self.compute(todo, cached).items():
                cached[r].update(results)
        return [tuple(cached[role][key]) for key in keys]

    def compute(self, todo: dict[str, tuple[str, str]], cached: dict[str, dict]) -> dict[str, dict]:
        encoded = {
            key: encode_request(self.pair.tokenizer, *request, self.pair.max_length)
            for key, request in todo.items()
        }
        by_input = defaultdict(list)  # identical inputs share one forward
        for key, enc in encoded.items():
            by_input[enc.inputs].append(key)
        results = {r: {} for r in cached}
        self.computed += len(todo)
        processes = self.pair.processes
        bar = tqdm(
            total=len(todo), desc="scoring", unit="req", disable=not (self.progress and processes.is_main)
        )

        def score(batch):  # the batches are formed before they are dealt out: the same at any process count
            keys = [key for inputs in batch for key in by_input[inputs]]
            roles = [r for r in cached if any(key not in cached[r] for key in keys)]
            return self.score_batch(batch, by_input, encoded, roles)

        for batch, batch_results in processes.computed(batches(list(by_input), self.batch_tokens), score):
            for r, items in batch_results.items():
                self.store.put_many(self.keys[r], items)
                results[r].update(items)
            bar.update(sum(len(by_input[inputs]) for inputs in batch))
        bar.close()
        return results

    def score_batch(self, batch, by_input, encoded, roles) -> dict[str, dict]:
        width = len(batch[0])
        input_ids = torch.zeros(len(batch), width, dtype=torch.long)  # right padding: causal rows unaffected
        for row, inputs in enumerate(batch):
            input_ids[row, : len(inputs)] = torch.tensor(inputs)
        # Rows each sequence needs: its last len(longest continuation) positions.
        needed = [
            range(len(inputs) - max(len(encoded[k].targets) for k in by_input[inputs]), len(inputs))
            for inputs in batch
        ]
        keep = sorted({pos for rows in needed for pos in rows})
        column = {pos: i for i, pos in enumerate(keep)}
        hidden = self.pair.final_hidden(input_ids, torch.tensor(keep), roles)
        out = {}
        for role, states in hidden.items():
            out[role] = {}
            head = self.pair.lm_head(role)
            for row, inputs in enumerate(batch):
                logits = head(states[row, [column[pos] for pos in needed[row]]])  # once per input
                for key in by_input[inputs]:
                    targets = encoded[key].targets
                    out[role][key] = score_rows(logits[len(logits) - len(targets) :], targets)
        return out
