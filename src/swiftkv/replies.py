"""`swiftkv replies SRC --out replies.jsonl`: a model's greedy replies to the first prompts of the train
part of `--data`, as a stage of its own. Distillation's `--targets teacher|mixed` trains on them: the
teacher's own answers are the distribution the student is judged against, not text the teacher would
never write. With `--writer student` a SwiftKV folder as converted writes them instead, and the
teacher still scores every position in distill (an on-policy snapshot).

The prompts are the ones distill's packing asks for: the same seeded split (`swiftkv.data.split`),
the held-out part skipped, then prompts in order until `--tokens` of prompt + reply are written.
Each line of the output is a chat record that `--data` reads (`messages`: the prompt and the reply),
plus the exact token ids (`key`, `reply_ids`, `finished`) distill trains on. vLLM is handed every
pending prompt at once (on `--data-parallel-size` engines) and each reply is appended as it finishes,
in the prompts' order, fsync'd every few seconds; where vLLM is not installed (e.g. a GPU box with only
torch and transformers), transformers' generation writes batch by batch. A killed run loses only the
replies not yet appended: on restart a truncated last line is cut off, records already there are reused
(first one wins for a repeated key), and only the missing prompts are generated. `distill` calls
`write_replies` first when replies are missing.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import lzma
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from .data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, DataSpec, check_data, read_data
from .data.split import LONG_KINDS, LongMix, split_documents
from .data.tokens import MAX_PROMPT_TOKENS, Reply, prompt_key
from .dtypes import DTYPE_CHOICES, dtype_name, resolve_dtype
from .files import cache_root, cached_folder, folder_fingerprint, write_atomic
from .model.config import add_legacy_rope_keys, is_swiftkv
from .model.surgery import plain_teacher, write_model_folder
from .reply_engines import DataParallelWriter, EngineSpec, EngineWriter, Stream, check_devices
from .settings import parse_count, setting
from .sources import Source, load_model, load_tokenizer, open_source, read_config_dict
from .static_greedy import in_length_order, left_padded, static_generator

# Prompts the split's walk takes at a time. It decides which examples the written prompts consume, and so
# where --targets mixed takes its human chats from: the writing and the reading walk share it. vLLM is not
# bound to it (it is handed every pending prompt at once); transformers' generation answers one at a time.
WALK_BATCH = 64
# The replies appended together as they finish, in the prompts' order: at least this many, or what is ready
# after FLUSH_SECONDS. One fsync each.
FLUSH_RECORDS = 1024
FLUSH_SECONDS = 5.0
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


# --------------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------------


def write_replies(settings: RepliesSettings, tokenizer=None) -> ReplyCache:
    """Write the missing replies of `settings` (all of them on a first run); returns the cache, whose
    `generated` counts the new ones.

    Which prompts get replies depends on the replies: the walk takes prompts until prompt + reply tokens
    reach --tokens. So the stage walks in rounds. A walk takes each unwritten reply as --reply-tokens long
    (none is longer), so it stops no later than the finished walk and every prompt it asks for is one the
    finished walk asks for too; they all go to the engine at once, and the next walk, with those replies
    known, asks for the rest. The file holds exactly the prompts asked for, in the walk's order, whatever
    the rounds, the engines or a kill in between."""
    settings.check_engine()
    settings.check_long_mix()
    check_data(settings.data, split=settings.data_split)
    tokenizer = tokenizer or load_tokenizer(settings.source)
    cache = reply_cache(settings, tokenizer)
    try:
        for walk in itertools.count(1):
            pending = unwritten_prompts(settings, tokenizer, cache)
            if not pending:
                break
            cache.write(pending, stream_of(cache.generate, cache.batch), f"replies, walk {walk}")
    finally:
        getattr(cache.generate, "close", lambda: None)()
    write_atomic(completion_path(cache.path), json.dumps(written_content(settings), indent=2) + "\n")
    return cache


def unwritten_prompts(settings: RepliesSettings, tokenizer, cache: ReplyCache) -> dict[str, Prompt]:
    """The prompts a walk of the split asks for whose replies are not written, in the walk's order."""
    guessed = GuessedReplies(cache, settings.reply_tokens, tokenizer.eos_token_id)
    split_documents(
        read_data(settings.data, settings.seed, split=settings.data_split),
        tokenizer,
        settings.seed,
        settings.heldout_tokens,
        settings.tokens,
        replies=guessed,
        long_mix=settings.long_mix(),
        every_turn=settings.every_turn,
        skip_tokens=settings.skip_tokens,
    )
    return guessed.pending


