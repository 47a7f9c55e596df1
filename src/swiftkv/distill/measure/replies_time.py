"""`swiftkv replies ... --plan`: the time of the replies stage at the run's shape, before any is written.

The work: the run writes prompt + reply tokens until --tokens; the prompts' mean length is read from the first
SAMPLE_PROMPTS prompts of --data, and every reply is taken at --reply-tokens (an upper bound; chat replies at a
512-token budget mostly reach it). The rates: the writer's prefill and greedy decode, timed with transformers
on random weights of its shape on this machine's device (the whole model on a GPU it fits, else
TIMED_LAYERS layers at the true width, the rate scaled by the layer count), over a batch of BATCH_GPU
sequences (BATCH_CPU on a CPU, over prompts of at most CPU_PROMPT_TOKENS). vLLM's paged, continuously batched
engine decodes faster than transformers' loop over one batch, so the time is an upper estimate for one engine;
K engines (--data-parallel-size) divide it by K."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig

from ...data.mixture import read_data
from ...data.tokens import first_prompt
from ...dtypes import dtype_name, resolve_dtype
from ...model.config import is_swiftkv
from ...replies import RepliesSettings
from ...sources import load_tokenizer, open_source
from ..parallel.world import training_device
from .bound import device_label
from .plan import model_parameters
from .speed import CPU_VOCAB, TIMED_LAYERS, few_layer_config, figures, random_model, whole_model_fits

SAMPLE_PROMPTS = 256
BATCH_GPU = 128
BATCH_CPU = 4
CPU_PROMPT_TOKENS = 64
DECODE_STEPS = 8  # timed, after one untimed


@dataclass
class RepliesTime:
    device: str
    dtype: str
    timed: str  # what ran: the whole writer, or TIMED_LAYERS of its layers
    prompts: int  # about, at the sampled mean prompt length and full-length replies
    mean_prompt_tokens: float
    prompt_tokens: int
    reply_tokens: int
    prefill_tokens_per_s: float  # of the whole writer on one device
    decode_tokens_per_s: float
    device_hours: float  # one engine on one device

    def lines(self, engines: int) -> list[str]:
        return [
            f"replies: about {self.prompts:,} prompts of {self.mean_prompt_tokens:.0f} tokens (the first "
            f"{SAMPLE_PROMPTS} of --data) with replies of up to --reply-tokens: {self.prompt_tokens:,} prompt + "
            f"{self.reply_tokens:,} reply tokens",
            f"  on this device ({self.device}, {self.dtype}, transformers, {self.timed}): prefill "
            f"{figures(self.prefill_tokens_per_s)} tok/s, decode {figures(self.decode_tokens_per_s)} tok/s: "
            f"{figures(self.device_hours)} device-hours, {figures(self.device_hours / engines)} h on {engines} "
            "engine(s); vLLM's continuous batching decodes faster, so this is an upper estimate",
        ]


def plan_replies(settings: RepliesSettings) -> RepliesTime:
    """The replies stage's work at `settings` and its time on this machine's device."""
    folder = open_source(settings.source).folder  # a SwiftKV folder's teacher path is its teacher's shape
    mean_prompt = mean_prompt_tokens(settings, load_tokenizer(folder))
    prompts = max(1, round(settings.tokens / (mean_prompt + settings.reply_tokens)))
    device = training_device()
    dtype = resolve_dtype(settings.dtype, device.type)
    timed, prefill, decode = time_writer(folder, settings.writer == "student", dtype, device, mean_prompt)
    prompt_tokens, reply_tokens = round(prompts * mean_prompt), prompts * settings.reply_tokens
    seconds = prompt_tokens / prefill + reply_tokens / decode
    return RepliesTime(
        device=device_label(device),
        dtype=dtype_name(dtype),
        timed=timed,
        prompts=prompts,
        mean_prompt_tokens=mean_prompt,
        prompt_tokens=prompt_tokens,
        reply_tokens=reply_tokens,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        device_hours=seconds / 3600,
    )


def mean_prompt_tokens(settings: RepliesSettings, tokenizer) -> float:
    """The mean token count of the first SAMPLE_PROMPTS prompts of --data (chat template included)."""
    found = (
        first_prompt(tokenizer, e) for e in read_data(settings.data, settings.seed, split=settings.data_split)
    )
    lengths = [len(ids) for _, ids in itertools.islice((f for f in found if f is not None), SAMPLE_PROMPTS)]
    if not lengths:
        raise ValueError(f"--data {settings.data}: no chat with a user turn to answer; expected chat records")
    return sum(lengths) / len(lengths)


@torch.inference_mode()
def time_writer(folder: Path, student: bool, dtype, device: torch.device, prompt_tokens: float):
    """(what ran, prefill tok/s, decode tok/s) of the writer's shape with random weights on `device`."""
    config = AutoConfig.from_pretrained(folder)
    path = {"swiftkv": student} if is_swiftkv(config.to_dict()) else {}
    layers = config.num_hidden_layers
    whole = whole_model_fits(model_parameters(folder) * dtype.itemsize / 2**30, device)
    if not whole:
        config = few_layer_config(config, None if device.type == "cuda" else CPU_VOCAB)
    # In the compute dtype throughout, the SwiftKV projections too: no trainer keeps them in fp32 here.
    model = random_model(config, device, dtype).to(dtype).eval()
    batch = BATCH_GPU if device.type == "cuda" else BATCH_CPU
    length = max(1, round(prompt_tokens if device.type == "cuda" else min(prompt_tokens, CPU_PROMPT_TOKENS)))
    seeded = torch.Generator().manual_seed(0)
    ids = torch.randint(3, config.vocab_size, (batch, length), generator=seeded).to(device)

    def forward(tokens, cache=None):
        out = model(tokens, past_key_values=cache, use_cache=True, **path)
        return out.logits[:, -1:].argmax(-1), out.past_key_values

    def decode(token, cache):
        for _ in range(DECODE_STEPS):
            token, cache = forward(token, cache)

    forward(ids[:, : min(8, length)])  # warm-up
    prefill_seconds, (token, cache) = timed(device, lambda: forward(ids))
    token, cache = forward(token, cache)  # the first step after a prefill is not a steady one
    decode_seconds, _ = timed(device, lambda: decode(token, cache))
    scale = 1.0 if whole else TIMED_LAYERS / layers
    what = "the whole model" if whole else f"{TIMED_LAYERS} of its {layers} layers, the rate scaled"
    rates = batch * length / prefill_seconds, batch * DECODE_STEPS / decode_seconds
    return f"{what}, batch {batch} x {length} prompt tokens", rates[0] * scale, rates[1] * scale


def timed(device: torch.device, work):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result
