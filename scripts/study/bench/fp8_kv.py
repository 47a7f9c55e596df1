"""fp8 KV cache beside SwiftKV on vLLM's CPU engine: capacity and served greedy agreement.

    python scripts/study/bench/fp8_kv.py [--model smollm2-135m-instruct-swiftkv50] [--out docs/bench/fp8-kv.json]

* Capacity: KV-cache tokens vLLM allocates at 2 GiB (`swiftkv.vllm.engine.kv_cache_tokens`) for the
  model's geometry at G = 1 and G = 5 (AcrossKV), with the default cache (`auto`) and `fp8`, model dtype
  bf16 (so `auto` is a bf16 cache, 2 bytes per element; fp8 is 1). Capacity does not depend on the
  weights, so the G = 5 engine is the same config with key_value_group_size = 5 and dummy weights.
* Agreement: the served model (real weights, the hardware's dtype as `swiftkv serve` picks it) greedy-answers
  the eval's 32 generation prompts (`swiftkv eval`'s own definition: `evaluate.run.generation_prompts`,
  rendered by `evaluate.chat.generation_prompt_ids`), 32 tokens each, once with the default cache and
  once with fp8; per prompt, the first position where the answers differ (`evaluate.chat.first_divergence`,
  a finished answer continues as EOS). Reported: prompts whose first 8 tokens agree, prompts identical over
  32 tokens, mean first divergence. The plain teacher (`--baseline`) is measured the same way, to tell
  vLLM-CPU's fp8 from SwiftKV's share of the difference.

Every engine runs in its own process (one at a time). Writes the JSON to --out and prints it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[3] / "docs" / "bench"  # where the serving records are kept
KV_BYTES = 2 * 2**30
NEW_TOKENS = 32
KEEP = 8


def engine_run(spec: dict) -> dict:
    """One engine (in this process): capacity, and greedy answers if prompts are given."""
    from vllm import LLM, SamplingParams, TokensPrompt

    from swiftkv.vllm.engine import engine_kwargs, kv_cache_tokens

    kwargs = engine_kwargs(
        spec["folder"],
        kv_cache_dtype=spec["kv_cache_dtype"],
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=2048,
        enable_prefix_caching=False,
        enforce_eager=True,
    )
    if spec.get("plain"):
        kwargs["kv_sharing_fast_prefill"] = False  # a plain model: vLLM as is
    if spec.get("dtype"):
        kwargs["dtype"] = spec["dtype"]
    if spec.get("dummy"):
        kwargs["load_format"] = "dummy"
    llm = LLM(**kwargs)
    result = {
        "kv_cache_tokens": kv_cache_tokens(llm),
        "dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
        "kv_cache_dtype": llm.llm_engine.vllm_config.cache_config.cache_dtype,
    }
    if spec.get("prompts"):
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params, use_tqdm=False
        )
        result["answers"] = [list(o.outputs[0].token_ids) for o in outputs]
    return result


def in_subprocess(spec: dict) -> dict:
    """Run `engine_run(spec)` in a fresh process; its JSON comes back through a file (vLLM prints to stdout)."""
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        spec_path, result_path = Path(scratch) / "spec.json", Path(scratch) / "result.json"
        spec_path.write_text(json.dumps({**spec, "result": str(result_path)}))
        done = subprocess.run(
            [sys.executable, __file__, "--engine", str(spec_path)], capture_output=True, text=True
        )
        if done.returncode or not result_path.is_file():
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(
                f"engine {spec['kv_cache_dtype']} on {spec['folder']} failed (exit {done.returncode})"
            )
        result = json.loads(result_path.read_text())
    result["seconds"] = round(time.time() - started, 1)
    return result


def group_folder(folder: Path, group_size: int, root: Path) -> Path:
    """The model's config (and tokenizer) with another key_value_group_size; no weights (dummy load)."""
    if group_size == json.loads((folder / "config.json").read_text()).get("key_value_group_size", 1):
        return folder
    out = root / f"g{group_size}"
    out.mkdir(exist_ok=True)
    for item in folder.iterdir():
        if item.is_file() and not item.name.endswith((".safetensors", ".bin")) and item.name != "config.json":
            shutil.copy(item, out / item.name)
    config = json.loads((folder / "config.json").read_text())
    config["key_value_group_size"] = group_size
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def eval_prompt_ids(folder: Path) -> list[list[int]]:
    from swiftkv.evaluate.chat import generation_prompt_ids
    from swiftkv.evaluate.run import generation_prompts
    from swiftkv.evaluate.settings import EvalSettings
    from swiftkv.sources import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    settings = EvalSettings()
    return [
        generation_prompt_ids(tokenizer, messages) for messages in generation_prompts(tokenizer, settings)
    ]


