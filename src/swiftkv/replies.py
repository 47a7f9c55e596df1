"""`swiftkv replies SRC --out replies.jsonl`: a model's greedy replies to the first prompts of the train
part of `--data`, as a stage of its own. Distillation's `--targets teacher|mixed` trains on them: the
teacher's own answers are the distribution the student is judged against, not text the teacher would
never write. With `--writer student` a SwiftKV folder as converted writes them instead, and the
teacher still scores every position in distill (an on-policy snapshot).

The prompts are the ones distill's packing asks for: the same seeded split (`swiftkv.data.split`),
the held-out part skipped, then prompts in order until `--tokens` of prompt + reply are written.
Each line of the output is a chat record that `--data` reads (`messages`: the prompt and the reply),
plus the exact token ids (`key`, `reply_ids`, `finished`) distill trains on. Replies are generated in
batches with vLLM or with transformers' own generation (where vLLM is not installed, e.g. a GPU box
with only torch and transformers), appended one complete record per line, fsync'd batch by batch. A
killed run loses at most the batch in flight: on restart a truncated last line is cut off, records
already there are reused (first one wins for a repeated key), and only the missing prompts are
generated. `distill` calls `write_replies` first when replies are missing.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import os
import shlex
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, DataSpec, check_data, read_data
from .data.split import LONG_KINDS, LongMix, split_documents
from .data.tokens import MAX_PROMPT_TOKENS, Reply, prompt_key
from .dtypes import DTYPE_CHOICES, dtype_name, resolve_dtype
from .files import cache_root, cached_folder, folder_fingerprint, write_atomic
from .model.config import add_legacy_rope_keys, is_swiftkv
from .model.surgery import plain_teacher, write_model_folder
from .settings import parse_count, setting
from .sources import Source, load_model, load_tokenizer, open_source, read_config_dict
from .static_greedy import in_length_order, left_padded, static_generator
from .vllm.engine import engine_kwargs, kv_cache_bytes
from .vllm.env import configure_cpu_env

GENERATION_BATCH = 64  # prompts per vLLM call: one fsync'd append per batch
# Prompts per static-engine call on a CPU: its 64-row batches are cut from this many sorted by length, so
# each pads to near its own prompts' length (a random 64 pads to its longest: every-turn prompts average
# ~456 tokens and reach 1,024). At most a few minutes of writing (1.4-1.6 replies/s on the AMX Xeon) is
# lost by a kill, since the replies are appended call by call.
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

Generate = Callable[[list[list[int]]], list[Reply]]  # prompt token ids -> greedy replies


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
        Only vLLM splits a writer over several devices."""
        if self.engine == "static" and self.writer == "student":
            raise ValueError(
                "--reply-engine static writes with a plain model, and --reply-writer student is a "
                "SwiftKV one; expected --reply-engine vllm or hf"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size {self.tensor_parallel_size}: expected 1 or more ranks")
        engine = resolved_engine(self)
        if self.tensor_parallel_size > 1 and engine != "vllm":
            raise ValueError(
                f"--tensor-parallel-size {self.tensor_parallel_size}: only the vllm engine splits a writer "
                f"over ranks, and this run writes with {engine}; expected --engine vllm (installed) or "
                "--tensor-parallel-size 1"
            )

    def max_prompt_tokens(self) -> int:
        """The longest prompt the writer answers: a first turn, or a long prompt."""
        return max(MAX_PROMPT_TOKENS, self.long_prompt_tokens if self.long_share else 0)


# --------------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------------


def write_replies(settings: RepliesSettings, tokenizer=None) -> ReplyCache:
    """Write the missing replies of `settings` (all of them on a first run); returns the cache, whose
    `generated` counts the new ones. `tokenizer` turns chats into prompt ids (default: SRC's)."""
    settings.check_engine()
    settings.check_long_mix()
    check_data(settings.data, split=settings.data_split)
    tokenizer = tokenizer or load_tokenizer(settings.source)
    cache = reply_cache(settings, tokenizer)
    try:
        split_documents(
            read_data(settings.data, settings.seed, split=settings.data_split),
            tokenizer,
            settings.seed,
            settings.heldout_tokens,
            settings.tokens,
            replies=cache,
            long_mix=settings.long_mix(),
            every_turn=settings.every_turn,
            skip_tokens=settings.skip_tokens,
        )
    finally:
        getattr(cache.generate, "close", lambda: None)()
    write_atomic(completion_path(cache.path), json.dumps(written_content(settings), indent=2) + "\n")
    return cache


# What decides a replies file's lines beside its writer: not where it goes (--out), nor how it was computed
# (the engine, its dtype and parallelism: each writes the same greedy replies up to its numerics). The
# writer is in the file's name by default (`replies_path`: its weights' fingerprint); a file named with
# --out is the user's to match to its writer, as its resume already is.
HOW_WRITTEN = ("source", "out", "engine", "dtype", "tensor_parallel_size")


def written_content(settings: RepliesSettings) -> dict:
    """The settings that decide what a replies file of one writer holds."""
    content = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in HOW_WRITTEN}
    content["data"] = list(content["data"]) if isinstance(content["data"], tuple) else content["data"]
    return content


