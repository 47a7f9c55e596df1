"""`swiftkv bench --moe`: SwiftKV's prefill gain on a Mixture-of-Experts layer shape, on vLLM, against its FLOP
bound, measured in one run.

The model is Qwen3-30B-A3B's layer (hidden 2048, 32 query heads and 4 KV heads of 128, experts 768 wide, 8 run
per token) with fewer layers and experts (`--moe-layers`, `--moe-experts`), so that the teacher and its SwiftKV
student at N = L / 2 (G = 1) fit in the host's memory together; the vocabulary is 32,768 (a prefill with
max_tokens=1 applies the lm_head to one row per prompt, so its size moves memory, not the measure). A token runs
8 experts whatever their count, so the experts kept decide the weights' bytes, not the FLOPs per token.

Both models are config-only folders that vLLM fills with random weights (`load_format="dummy"`): a prefill's
time depends on the shapes, not on the values. The routers' random weights spread the tokens over the experts
about evenly, where a trained router does not. The teacher is served by vLLM's own Qwen3-MoE, the student by the
plugin (vLLM's Qwen3-MoE layers below N, its fused MoE in the later layers): the same kernels on both sides.

Each model has its own engine process (the engine core inside it, so the process's peak RSS is the engine's),
with the same engine settings and a KV cache sized for one prefill batch (`MoeShape.kv_cache_bytes`). The
prefill workload (`--moe-prompts` prompts of 2000 random tokens, max_tokens=1) runs `--moe-repeats` times on
each, alternating the models and who goes first, so load from other processes hits both alike; the medians and
their ratio are reported. By default both engines stay alive, as in `swiftkv bench`, and warm up once; with
`--moe-one-at-a-time` only one is alive at a time (a shape whose two engines do not fit the host together): each
timed batch starts its model's engine afresh, warms it up, and closes it. The FLOP bound
of the ratio is the teacher's FLOPs per prompt token over the student's (`flops.prefill_flops_per_token`:
routers, routed experts and attention included), and each engine's prefill utilisation is its tok/s x its own
FLOPs per token over the matmul peak measured in the run. Writes bench-moe.json and bench-moe.png."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from transformers import Qwen3MoeConfig

from ..dtypes import describe_choice, resolve_dtype
from ..files import write_atomic
from ..flops import prefill_flops_per_token
from ..hostmemory import peak_mib
from ..model.surgery import swiftkv_config, write_model_folder
from ..peaks import matmul_peak
from ..plots import figure
from ..results import MoePrefillResults
from ..settings import setting
from ..vllm.engine import engine_kwargs, kv_cache_tokens
from ..vllm.env import configure_cpu_env, engine_core_in_process
from .offline import KV_AUTO, BenchSettings, PromptMaker, Worker, Workloads, engine_settings, measure


@dataclass
class MoeShape:
    """The random model's shape (Qwen3-30B-A3B's layer; layers and experts chosen to fit) and the workload."""

    layers: int = setting(
        16, "decoder layers (Qwen3-30B-A3B has 48); the student's N is half", flag="--moe-layers"
    )
    experts: int = setting(
        32,
        "experts per layer (Qwen3-30B-A3B has 128; 8 run per token whatever the count)",
        flag="--moe-experts",
    )
    prompts: int = setting(4, "prompts per prefill batch", flag="--moe-prompts")
    prompt_len: int = setting(2000, "tokens per prompt", flag="--moe-prompt-len")
    repeats: int = setting(3, "timed prefill batches per model, interleaved", flag="--moe-repeats")
    one_at_a_time: bool = setting(
        False,
        "one engine alive at a time (for shapes whose two engines do not fit together): each timed batch starts "
        "its model's engine afresh, warms it up, times it and closes it, alternating the models",
        flag="--moe-one-at-a-time",
    )
    hidden_size: int = setting(2048, "", cli=False)
    num_attention_heads: int = setting(32, "", cli=False)
    num_key_value_heads: int = setting(4, "", cli=False)
    head_dim: int = setting(128, "", cli=False)
    moe_intermediate_size: int = setting(768, "", cli=False)
    num_experts_per_tok: int = setting(8, "", cli=False)
    vocab_size: int = setting(32768, "", cli=False)

    def check(self) -> None:
        """Refuse, before any engine starts, a shape vLLM's CPU MoE or SwiftKV at N = L / 2 cannot run (the
        plugin's own check of the hidden size, which its engine hook runs later)."""
        from ..vllm.hooks import check_cpu_moe_shape  # imports vLLM

        check_cpu_moe_shape(self.teacher_config())
        if self.layers < 2 or not 1 <= self.num_experts_per_tok <= self.experts:
            raise ValueError(
                f"--moe-layers {self.layers}, --moe-experts {self.experts}: expected at least 2 layers and at least "
                f"{self.num_experts_per_tok} experts (the experts each token runs)"
            )
        if min(self.prompts, self.prompt_len, self.repeats) < 1:
            raise ValueError("--moe-prompts, --moe-prompt-len and --moe-repeats must be at least 1")

    def teacher_config(self) -> Qwen3MoeConfig:
        config = Qwen3MoeConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.num_experts_per_tok
            * self.moe_intermediate_size,  # unused: every layer is sparse
            moe_intermediate_size=self.moe_intermediate_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            num_experts=self.experts,
            num_experts_per_tok=self.num_experts_per_tok,
            norm_topk_prob=True,
            max_position_embeddings=max(4096, self.prompt_len + 16),
            tie_word_embeddings=False,
        )
        config.architectures = ["Qwen3MoeForCausalLM"]
        return config

    def student_config(self):
        config = swiftkv_config(self.teacher_config(), self.layers // 2, 1)
        config.architectures = ["Qwen3MoeSwiftKVForCausalLM"]
        return config

    def kv_cache_bytes(self, dtype_bytes: int, max_model_len: int) -> int:
        """KV-cache memory for one prefill batch of the teacher (every layer's K and V for every prompt token; at
        least one sequence of `max_model_len`, which vLLM requires), a quarter more for the blocks' rounding; the
        offline bench's 2 GiB each would take host memory from the weights."""
        per_token = self.layers * 2 * self.num_key_value_heads * self.head_dim * dtype_bytes
        return int(1.25 * max(self.prompts * (self.prompt_len + 16), max_model_len) * per_token)

    @classmethod
    def quick(cls) -> MoeShape:
        """A few seconds per engine: for tests and smoke runs, not for numbers."""
        return cls(
            layers=4,
            experts=4,
            prompts=2,
            prompt_len=128,
            repeats=2,
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            moe_intermediate_size=64,
            num_experts_per_tok=2,
            vocab_size=512,
        )


def config_folder(config, folder: Path) -> Path:
    """A model folder holding only `config` (vLLM draws the weights; no tokenizer: the prompts are token ids)."""
    return write_model_folder(folder, config.save_pretrained, force=True)


def weight_bytes(config, dtype_bytes: int) -> int:
    """Bytes of the teacher's weights in the engines' dtype (embedding, lm_head, attention, routers, experts)."""
    hidden, head = config.hidden_size, config.head_dim
    attention = hidden * head * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    experts = config.num_experts * 3 * hidden * config.moe_intermediate_size + config.num_experts * hidden
    return dtype_bytes * (2 * config.vocab_size * hidden + config.num_hidden_layers * (attention + experts))


def moe_worker_loop(connection, model: str, settings: dict, workloads: dict) -> None:
    """`offline.worker_loop` with the engine core in this process, each reply carrying its peak RSS (MiB)."""
    configure_cpu_env()
    from vllm import LLM

    started = time.perf_counter()
    with engine_core_in_process():
        llm = LLM(**engine_kwargs(model, **settings))
    config = llm.llm_engine.vllm_config.model_config.hf_config
    connection.send(
        {
            "engine_startup_s": time.perf_counter() - started,
            "kv_cache_tokens": kv_cache_tokens(llm),
            "architecture": type(config).__name__,
            "fast_prefill": llm.llm_engine.vllm_config.cache_config.kv_sharing_fast_prefill,
            "peak_rss_mib": peak_mib(),
        }
    )
    make, w = PromptMaker(config.vocab_size), Workloads(**workloads)
    while (name := connection.recv()) is not None:
        connection.send({**measure(llm, make, w, name), "peak_rss_mib": peak_mib()})


def interleaved_prefills(workers: list[Worker], repeats: int) -> list[list[float]]:
    """A warm-up, then `repeats` prefill batches on each engine, alternating engines and who goes first;
    per engine its tok/s of each batch."""
    rates: list[list[float]] = [[] for _ in workers]
    for step in range(repeats + 1):
        for i in alternating(len(workers), step):
            measured = workers[i].run("warmup" if step == 0 else "prefill")
            workers[i].facts["peak_rss_mib"] = measured["peak_rss_mib"]
            if step:
                rates[i].append(measured["prefill_tok_s"])
    return rates


def one_engine_at_a_time(folders: dict[str, Path], engine: dict, workloads: Workloads, repeats: int):
    """`repeats` rounds, alternating who goes first; in each, every model's engine starts afresh, warms up, times
    one prefill batch and closes. Returns per model its facts (the largest peak RSS, the mean startup) and
    its tok/s of each batch."""
    facts: list[dict] = [{} for _ in folders]
    rates: list[list[float]] = [[] for _ in folders]
    labels = list(folders)
    for step in range(repeats):
        for i in alternating(len(labels), step):
            worker = Worker(labels[i], str(folders[labels[i]]), engine, workloads, loop=moe_worker_loop)
            try:
                worker.run("warmup")
                measured = worker.run("prefill")
            finally:
                worker.close()
            startups = facts[i].get("startups", []) + [worker.facts["engine_startup_s"]]
            peak = max(facts[i].get("peak_rss_mib", 0), measured["peak_rss_mib"])
            facts[i] = {**worker.facts, "startups": startups, "peak_rss_mib": peak}
            rates[i].append(measured["prefill_tok_s"])
    for fact in facts:
        fact["engine_startup_s"] = statistics.mean(fact.pop("startups"))
    return facts, rates


def alternating(count: int, step: int) -> list[int]:
    """0..count-1 on even steps, backwards on odd ones: who goes first alternates."""
    return list(range(count))[:: 1 if step % 2 == 0 else -1]


def both_engines_alive(folders: dict[str, Path], engine: dict, workloads: Workloads, repeats: int):
    """Both engines started once and kept; `interleaved_prefills` on them. Returns (facts, rates) per model."""
    workers = []
    try:
        for label, folder in folders.items():
            workers.append(Worker(label, str(folder), engine, workloads, loop=moe_worker_loop))
        rates = interleaved_prefills(workers, repeats)
    finally:
        for worker in workers:
            worker.close()
    return [w.facts for w in workers], rates


def engine_result(facts: dict, rates: list[float], flops: float, peak: float) -> dict:
    median = statistics.median(rates)
    return {
        **facts,
        "prefill_tok_s_runs": rates,
        "prefill_tok_s": median,
        "flops_per_token": flops,
        "prefill_utilization": median * flops / peak,
    }


def moe_bench(settings: BenchSettings, shape: MoeShape) -> MoePrefillResults:
    """Both random models on vLLM with identical engine settings (their config-only folders in a temporary
    folder); writes bench-moe.json and bench-moe.png to `settings.out` and returns the report."""
    shape.check()
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = resolve_dtype(settings.dtype)
    print(f"[bench] {describe_choice(settings.dtype)}", file=sys.stderr, flush=True)
    if settings.kv_cache_memory == KV_AUTO:
        kv_bytes = shape.kv_cache_bytes(dtype.itemsize, settings.max_model_len)
        settings = replace(settings, kv_cache_memory=str(kv_bytes))
    engine = {**engine_settings(settings), "load_format": "dummy", "skip_tokenizer_init": True}
    workloads = replace(Workloads(), prefill_prompts=shape.prompts, prefill_len=shape.prompt_len)
    peak = matmul_peak(dtype)
    run = one_engine_at_a_time if shape.one_at_a_time else both_engines_alive
    with tempfile.TemporaryDirectory(prefix="swiftkv-bench-moe-") as root:
        folders = {
            "baseline": config_folder(shape.teacher_config(), Path(root) / "teacher"),
            "SwiftKV": config_folder(shape.student_config(), Path(root) / "swiftkv"),
        }
        facts, rates = run(folders, engine, workloads, shape.repeats)
    report = moe_report(shape, engine, peak, dtype.itemsize, facts, rates)
    write_atomic(out / "bench-moe.json", json.dumps(report, indent=2))
    results = MoePrefillResults.from_json(report)
    plot(results, out / "bench-moe.png")
    return results


def moe_report(
    shape: MoeShape, engine: dict, peak: float, dtype_bytes: int, facts: list, rates: list
) -> dict:
    """bench-moe.json (`MoePrefillResults`) of the measured facts and prefill rates (teacher first)."""
    teacher, student = shape.teacher_config(), shape.student_config()
    flops = [prefill_flops_per_token(c, shape.prompt_len) for c in (teacher, student)]
    base, swift = (engine_result(*each, peak) for each in zip(facts, rates, flops, strict=True))
    ratio, bound = swift["prefill_tok_s"] / base["prefill_tok_s"], flops[0] / flops[1]
    return {
        "shape": asdict(shape),
        "num_key_value_layers": student.num_key_value_layers,
        "weight_bytes": weight_bytes(teacher, dtype_bytes),
        "settings": engine,
        "peak_flops": peak,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "baseline": base,
        "swiftkv": swift,
        "prefill_ratio": ratio,
        "flop_bound": bound,
        "fraction_of_bound": ratio / bound,
    }


def format_table(report: MoePrefillResults) -> str:
    s, base, swift = report.shape, report.baseline, report.swiftkv
    rows = [
        f"Qwen3-MoE shape: {s['layers']} layers, {s['experts']} experts ({s['num_experts_per_tok']} per token, "
        f"{s['moe_intermediate_size']} wide), hidden {s['hidden_size']}, N = {report.num_key_value_layers}; "
        f"weights {report.weight_bytes / 2**30:.1f} GiB per engine; {report.settings['dtype']}",
        f"{'':<28}{'baseline':>12}{'SwiftKV':>12}",
        f"{'prefill (tok/s, median)':<28}{base.prefill_tok_s:>12.4g}{swift.prefill_tok_s:>12.4g}",
        f"{'FLOPs per prompt token (M)':<28}{base.flops_per_token / 1e6:>12.0f}{swift.flops_per_token / 1e6:>12.0f}",
        f"{'prefill utilization':<28}{base.prefill_utilization:>12.3f}{swift.prefill_utilization:>12.3f}",
        f"{'peak RSS (GiB)':<28}{base.peak_rss_mib / 1024:>12.1f}{swift.peak_rss_mib / 1024:>12.1f}",
        f"prefill ratio {report.prefill_ratio:.3f}x, FLOP bound {report.flop_bound:.3f}x: "
        f"{report.fraction_of_bound:.1%} of the bound; matmul peak {report.peak_flops / 1e9:.0f} GFLOP/s",
    ]
    return "\n".join(rows)


def plot(report: MoePrefillResults, path: Path) -> None:
    """Each engine's prefill batches (tok/s), and the ratio of the medians beside its FLOP bound."""
    with figure(path, (10, 4), ncols=2, dpi=120) as (_, (runs, ratio)):
        for label, result in (("baseline", report.baseline), ("SwiftKV", report.swiftkv)):
            runs.plot(
                range(1, len(result.prefill_tok_s_runs) + 1), result.prefill_tok_s_runs, "o-", label=label
            )
        runs.set_xticks(range(1, len(report.baseline.prefill_tok_s_runs) + 1))
        runs.set_xlabel("prefill batch (interleaved)")
        runs.set_ylabel("prompt tokens/s")
        runs.set_ylim(bottom=0)
        runs.legend()
        ratio.bar(
            ["measured", "FLOP bound"], [report.prefill_ratio, report.flop_bound], color=["tab:blue", "gray"]
        )
        ratio.axhline(1.0, color="black", linewidth=0.8)
        ratio.set_ylabel("SwiftKV / baseline prefill")
        s = report.shape
        ratio.set_title(f"{report.fraction_of_bound:.0%} of the bound", fontsize=10)
        runs.set_title(
            f"Qwen3-MoE shape, {s['layers']} layers x {s['experts']} experts, N = {report.num_key_value_layers}, "
            f"{report.settings['dtype']}",
            fontsize=10,
        )