Prompt = tuple[list[int], list[dict] | None]  # a prompt's token ids and its chat (None: ids only)


class GuessedReplies:
    """What a walk is given for its prompts: the written replies, and for each unwritten one a guess as long
    as a reply can be, its prompt noted as pending. `guessed` tells `split_documents` that the walk's later
    prompts (the long ones, built from the examples after the written prompts end) would start in the wrong
    place."""

    def __init__(self, cache: ReplyCache, reply_tokens: int, eos_token_id: int):
        self.written = cache.replies
        self.batch = cache.batch
        self.guess = Reply([eos_token_id] * reply_tokens, False)
        self.pending: dict[str, Prompt] = {}

    @property
    def guessed(self) -> bool:
        return bool(self.pending)

    def get(self, prompts: list[list[int]], chats: list[list[dict]] | None = None) -> list[Reply]:
        keys = note_unwritten(self.written, prompts, chats, self.pending)
        return [self.written.get(key, self.guess) for key in keys]


def note_unwritten(
    written: dict[str, Reply],
    prompts: list[list[int]],
    chats: list[list[dict]] | None,
    into: dict[str, Prompt],
) -> list[str]:
    """The keys of `prompts`; each prompt whose reply is not `written` is noted in `into` (once)."""
    keys = [prompt_key(p) for p in prompts]
    for k, key in enumerate(keys):
        if key not in written:
            into.setdefault(key, (prompts[k], chats[k] if chats else None))
    return keys


# What decides a replies file's lines beside its writer: not where it goes (--out), nor how it was computed
# (the engine, its dtype and parallelism: each writes the same greedy replies up to its numerics). The
# writer is in the file's name by default (`replies_path`: its weights' fingerprint); a file named with
# --out is the user's to match to its writer, as its resume already is.
HOW_WRITTEN = ("source", "out", "engine", "dtype", "tensor_parallel_size", "data_parallel_size")


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
    """Greedy replies of the writer: vLLM where it is installed (or asked for; its `stream` gives each reply
    as it finishes), transformers' generate otherwise. The writer's folder and the engine are set up on the
    first prompts only, so a run whose replies are all cached builds neither."""
    engine = resolved_engine(settings)
    device = "cuda" if engine in ("hf", "static") and torch.cuda.is_available() else "cpu"
    state = {}

    def writer():
        if "engine" not in state:
            folder = writer_folder(settings)
            dtype = resolve_dtype(settings.dtype, device)
            if engine == "vllm":
                state["engine"] = vllm_writer(settings, folder, dtype_name(dtype), eos_token_id)
            elif engine == "static":
                rows = HF_BATCH_CUDA if device == "cuda" else HF_BATCH
                state["engine"] = static_generator(
                    folder, settings.reply_tokens, dtype, eos_token_id, rows, device
                )
            else:
                state["engine"] = hf_generator(folder, settings.reply_tokens, dtype, eos_token_id, device)
        return state["engine"]

    def generate(prompts):
        return writer()(prompts)

    if engine == "vllm":
        generate.stream = lambda prompts: writer().stream(prompts)
    generate.batch = generation_batch(settings)
    generate.close = lambda: getattr(state.pop("engine", None), "close", lambda: None)()
    return generate