def completion_path(path: Path) -> Path:
    """Where `write_replies` records that every reply of a file was written, and for which settings."""
    return path.with_name(path.name + ".complete.json")


def replies_complete(settings: RepliesSettings) -> bool:
    """Whether a finished `write_replies` of these settings (or of more --tokens) wrote their file."""
    record = completion_path(replies_path(settings))
    if not record.is_file():
        return False
    written, wanted = json.loads(record.read_text()), written_content(settings)
    more = written.pop("tokens", 0) >= wanted.pop("tokens")
    return more and written == wanted


def replies_command(settings: RepliesSettings) -> str:
    """The `swiftkv replies` command line that writes the replies of `settings` to the file a run reads."""
    words = ["swiftkv", "replies", str(settings.source), "--out", str(replies_path(settings))]
    for field in fields(settings):
        value = getattr(settings, field.name)
        if field.name in ("source", "out") or field.default is MISSING or value == field.default:
            continue
        for one in value if isinstance(value, tuple) else (value,):  # a repeated option: each value
            words += ["--" + field.name.replace("_", "-"), str(one)]
    return shlex.join(words)


def reply_cache(settings: RepliesSettings, tokenizer, may_generate: bool = True) -> ReplyCache:
    """The replies of `settings` as a cache: generated on demand, or (`may_generate=False`, what
    distill's packing reads) refused when missing."""
    path = replies_path(settings)

    def refuse(_prompts):
        raise RuntimeError(
            f"{settings.writer} replies missing from {path}; write them first (`swiftkv replies`, "
            "or distill's main process)"
        )

    refuse.batch = generation_batch(
        settings
    )  # the writer's batches: --targets mixed takes human chats after them
    return ReplyCache(
        path, reply_generator(settings, tokenizer.eos_token_id) if may_generate else refuse, tokenizer
    )


def replies_path(settings: RepliesSettings) -> Path:
    if settings.out:
        return Path(settings.out)
    return (
        cache_root()
        / "distill"
        / (
            f"{settings.writer}-replies-{folder_fingerprint(writer_folder(settings))}-"
            f"{settings.reply_tokens}.jsonl"
        )
    )


def writer_folder(settings: RepliesSettings) -> Path:
    """The HF folder whose greedy replies are written: SRC (a plain model, or a SwiftKV one for the
    student: vLLM and transformers both run a SwiftKV folder as the student), or the plain teacher
    held inside a SwiftKV SRC."""
    folder = open_source(settings.source).folder
    swiftkv = is_swiftkv(read_config_dict(folder))
    if settings.writer == "student":
        if not swiftkv:
            raise ValueError(
                f"--writer student: {settings.source} is not a SwiftKV model; expected a folder from "
                "`swiftkv convert`"
            )
        return folder
    return plain_teacher_folder(folder) if swiftkv else folder


def plain_teacher_folder(folder: Path) -> Path:
    """The SwiftKV folder's own teacher weights saved as the base architecture, in the cache (vLLM
    would run a SwiftKV folder as the student)."""
    return cached_folder(
        f"teacher-of-{folder_fingerprint(folder)}", lambda out: save_plain_teacher(folder, out)
    )


