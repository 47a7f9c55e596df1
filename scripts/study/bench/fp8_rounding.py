"""Why the fp8 KV cache costs so much agreement on vLLM-CPU: the HF model (fp32) with its attention's
K and V rounded to e4m3 (scale 1.0) to nearest, and toward zero as vLLM-CPU's `vec` kernels store them,
against the same model unrounded: greedy answers to the first 16 of `swiftkv eval`'s generation prompts,
16 tokens each (`evaluate.chat.first_divergence`).

    python scripts/study/bench/fp8_rounding.py MODEL [MODEL ...]   # e.g. smollm2-135m-instruct-swiftkv50 smollm2-135m-instruct

Prints one JSON line per model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

PROMPTS, NEW_TOKENS, KEEP = 16, 16, 8
ROUNDING = {"mode": None}


def e4m3(x: torch.Tensor) -> torch.Tensor:
    rounded = x.to(torch.float8_e4m3fn)
    if ROUNDING["mode"] == "toward_zero":
        raw = rounded.view(torch.uint8).clone()
        raw[rounded.float().abs() > x.abs()] -= 1  # one step toward zero (sign-magnitude bytes)
        rounded = raw.view(torch.float8_e4m3fn)
    return rounded.to(x.dtype)


def rounded_kv_attention(module, query, key, value, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, e4m3(key), e4m3(value), *args, **kwargs)


def measure(alias: str, prompts: list[list[int]]) -> dict:
    from transformers import AutoModelForCausalLM

    import swiftkv  # noqa: F401  (registers the SwiftKV classes)
    from swiftkv.evaluate.chat import first_divergence
    from swiftkv.sources import load_tokenizer, resolve_source

    folder = resolve_source(alias)
    eos = load_tokenizer(str(folder)).eos_token_id
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def answers():
        with torch.no_grad():
            return [
                model.generate(
                    torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=eos
                )[0, len(p) :].tolist()
                for p in prompts
            ]

    reference = answers()
    model.config._attn_implementation = "rounded_kv"
    result = {"model": alias, "prompts": len(prompts), "new_tokens": NEW_TOKENS}
    for mode in ("nearest", "toward_zero"):
        ROUNDING["mode"] = mode
        divergence = [
            first_divergence(a, b, NEW_TOKENS, eos) for a, b in zip(reference, answers(), strict=True)
        ]
        result[mode] = {
            f"keep_first_{KEEP}": sum(d >= KEEP for d in divergence),
            "differ_at_first_token": sum(d == 0 for d in divergence),
            "first_divergence": divergence,
        }
    return result


def main() -> None:
    from transformers import AttentionInterface

    sys.path.insert(0, str(Path(__file__).parent))
    from fp8_kv import eval_prompt_ids

    from swiftkv.sources import resolve_source

    AttentionInterface.register("rounded_kv", rounded_kv_attention)
    prompts = eval_prompt_ids(resolve_source("smollm2-135m-instruct-swiftkv50"))[:PROMPTS]
    for alias in sys.argv[1:]:
        print(json.dumps(measure(alias, prompts)), flush=True)


if __name__ == "__main__":
    main()