def vllm_writer(settings: RepliesSettings, folder: Path, dtype: str, eos_token_id: int):
    """The writer on vLLM: one engine in this process, or --data-parallel-size engines in their own."""
    spec = EngineSpec(
        str(folder),
        settings.reply_tokens,
        dtype,
        eos_token_id,
        max_prompt_tokens=settings.max_prompt_tokens(),
        tensor_parallel_size=settings.tensor_parallel_size,
    )
    return (
        DataParallelWriter(spec, settings.data_parallel_size)
        if settings.data_parallel_size > 1
        else EngineWriter(spec)
    )


def stream_of(generate: Generate, batch: int) -> Stream:
    """The replies of `generate` as they finish: its own stream (vLLM), or `batch` prompts per call."""
    if hasattr(generate, "stream"):
        return generate.stream

    def batches(prompts):
        for start in range(0, len(prompts), batch):
            yield from enumerate(generate(prompts[start : start + batch]), start)

    return batches


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
        self.batch = getattr(generate, "batch", WALK_BATCH)  # prompts per generation call
        self.replies = read_replies(path)
        self.generated = 0

    def get(self, prompts: list[list[int]], chats: list[list[dict]] | None = None) -> list[Reply]:
        missing: dict[str, Prompt] = {}
        keys = note_unwritten(self.replies, prompts, chats, missing)
        if missing:
            self.write(missing, stream_of(self.generate, self.batch))
        return [self.replies[k] for k in keys]

    def write(self, pending: dict[str, Prompt], stream: Stream, description: str | None = None) -> None:
        """Generate the replies of `pending` (key -> prompt) all at once and append them in its order as
        they finish: whatever is ready in order every FLUSH_RECORDS replies or FLUSH_SECONDS, fsync'd."""
        if self.path.suffix == ".xz":
            raise ValueError(
                f"{self.path} lacks {len(pending)} of the replies asked for, and a .xz reply file is only read; "
                "decompress it (xz -dk) and pass the .jsonl to write the rest into it"
            )
        keys = list(pending)
        finished: dict[int, Reply] = {}
        written = ready = 0
        flushed_at = time.monotonic()
        progress = Progress(len(keys), description)
        for index, reply in stream([pending[key][0] for key in keys]):
            finished[index] = reply
            progress.update(len(pending[keys[index]][0]), len(reply.ids))
            while ready in finished:
                ready += 1
            if ready - written >= FLUSH_RECORDS or time.monotonic() - flushed_at >= FLUSH_SECONDS:
                self.append({keys[i]: finished.pop(i) for i in range(written, ready)}, pending)
                written, flushed_at = ready, time.monotonic()
        progress.close()
        if ready != len(keys):
            raise RuntimeError(f"the engine gave {len(finished) + written} of {len(keys)} replies")
        self.append({keys[i]: finished.pop(i) for i in range(written, ready)}, pending)

    def append(self, replies: dict[str, Reply], pending: dict[str, Prompt]) -> None:
        chats = {key: pending[key][1] for key in replies if pending[key][1] is not None}
        append_replies(self.path, replies, chats, self.tokenizer)
        self.replies.update(replies)
        self.generated += len(replies)


class Progress:
    """A bar over one walk's pending prompts: prompts/s and the time left (tqdm's), prompt and reply
    tokens/s. None as the description: no bar (a walk's few prompts, or a test)."""

    def __init__(self, total: int, description: str | None):
        self.bar = tqdm(
            total=total, desc=description, unit="prompt", disable=description is None, mininterval=2
        )
        self.start = time.monotonic()
        self.tokens = [0, 0]

    def update(self, prompt_tokens: int, reply_tokens: int) -> None:
        self.tokens[0] += prompt_tokens
        self.tokens[1] += reply_tokens
        seconds = max(time.monotonic() - self.start, 1e-9)
        rates = f"prompt {self.tokens[0] / seconds:,.0f} tok/s, reply {self.tokens[1] / seconds:,.0f} tok/s"
        self.bar.set_postfix_str(rates, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


# --------------------------------------------------------------------------------------------------
# Generation with transformers
# --------------------------------------------------------------------------------------------------


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