def save_plain_teacher(folder: Path, out: Path) -> None:
    def fill(tmp: Path) -> None:
        plain_teacher(load_model(folder, dtype=torch.float32)).save_pretrained(tmp)
        add_legacy_rope_keys(tmp)
        load_tokenizer(folder).save_pretrained(tmp)

    write_model_folder(out, fill)


def reply_generator(settings: RepliesSettings, eos_token_id: int) -> Generate:
    """Greedy replies of the writer: vLLM where it is installed (or asked for), transformers'
    generate otherwise. The writer's folder and the engine are set up on the first call only, so a run
    whose replies are all cached builds neither."""
    engine = resolved_engine(settings)
    device = "cuda" if engine in ("hf", "static") and torch.cuda.is_available() else "cpu"
    state = {}

    def generate(prompts):
        if "engine" not in state:
            writer = writer_folder(settings)
            dtype = resolve_dtype(settings.dtype, device)
            if engine == "vllm":
                state["engine"] = vllm_generator(
                    writer,
                    settings.reply_tokens,
                    dtype_name(dtype),
                    eos_token_id,
                    max_prompt_tokens=settings.max_prompt_tokens(),
                    tensor_parallel_size=settings.tensor_parallel_size,
                )
            elif engine == "static":
                rows = HF_BATCH_CUDA if device == "cuda" else HF_BATCH
                state["engine"] = static_generator(
                    writer, settings.reply_tokens, dtype, eos_token_id, rows, device
                )
            else:
                state["engine"] = hf_generator(writer, settings.reply_tokens, dtype, eos_token_id, device)
        return state["engine"](prompts)

    generate.batch = generation_batch(settings)
    generate.close = lambda: getattr(state.pop("engine", None), "close", lambda: None)()
    return generate


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
    return STATIC_POOL_CPU if engine == "static" else GENERATION_BATCH


# --------------------------------------------------------------------------------------------------
# The reply file
# --------------------------------------------------------------------------------------------------


def read_replies(path: Path) -> dict[str, Reply]:
    """Complete records of `path`; a torn last line (a kill mid-write) is cut off the file. A `.xz` file
    (the records' ids as kept in the repository) is read as it is."""
    if not path.is_file():
        return {}
    if path.suffix == ".xz":
        return reply_records(lzma.decompress(path.read_bytes()).decode("utf-8"), path)
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(complete))
    return reply_records(complete.decode("utf-8"), path)


def reply_records(text: str, path: Path) -> dict[str, Reply]:
    """The replies of a reply file's lines, by prompt key (the first of a repeated key)."""
    replies: dict[str, Reply] = {}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
            replies.setdefault(record["key"], Reply(record["reply_ids"], record["finished"]))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path}:{number}: not a teacher-reply record ({error}); delete the file to regenerate it"
            ) from error
    return replies


def reply_record(key: str, reply: Reply) -> dict:
    """A reply file's record of one reply, as `read_replies` reads it back."""
    return {"key": key, "reply_ids": reply.ids, "finished": reply.finished}


def append_replies(
    path: Path, records: dict[str, Reply], chats: dict[str, list[dict]] | None = None, tokenizer=None
) -> None:
    """Append `records`; with their prompt `chats` and a tokenizer, each line is also a chat record
    (`messages`: the prompt, then the reply as text) that `--data` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for key, reply in records.items():
            record = reply_record(key, reply)
            if chats and key in chats and tokenizer is not None:
                text = tokenizer.decode(reply.ids, skip_special_tokens=True)
                record = {"messages": [*chats[key], {"role": "assistant", "content": text}], **record}
            handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class ReplyCache:
    """The writer's replies by prompt, generated on demand and kept in a JSONL file."""

    def __init__(self, path: Path, generate: Generate, tokenizer=None):
        self.path = path
        self.generate = generate
        self.tokenizer = tokenizer  # decodes the replies into the chat records (None: ids only)
        self.batch = getattr(generate, "batch", GENERATION_BATCH)  # prompts per generation call
        self.replies = read_replies(path)
        self.generated = 0

    def get(self, prompts: list[list[int]], chats: list[list[dict]] | None = None) -> list[Reply]:
        keys = [prompt_key(p) for p in prompts]
        missing = {k: p for k, p in zip(keys, prompts, strict=True) if k not in self.replies}
        if missing and self.path.suffix == ".xz":
            raise ValueError(
                f"{self.path} lacks {len(missing)} of the replies asked for, and a .xz reply file is only read; "
                "decompress it (xz -dk) and pass the .jsonl to write the rest into it"
            )
        if missing:
            new = dict(zip(missing, self.generate(list(missing.values())), strict=True))
            append_replies(
                self.path, new, dict(zip(keys, chats, strict=True)) if chats else None, self.tokenizer
            )
            self.replies.update(new)
            self.generated += len(new)
        return [self.replies[k] for k in keys]


