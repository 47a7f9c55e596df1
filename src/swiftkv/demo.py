"""`make run`: the embedded SmolLM2 as teacher vs SwiftKV, on this machine, in one run."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .convert import ConvertSettings, convert
from .data.mixture import read_data
from .dtypes import describe_choice, dtype_name, resolve_dtype
from .files import write_atomic
from .generation import chat_input_ids, generate_text, kv_cache_bytes, median_prefill_seconds, prefill
from .sources import SMOLLM2_ALIAS, available_aliases, load_model, open_source

DISTILLED_ALIAS = f"{SMOLLM2_ALIAS}-swiftkv50"


def long_prompt_ids(tokenizer, tokens: int) -> torch.Tensor:
    """A chat prompt of about `tokens` tokens: a long document followed by a question about it."""
    text = ""
    for messages in filter(None, read_data("sharegpt")):
        text += "\n\n".join(m["content"] for m in messages) + "\n\n"
        if len(tokenizer(text)["input_ids"]) > tokens:
            break
    document = tokenizer.decode(tokenizer(text)["input_ids"][: tokens - 40])
    return chat_input_ids(tokenizer, document + "\n\nSummarize the text above in one sentence.")[:, :tokens]


def demo(out: str, prompt_tokens: int, question: str, dtype: str = "auto") -> dict:
    out_dir = Path(out)
    converted = out_dir / "smollm2-swiftkv50-lstsq"
    if not (converted / "config.json").is_file():
        print(f"converting {SMOLLM2_ALIAS} -> {converted} (N=15 of 30, lstsq init) ...")
        print(
            convert(
                ConvertSettings(source=SMOLLM2_ALIAS, out=converted, num_key_value_layers=15, init="lstsq")
            ).summary()
        )
    compute = resolve_dtype(dtype)
    print(describe_choice(dtype))
    source = open_source(SMOLLM2_ALIAS)
    tokenizer, teacher = source.load_tokenizer(), source.load_model(compute)
    students = {"SwiftKV lstsq init": load_model(converted, dtype=compute)}
    if DISTILLED_ALIAS in available_aliases():
        students["SwiftKV distilled"] = load_model(DISTILLED_ALIAS, dtype=compute)
    results = {
        "prompt_tokens": prompt_tokens,
        "dtype": dtype_name(compute),
        **measure_prefill(teacher, students, tokenizer, prompt_tokens),
    }
    results["answers"] = answers(teacher, students, tokenizer, question)
    print_results(results, question)
    write_atomic(out_dir / "demo.json", json.dumps(results, indent=2))
    print(f"\nnumbers written to {out_dir / 'demo.json'}")
    return results


def measure_prefill(teacher, students: dict, tokenizer, prompt_tokens: int) -> dict:
    ids = long_prompt_ids(tokenizer, prompt_tokens)
    student = next(iter(students.values()))
    seconds = median_prefill_seconds({"teacher": teacher, "swiftkv": student}, ids)
    teacher_s, student_s = seconds["teacher"], seconds["swiftkv"]
    teacher_bytes = kv_cache_bytes(prefill(teacher, ids).past_key_values)
    student_bytes = kv_cache_bytes(prefill(student, ids).past_key_values)
    return {
        "teacher_prefill_s": teacher_s,
        "swiftkv_prefill_s": student_s,
        "prefill_speedup": teacher_s / student_s,
        "teacher_kv_bytes": teacher_bytes,
        "swiftkv_kv_bytes": student_bytes,
        "kv_bytes_ratio": student_bytes / teacher_bytes,
    }


def answers(teacher, students: dict, tokenizer, question: str) -> dict:
    ids = chat_input_ids(tokenizer, question)
    models = {"teacher": teacher, **students}
    return {name: generate_text(model, tokenizer, ids, max_new_tokens=48) for name, model in models.items()}


def print_results(results: dict, question: str) -> None:
    print(
        f"\nprefill of one {results['prompt_tokens']}-token prompt ({results['dtype']}, transformers, median of 3):"
    )
    print(f"  teacher  {results['teacher_prefill_s']:.3f} s")
    print(f"  SwiftKV  {results['swiftkv_prefill_s']:.3f} s   -> {results['prefill_speedup']:.2f}x faster")
    print(
        f"KV cache after prefill: teacher {results['teacher_kv_bytes'] / 2**20:.1f} MiB, "
        f"SwiftKV {results['swiftkv_kv_bytes'] / 2**20:.1f} MiB (ratio {results['kv_bytes_ratio']:.2f})"
    )
    print(f"\nQ: {question}")
    for name, text in results["answers"].items():
        print(f"  [{name}] {text.strip()}")
