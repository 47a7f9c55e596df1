"""`RepliesSettings`: what the replies stage writes (the writer, the data and its split, the token budgets,
the long prompts) and how (the engine, its dtype and parallelism); the engine `auto` resolves to, and the walk's
batch."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, DataSpec
from ..data.split import LONG_KINDS, LongMix
from ..data.tokens import MAX_PROMPT_TOKENS
from ..dtypes import DTYPE_CHOICES
from ..settings import parse_count, setting
from ..sources import Source
from .file import WALK_BATCH
from .hf import HF_BATCH_CUDA
from .vllm_engines import check_devices

# Prompts per static-engine call on a CPU: its 64-row batches are cut from this many sorted by length, so
# each pads to near its own prompts' length (a random 64 pads to its longest: every-turn prompts average
# ~456 tokens and reach 1,024). A kill loses at most one call's replies, since they are appended call by
# call.
STATIC_POOL_CPU = 512
# Most tokens of a written reply, for this stage and distill alike: the cache file is named after it, so a
# stage run with distill's defaults writes the file distill then reads.
REPLY_TOKENS = 64
WRITERS = ("teacher", "student")
ENGINES = ("auto", "vllm", "hf", "static")
PROMPT_TURNS = ("first", "every")
LONG_KIND_HELP = (
    "what the long prompts of --long-share are: chat (passages + a question a chat asked, or a document + a "
    "summary request) or passage-qa (passages + a question about a made-up fact that one of them holds, "
    "decoys in others: the shape of `swiftkv eval --long-qa`)"
)


@dataclass
class RepliesSettings:
    source: str | Source = setting(
        None, "the model whose replies are written (HF folder, .gguf or alias)", cli=False
    )
    out: str | None = setting(
        None,
        "the replies JSONL (appended to, so a killed run resumes; default: in the "
        "swiftkv cache, named after the writer's weights and --reply-tokens)",
    )
    writer: str = setting(
        "teacher",
        "who writes: the teacher (SRC itself when plain, its own teacher weights when "
        "SRC is a SwiftKV folder) or the student (SRC, a SwiftKV folder, as it is)",
        choices=WRITERS,
    )
    data: DataSpec = setting(
        "sharegpt", f"{DATA_HELP}: the first user turn of each train chat is a prompt", repeat=True
    )
    data_split: str = setting(DEFAULT_SPLIT, SPLIT_HELP)
    tokens: int = setting(
        1_000_000,
        "prompt + reply tokens to write (distill: its train tokens, half with --targets mixed)",
        parse=parse_count,
    )
    heldout_tokens: int = setting(
        32_768, "held-out tokens of the split, skipped (distill's --heldout-tokens)", parse=parse_count
    )
    skip_tokens: int = setting(
        0,
        "train tokens of the split passed over before --tokens (distill's --skip-tokens)",
        parse=parse_count,
    )
    seed: int = setting(0, "the split's seed (distill's --seed)")
    reply_tokens: int = setting(REPLY_TOKENS, "max tokens of a reply (distill's --reply-tokens)")
    engine: str = setting(
        "auto",
        "vllm, hf (transformers' generate, on CUDA when available), static (a batched greedy loop over a "
        "static KV cache, CUDA graphs on a GPU; plain writers only) or auto (vllm where installed)",
        choices=ENGINES,
    )
    dtype: str = setting("auto", "compute dtype: auto = bf16 where native, else fp32", choices=DTYPE_CHOICES)
    tensor_parallel_size: int = setting(
        1,
        "ranks the vLLM engine splits the writer over (tensor parallelism): GPUs on CUDA (e.g. 8 for a 70B), "
        "CPU cores on vLLM's CPU build; vllm engine only",
    )
    data_parallel_size: int = setting(
        1,
        "vLLM engines writing at once, each on --tensor-parallel-size devices of its own and given every K-th "
        "prompt (e.g. 8 for an 8B writer on a node of 8 GPUs; on vLLM's CPU build, engines split the cores); "
        "the same replies as one engine; vllm engine only",
    )
    long_share: float = setting(
        0.0,
        "share of --tokens written as answers to long prompts (1-2k tokens of "
        "passages + a question, or a document + a summary request, built from the chats "
        "after the first prompts): SwiftKV's own workload",
    )
    long_kind: str = setting(
        "chat",
        LONG_KIND_HELP,
        choices=tuple(LONG_KINDS),
    )
    long_prompt_tokens: int = setting(
        2048, "most tokens of a long prompt, chat template included (distill: --seq-len minus the reply)"
    )
    prompt_turns: str = setting(
        "first",
        "which user turns of a chat are prompts: its first, or every user turn "
        "with the conversation before it (more prompts from the same chats)",
        choices=PROMPT_TURNS,
    )

    def long_mix(self) -> LongMix | None:
        self.check_long_mix()
        return LongMix(self.long_share, self.long_prompt_tokens, self.long_kind) if self.long_share else None

    def check_long_mix(self) -> None:
        """--long-kind says what the long prompts of --long-share are, so it needs a share of them."""
        if self.long_kind not in LONG_KINDS:
            raise ValueError(f"--long-kind {self.long_kind!r}: expected one of {list(LONG_KINDS)}")
        if self.long_kind != "chat" and not self.long_share:
            raise ValueError(
                f"--long-kind {self.long_kind} chooses the long prompts of --long-share, and the share is 0; "
                "expected --long-share S too (e.g. 0.25: a quarter of the written tokens)"
            )

    @property
    def every_turn(self) -> bool:
        return self.prompt_turns == "every"

    def check_engine(self) -> None:
        """The static engine runs plain models: the teacher writes (a SwiftKV SRC's own teacher weights).
        Only vLLM splits a writer over several devices, or runs several engines; their devices must be here."""
        if self.engine == "static" and self.writer == "student":
            raise ValueError(
                "--reply-engine static writes with a plain model, and --reply-writer student is a "
                "SwiftKV one; expected --reply-engine vllm or hf"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size {self.tensor_parallel_size}: expected 1 or more ranks")
        if self.data_parallel_size < 1:
            raise ValueError(f"--data-parallel-size {self.data_parallel_size}: expected 1 or more engines")
        engine = resolved_engine(self)
        for option, value in (
            ("tensor-parallel-size", self.tensor_parallel_size),
            ("data-parallel-size", self.data_parallel_size),
        ):
            if value > 1 and engine != "vllm":
                raise ValueError(
                    f"--{option} {value}: only the vllm engine splits a writer over ranks or runs several "
                    f"engines, and this run writes with {engine}; expected --engine vllm (installed) or "
                    f"--{option} 1"
                )
        if engine == "vllm":
            check_devices(self.data_parallel_size, self.tensor_parallel_size, torch.cuda.is_available())

    def max_prompt_tokens(self) -> int:
        """The longest prompt the writer answers: a first turn, or a long prompt."""
        return max(MAX_PROMPT_TOKENS, self.long_prompt_tokens if self.long_share else 0)


def resolved_engine(settings: RepliesSettings) -> str:
    return (
        settings.engine
        if settings.engine != "auto"
        else ("vllm" if importlib.util.find_spec("vllm") else "hf")
    )


def generation_batch(settings: RepliesSettings) -> int:
    """Prompts per generation call. It decides which examples the written prompts consume, and so
    where `--targets mixed` takes its human chats from: the writing and the reading walk share it."""
    engine = resolved_engine(settings)
    if engine in ("hf", "static") and torch.cuda.is_available():
        return HF_BATCH_CUDA
    return STATIC_POOL_CPU if engine == "static" else WALK_BATCH