def agreement(folder: Path, prompts: list[list[int]], eos: int, plain: bool = False) -> dict:
    """Greedy answers with the default cache and with fp8 (the hardware's dtype), compared per prompt."""
    from swiftkv.evaluate.chat import first_divergence

    answers, dtype = {}, None
    for kv_cache_dtype in ("auto", "fp8"):
        got = in_subprocess(
            {"folder": str(folder), "kv_cache_dtype": kv_cache_dtype, "prompts": prompts, "plain": plain}
        )
        answers[kv_cache_dtype], dtype = got["answers"], got["dtype"]
        print(f"{folder.name}: answers with the {kv_cache_dtype} cache, dtype {dtype}", flush=True)
    divergence = [
        first_divergence(a, b, NEW_TOKENS, eos) for a, b in zip(answers["auto"], answers["fp8"], strict=True)
    ]
    return {
        "dtype": dtype,
        "prompts": len(prompts),
        "new_tokens": NEW_TOKENS,
        "first_divergence": divergence,
        f"keep_first_{KEEP}": sum(d >= KEEP for d in divergence),
        "differ_at_first_token": sum(d == 0 for d in divergence),
        "identical": sum(d == NEW_TOKENS for d in divergence),
        "mean_first_divergence": round(sum(divergence) / len(divergence), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct-swiftkv50")
    parser.add_argument("--out", default=str(RECORDS / "fp8-kv.json"))
    parser.add_argument(
        "--baseline",
        default="smollm2-135m-instruct",
        help="also measure this plain model's fp8 agreement the same way ('' skips it)",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine spec (a JSON file)
    args = parser.parse_args()
    if args.engine:
        spec = json.loads(Path(args.engine).read_text())
        Path(spec["result"]).write_text(json.dumps(engine_run(spec)))
        return

    from swiftkv.sources import load_tokenizer, resolve_source
    from swiftkv.vllm.env import configure_cpu_env

    configure_cpu_env()
    folder = resolve_source(args.model)
    report = {"model": args.model, "kv_cache_memory_bytes": KV_BYTES, "capacity": {}}
    with tempfile.TemporaryDirectory() as root:
        for group_size in (1, 5):
            for kv_cache_dtype in ("auto", "fp8"):
                spec = {
                    "folder": str(group_folder(folder, group_size, Path(root))),
                    "kv_cache_dtype": kv_cache_dtype,
                    "dtype": "bfloat16",
                    "dummy": True,
                }
                got = in_subprocess(spec)
                report["capacity"][f"G{group_size}-{kv_cache_dtype}"] = got["kv_cache_tokens"]
                print(
                    f"capacity G={group_size} {kv_cache_dtype} (model dtype {got['dtype']}): "
                    f"{got['kv_cache_tokens']} tokens",
                    flush=True,
                )
    for group_size in (1, 5):
        report["capacity"][f"G{group_size}-fp8/auto"] = round(
            report["capacity"][f"G{group_size}-fp8"] / report["capacity"][f"G{group_size}-auto"], 3
        )

    prompts = eval_prompt_ids(folder)
    eos = load_tokenizer(str(folder)).eos_token_id
    report["agreement"] = agreement(folder, prompts, eos)
    if args.baseline:
        report["baseline_agreement"] = {
            "model": args.baseline,
            **agreement(resolve_source(args.baseline), prompts, eos, plain=True),
        }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
