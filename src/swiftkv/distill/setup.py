"""Loading and checking what a distillation run needs, so bad input fails before any work is done."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..files import cache_root, cached_folder, folder_fingerprint
from .settings import REDERIVED_INITS
from .trainable import check_trainable


def set_threads() -> None:
    """Split the machine's cores between the processes torchrun started on it (unless OMP says)."""
    if "OMP_NUM_THREADS" not in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def load_student(settings):
    """(model, tokenizer) of a SwiftKV folder whose teacher weights are intact, checked for the run."""
    from ..sources import load_model, load_tokenizer

    check_reply_writer(settings)
    model = load_model(settings.source, dtype=torch.float32)
    check_student(model, settings)
    check_trainable(settings.trainable, settings.lora_rank, model.config)
    apply_init(model, settings)
    tokenizer = load_tokenizer(settings.source)
    if settings.teacher:
        check_teacher(model, tokenizer, settings.teacher)
    return model, tokenizer


def apply_init(model, settings) -> None:
    """The recipe's starting point: copy/mean are re-derived from the model's own teacher weights;
    lstsq needs calibration data, so it must come from `swiftkv convert --init lstsq`."""
    from ..model.surgery import copy_init_params, load_trained

    if settings.init in REDERIVED_INITS:
        load_trained(model, copy_init_params(model, average_group=settings.init == "mean"))
    elif settings.init == "lstsq":
        converted = (getattr(model.config, "swiftkv_conversion", None) or {}).get("init")
        if converted != "lstsq":
            raise ValueError(f"--init lstsq: {settings.source} was converted with --init {converted}; convert the "
                             "source with `swiftkv convert ... --init lstsq` (it fits on calibration data) or pass "
                             "--init keep / copy / mean")


def check_reply_writer(settings) -> None:
    """A student-written reply comes from SOURCE's SwiftKV parameters as they are on disk, so the run
    must start from those same parameters, and must train on written replies at all."""
    if settings.reply_writer != "student":
        return
    if settings.targets == "human":
        raise ValueError("--reply-writer student: --targets human trains on the data's own replies, which nobody "
                         "writes; expected --targets teacher or mixed")
    if settings.init in REDERIVED_INITS:
        raise ValueError(f"--reply-writer student writes with {settings.source}'s SwiftKV parameters as converted, "
                         f"but --init {settings.init} replaces them before training, so another student would write "
                         "the replies; expected --init keep or lstsq (convert the source with the init you want)")


def check_student(model, settings) -> None:
    config = model.config
    if getattr(config, "num_key_value_layers", None) is None:
        raise ValueError(f"{settings.source} is not a SwiftKV model (no num_key_value_layers); run "
                         "`swiftkv convert SRC DST --num-key-value-layers N` first and distill DST")
    if config.teacher_missing:
        raise ValueError(f"{settings.source} cannot be distilled: {config.teacher_missing}, and distillation needs "
                         "its teacher path; distill an untrimmed conversion of the source model")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and settings.seq_len > limit:
        raise ValueError(f"--seq-len {settings.seq_len} exceeds the model's max_position_embeddings {limit}")
    if settings.seq_len < 2:
        raise ValueError(f"--seq-len {settings.seq_len}: expected at least 2 tokens per block")


def check_teacher(student, student_tokenizer, teacher_source: str) -> None:
    """Shared-prefix distillation is only valid when the student was converted from this teacher:
    same tokenizer, same shapes and the same weights in every tensor the two have in common."""
    from ..sources import load_model, load_tokenizer

    teacher_tokenizer = load_tokenizer(teacher_source)
    if teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        raise ValueError(f"--teacher {teacher_source}: its tokenizer differs from the student's; expected the "
                         "model the student was converted from")
    teacher = load_model(teacher_source, dtype=torch.float32).state_dict()
    for name, tensor in student.state_dict().items():
        if "swiftkv" in name or name not in teacher:
            continue
        if teacher[name].shape != tensor.shape:
            raise ValueError(f"--teacher {teacher_source}: {name} has shape {tuple(teacher[name].shape)}, the "
                             f"student's has {tuple(tensor.shape)}; expected the model the student was converted from")
        if not torch.equal(teacher[name], tensor):
            raise ValueError(f"--teacher {teacher_source}: {name} differs from the student's copy; the shared-prefix "
                             "distillation needs the student converted from exactly this teacher")


