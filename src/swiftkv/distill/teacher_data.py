"""Teacher-written assistant turns (`--targets teacher`): for each training prompt, the teacher's own
greedy reply replaces the human one, so the student learns on exactly the distribution it is judged
against (the teacher's own answers), not on text the teacher would never write. With
`--reply-writer student` the student as converted writes them instead and the teacher still scores
every position: the student then learns what the teacher would say after its own continuations.

Replies are generated once, batched, with vLLM or with transformers' own generation (where vLLM is
not installed, e.g. a GPU box with only torch and transformers), and appended to a JSONL file, one
complete record per line, fsync'd batch by batch. A killed run loses at most the batch in flight: on restart a truncated last line is cut off, records already there are reused (first one
wins for a repeated key), and only the missing prompts are generated.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..data.chat import first_user_prompt
from ..data.tokens import Document

GENERATION_BATCH = 64  # prompts per vLLM call: one fsync'd append per batch
MAX_PROMPT_TOKENS = 1024  # longer first turns are skipped (the reply would not fit a block)


@dataclass
class Reply:
    ids: list[int]  # the teacher's tokens, its end-of-turn token included when it stopped by itself
    finished: bool


Generate = Callable[[list[list[int]]], list[Reply]]  # prompt token ids -> greedy replies


def prompt_key(prompt_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:24]


# --------------------------------------------------------------------------------------------------
# The reply file
# --------------------------------------------------------------------------------------------------


def read_replies(path: Path) -> dict[str, Reply]:
    """Complete records of `path`; a torn last line (a kill mid-write) is cut off the file."""
    if not path.is_file():
        return {}
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(complete))
    replies: dict[str, Reply] = {}
    for number, line in enumerate(complete.decode("utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
            replies.setdefault(record["key"], Reply(record["reply_ids"], record["finished"]))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a teacher-reply record ({error}); delete the file to "
                             "regenerate it") from error
    return replies


def append_replies(path: Path, records: dict[str, Reply]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for key, reply in records.items():
            handle.write(json.dumps({"key": key, "reply_ids": reply.ids, "finished": reply.finished}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class ReplyCache:
    """The teacher's replies by prompt, generated on demand and kept in a JSONL file."""

    def __init__(self, path: Path, generate: Generate):
        self.path = path
        self.generate = generate
        self.batch = getattr(generate, "batch", GENERATION_BATCH)  # prompts per generation call
        self.replies = read_replies(path)
        self.generated = 0

    def get(self, prompts: list[list[int]]) -> list[Reply]:
        keys = [prompt_key(p) for p in prompts]
        missing = {k: p for k, p in zip(keys, prompts, strict=True) if k not in self.replies}
        if missing:
            new = dict(zip(missing, self.generate(list(missing.values())), strict=True))
            append_replies(self.path, new)
            self.replies.update(new)
            self.generated += len(new)
        return [self.replies[k] for k in keys]


# --------------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------------


def prompt_ids_of(tokenizer, example) -> list[int] | None:
    if not isinstance(example, list):
        return None  # plain text has no prompt to answer
    prompt = first_user_prompt(example)
    if prompt is None:
        return None
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids) if len(ids) <= MAX_PROMPT_TOKENS else None


def teacher_documents(examples: Iterable, tokenizer, tokens: int, cache: ReplyCache,
                      batch: int | None = None) -> list[Document]:
    """Documents of prompt + teacher reply (only the reply is a target) until `tokens` are reached."""
    batch = batch or cache.batch
    documents: list[Document] = []
    prompts = (p for p in (prompt_ids_of(tokenizer, e) for e in examples) if p is not None)
    while tokens > 0:
        chunk = list(itertools.islice(prompts, batch))
        if not chunk:
            break
        for prompt, reply in zip(chunk, cache.get(chunk), strict=True):
            if tokens <= 0 or not reply.ids:
                continue
            documents.append(Document(prompt + reply.ids, [False] * len(prompt) + [True] * len(reply.ids)))
            tokens -= len(prompt) + len(reply.ids)
    return documents


# --------------------------------------------------------------------------------------------------
# Generation with vLLM
# --------------------------------------------------------------------------------------------------


def vllm_generator(folder: Path, max_tokens: int, dtype: str, eos_token_id: int,
                   enforce_eager: bool = False) -> Generate:
    """Greedy replies of the model in `folder` on vLLM (the engine starts on the first call). Token ids
    in, token ids out: the engine needs no tokenizer, and the reply stops at the given end-of-turn id."""
    state = {}

    def generate(prompts: list[list[int]]) -> list[Reply]:
        if "llm" not in state:
            state["llm"] = start_engine(folder, max_tokens, dtype, enforce_eager)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[eos_token_id])
        outputs = state["llm"].generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [reply_of(out.outputs[0], eos_token_id) for out in outputs]

    generate.close = lambda: state.pop("llm", None)  # type: ignore[attr-defined]
    return generate


def hf_generator(folder: Path, max_tokens: int, dtype, eos_token_id: int,
                 device: str | None = None) -> Generate:
    """Greedy replies of the model in `folder` with transformers' `generate`: left-padded batches,
    sorted by length so a batch pads little. The same replies as vLLM's up to the numerics of the
    batch (tested equal to unbatched greedy generation in fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()

    def generate(prompts: list[list[int]]) -> list[Reply]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        replies: dict[int, Reply] = {}
        width = HF_BATCH_CUDA if device.startswith("cuda") else HF_BATCH
        for start in range(0, len(order), width):
            chunk = order[start:start + width]
            for index, reply in zip(chunk, greedy_batch(model, [prompts[i] for i in chunk], max_tokens,
                                                         eos_token_id), strict=True):
                replies[index] = reply
        return [replies[i] for i in range(len(prompts))]

    return generate


HF_BATCH = 64  # prompts per transformers generate() call on CPU
HF_BATCH_CUDA = 256  # a GPU is launch-bound at small batches: wider batches, fewer decode steps in all


def greedy_batch(model, prompts: list[list[int]], max_tokens: int, eos_token_id: int) -> list[Reply]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos_token_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    replies = []
    for row in out[:, width:].tolist():
        finished = eos_token_id in row  # generate pads a finished row with eos after its own
        replies.append(Reply(row[:row.index(eos_token_id) + 1] if finished else row, finished))
    return replies


def start_engine(folder: Path, max_tokens: int, dtype: str, enforce_eager: bool = False):
    from vllm import LLM

    from ..sources import read_config_dict
    from ..vllm.env import configure_cpu_env

    configure_cpu_env()
    window = read_config_dict(folder).get("max_position_embeddings", MAX_PROMPT_TOKENS + max_tokens)
    return LLM(model=str(folder), dtype=dtype, seed=0, max_model_len=min(window, MAX_PROMPT_TOKENS + max_tokens),
               kv_cache_memory_bytes=2 * 2**30, enable_prefix_caching=False, skip_tokenizer_init=True,
               enforce_eager=enforce_eager)


def reply_of(completion, eos_token_id: int) -> Reply:
    ids = list(completion.token_ids)
    finished = completion.finish_reason == "stop"
    if finished and (not ids or ids[-1] != eos_token_id):
        ids.append(eos_token_id)  # the student must learn where the teacher stops
    return Reply(ids, finished)