# --------------------------------------------------------------------------------------------------
# Generation with vLLM
# --------------------------------------------------------------------------------------------------


def vllm_generator(
    folder: Path,
    max_tokens: int,
    dtype: str,
    eos_token_id: int,
    enforce_eager: bool = False,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    tensor_parallel_size: int = 1,
) -> Generate:
    """Greedy replies of the model in `folder` on vLLM (the engine starts on the first call), split over
    `tensor_parallel_size` ranks. Token ids in, token ids out: the engine needs no tokenizer, and the
    reply stops at the given end-of-turn id."""
    state = {}

    def generate(prompts: list[list[int]]) -> list[Reply]:
        if "llm" not in state:
            state["llm"] = start_engine(
                folder, max_tokens, dtype, enforce_eager, max_prompt_tokens, tensor_parallel_size
            )
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[eos_token_id])
        outputs = state["llm"].generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        return [reply_of(out.outputs[0], eos_token_id) for out in outputs]

    generate.close = lambda: state.pop("llm", None)  # type: ignore[attr-defined]
    return generate


def hf_generator(
    folder: Path, max_tokens: int, dtype, eos_token_id: int, device: str | None = None
) -> Generate:
    """Greedy replies of the model in `folder` with transformers' `generate`: left-padded batches,
    sorted by length so a batch pads little. The same replies as vLLM's up to the numerics of the
    batch (tested equal to unbatched greedy generation in fp32)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()

    rows = HF_BATCH_CUDA if device.startswith("cuda") else HF_BATCH
    return lambda prompts: in_length_order(
        prompts, rows, lambda batch: greedy_batch(model, batch, max_tokens, eos_token_id)
    )


HF_BATCH = 64  # prompts per transformers generate() call on CPU
# A GPU is launch-bound at small batches: wider batches, fewer decode steps in all. 1024 rows of
# prompts up to 1024 tokens + a 64-token reply hold a ~26 GB bf16 KV cache for a 135M model.
HF_BATCH_CUDA = 1024


def greedy_batch(model, prompts: list[list[int]], max_tokens: int, eos_token_id: int) -> list[Reply]:
    width = max(len(p) for p in prompts)
    ids, mask = left_padded(prompts, width, eos_token_id, model.device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
        )
    # generate pads a finished row with eos after its own
    return [Reply.of_row(row, eos_token_id) for row in out[:, width:].tolist()]


def start_engine(
    folder: Path,
    max_tokens: int,
    dtype: str,
    enforce_eager: bool = False,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    tensor_parallel_size: int = 1,
):
    """A vLLM engine for the writer: its KV cache sized by vLLM on CUDA, KV_CACHE_BYTES on the CPU build
    (`engine.kv_cache_bytes`); tensor parallel ranks as worker processes (the CPU build's only way)."""
    from vllm import LLM

    configure_cpu_env(ranks=tensor_parallel_size)
    window = read_config_dict(folder).get("max_position_embeddings", max_prompt_tokens + max_tokens)
    kv_bytes = kv_cache_bytes(torch.cuda.is_available())
    parallel = (
        {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": "mp"}
        if tensor_parallel_size > 1
        else {}
    )
    return LLM(
        **engine_kwargs(
            str(folder),
            dtype=dtype,
            max_model_len=min(window, max_prompt_tokens + max_tokens),
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            enforce_eager=enforce_eager,
            **({} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}),
            **parallel,
        )
    )


def reply_of(completion, eos_token_id: int) -> Reply:
    ids = list(completion.token_ids)
    finished = completion.finish_reason == "stop"
    if finished and (not ids or ids[-1] != eos_token_id):
        ids.append(eos_token_id)  # the student must learn where the teacher stops
    return Reply(ids, finished)