# --------------------------------------------------------------------------------------------------
# Written targets (the teacher's replies, or the student's own scored by the teacher)
# --------------------------------------------------------------------------------------------------


def reply_cache(settings, tokenizer, may_generate: bool = True):
    """The written-reply cache of a `--targets teacher|mixed` run (None for human targets). Only the
    main process generates; the others read what it wrote."""
    from .teacher_data import ReplyCache

    if settings.targets == "human":
        return None
    path = Path(settings.teacher_data) if settings.teacher_data else (
        cache_root() / "distill" / f"{settings.reply_writer}-replies-"
                                   f"{folder_fingerprint(reply_writer_folder(settings))}-{settings.reply_tokens}.jsonl")

    def refuse(_prompts):
        raise RuntimeError(f"{settings.reply_writer} replies missing from {path}; the main process should have "
                           "written them")

    return ReplyCache(path, reply_generator(settings, tokenizer.eos_token_id) if may_generate else refuse)


def reply_writer_folder(settings) -> Path:
    """The HF folder whose greedy replies become the targets: the plain teacher, or the SwiftKV
    source itself (vLLM and transformers both run a SwiftKV folder as the student)."""
    from ..sources import resolve_source

    return plain_teacher_folder(settings) if settings.reply_writer == "teacher" else resolve_source(settings.source)


def reply_generator(settings, eos_token_id: int):
    """Greedy replies of the reply writer: vLLM where it is installed (or asked for), transformers'
    generate otherwise. The writer's folder and the engine are set up on the first call only, so a run
    whose replies are all cached builds neither."""
    import importlib.util

    from ..dtypes import dtype_name, resolve_dtype
    from .teacher_data import GENERATION_BATCH, HF_BATCH_CUDA, hf_generator, vllm_generator

    engine = settings.reply_engine
    if engine == "auto":
        engine = "vllm" if importlib.util.find_spec("vllm") else "hf"
    device = "cuda" if engine == "hf" and torch.cuda.is_available() else "cpu"
    state = {}

    def generate(prompts):
        if "engine" not in state:
            writer = reply_writer_folder(settings)
            state["engine"] = (
                vllm_generator(writer, settings.reply_tokens, dtype_name(resolve_dtype(settings.dtype)), eos_token_id)
                if engine == "vllm" else
                hf_generator(writer, settings.reply_tokens, resolve_dtype(settings.dtype, device), eos_token_id, device))
        return state["engine"](prompts)

    generate.batch = HF_BATCH_CUDA if device == "cuda" else GENERATION_BATCH
    generate.close = lambda: getattr(state.pop("engine", None), "close", lambda: None)()
    return generate


def plain_teacher_folder(settings) -> Path:
    """An HF folder of the plain teacher for vLLM: `--teacher`, or the SwiftKV folder's own teacher
    weights saved as the base architecture (vLLM would run a SwiftKV folder as the student)."""
    from ..sources import resolve_source

    if settings.teacher:
        return resolve_source(settings.teacher)
    folder = resolve_source(settings.source)
    return cached_folder(f"teacher-of-{folder_fingerprint(folder)}", lambda out: save_plain_teacher(folder, out))


def save_plain_teacher(folder: Path, out: Path) -> None:
    from ..model.config import add_legacy_rope_keys
    from ..model.surgery import plain_teacher, write_model_folder
    from ..sources import load_model, load_tokenizer

    def fill(tmp: Path) -> None:
        plain_teacher(load_model(folder, dtype=torch.float32)).save_pretrained(tmp)
        add_legacy_rope_keys(tmp)
        load_tokenizer(folder).save_pretrained(tmp)

    write_model_folder(out, fill)
