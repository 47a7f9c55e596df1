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

import itertools
import json
import shlex
from dataclasses import MISSING, fields
from pathlib import Path

import torch

from ..data.mixture import check_data, read_data
from ..data.split import split_documents
from ..data.tokens import Reply
from ..dtypes import dtype_name, resolve_dtype
from ..files import cache_root, cached_folder, folder_fingerprint, write_atomic
from ..model.config import add_legacy_rope_keys, is_swiftkv
from ..model.surgery import plain_teacher, write_model_folder
from ..sources import load_model, load_tokenizer, open_source, read_config_dict
from .file import Generate, Prompt, ReplyCache, note_unwritten, stream_of
from .hf import HF_BATCH, HF_BATCH_CUDA, hf_generator
from .settings import RepliesSettings, generation_batch, resolved_engine
from .static_greedy import static_generator
from .vllm_engines import DataParallelWriter, EngineSpec, EngineWriter


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
