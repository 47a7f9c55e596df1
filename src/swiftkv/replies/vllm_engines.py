"""Greedy replies on vLLM, streamed: one engine is handed every pending prompt at once and gives each reply
back as it finishes, so continuous batching keeps the devices full and nothing waits for a batch's longest
reply. `--data-parallel-size K` runs K such engines in K processes, each on its own devices, over
interleaved shards of the prompts: vLLM's offline `LLM` runs one data-parallel rank per process, so the
processes are ours. A greedy reply does not depend on which engine wrote it or on what ran beside it (up
to the numerics of the batch), so K engines write what one does."""

from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.tokens import MAX_PROMPT_TOKENS, Reply
from ..sources import read_config_dict
from ..vllm.engine import engine_kwargs, kv_cache_bytes
from ..vllm.env import configure_cpu_env, thread_binding

Stream = Callable[[list[list[int]]], Iterator[tuple[int, Reply]]]  # prompts -> (index, reply), as they finish


@dataclass(frozen=True)
class EngineSpec:
    """What a replies engine runs: the writer's folder, the reply budget and the engine's shape."""

    folder: str
    max_tokens: int
    dtype: str
    eos_token_id: int
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    tensor_parallel_size: int = 1
    enforce_eager: bool = False


def start_engine(spec: EngineSpec):
    """A vLLM engine for the writer: its KV cache sized by vLLM on CUDA, KV_CACHE_BYTES on the CPU build
    (`engine.kv_cache_bytes`); tensor parallel ranks as worker processes (the CPU build's only way)."""
    from vllm import LLM

    configure_cpu_env(ranks=spec.tensor_parallel_size)
    window = read_config_dict(Path(spec.folder)).get(
        "max_position_embeddings", spec.max_prompt_tokens + spec.max_tokens
    )
    kv_bytes = kv_cache_bytes(torch.cuda.is_available())
    parallel = (
        {"tensor_parallel_size": spec.tensor_parallel_size, "distributed_executor_backend": "mp"}
        if spec.tensor_parallel_size > 1
        else {}
    )
    return LLM(
        **engine_kwargs(
            spec.folder,
            dtype=spec.dtype,
            max_model_len=min(window, spec.max_prompt_tokens + spec.max_tokens),
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            enforce_eager=spec.enforce_eager,
            **({} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}),
            **parallel,
        )
    )


def engine_replies(llm, prompts: list[list[int]], spec: EngineSpec) -> Iterator[tuple[int, Reply]]:
    """Every prompt queued on the engine at once, each reply yielded when it finishes (`LLMEngine`'s
    add_request/step loop, what `LLM.generate` runs before it sorts its outputs)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, stop_token_ids=[spec.eos_token_id])
    engine = llm.llm_engine
    for index, ids in enumerate(prompts):
        engine.add_request(str(index), TokensPrompt(prompt_token_ids=ids), params)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                yield int(output.request_id), reply_of(output.outputs[0], spec.eos_token_id)


def reply_of(completion, eos_token_id: int) -> Reply:
    ids = list(completion.token_ids)
    finished = completion.finish_reason == "stop"
    if finished and (not ids or ids[-1] != eos_token_id):
        ids.append(eos_token_id)  # the student must learn where the teacher stops
    return Reply(ids, finished)


class EngineWriter:
    """One engine in this process, started on the first prompts."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.llm = None

    def stream(self, prompts: list[list[int]]) -> Iterator[tuple[int, Reply]]:
        if self.llm is None:
            self.llm = start_engine(self.spec)
        yield from engine_replies(self.llm, prompts, self.spec)

    def __call__(self, prompts: list[list[int]]) -> list[Reply]:
        return in_order(self.stream, prompts)

    def close(self) -> None:
        """Stop the engine's processes now: a multiprocessing child exits without the exit hooks that would."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
        self.llm = None


def in_order(stream: Stream, prompts: list[list[int]]) -> list[Reply]:
    """A stream's replies in the prompts' order."""
    replies = dict(stream(prompts))
    return [replies[index] for index in range(len(prompts))]


# --------------------------------------------------------------------------------------------------
# K engines in K processes
# --------------------------------------------------------------------------------------------------


def available_devices(on_cuda: bool) -> tuple[int, str]:
    """How many devices engines may take here, and what they are: GPUs, or cores on vLLM's CPU build."""
    if on_cuda:
        return torch.cuda.device_count(), "GPUs"
    return len(os.sched_getaffinity(0)), "CPU cores"


def check_devices(data_parallel_size: int, tensor_parallel_size: int, on_cuda: bool) -> None:
    """K engines of T ranks take K x T devices: refused before anything starts when they are not here."""
    have, kind = available_devices(on_cuda)
    need = data_parallel_size * tensor_parallel_size
    if need > have:
        raise ValueError(
            f"--data-parallel-size {data_parallel_size} x --tensor-parallel-size {tensor_parallel_size} needs "
            f"{need} {kind}, one per rank; this machine has {have}: expected at most {have} engine ranks"
        )


def engine_environ(rank: int, engines: int, tensor_parallel_size: int, on_cuda: bool) -> dict[str, str]:
    """The devices of engine `rank` of `engines`: its own slice of the visible GPUs, or of this process's
    CPUs (split again between its tensor-parallel ranks)."""
    if on_cuda:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(d) for d in range(torch.cuda.device_count())]
        mine = devices[rank * tensor_parallel_size : (rank + 1) * tensor_parallel_size]
        return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // engines
    return {
        "VLLM_CPU_OMP_THREADS_BIND": thread_binding(
            cpus[rank * share : (rank + 1) * share], tensor_parallel_size
        )
    }


def engine_process(spec: EngineSpec, environ: dict[str, str], inbox, outbox, rank: int) -> None:
    """One engine's process: for each shard of (index, prompt) pairs, its replies as they finish, then a
    None; an error is sent back as its traceback."""
    os.environ.update(environ)
    writer = EngineWriter(spec)
    try:
        while (shard := inbox.get()) is not None:
            indices = [index for index, _ in shard]
            for k, reply in writer.stream([prompt for _, prompt in shard]):
                outbox.put((rank, indices[k], reply.ids, reply.finished))
            outbox.put((rank, None, None, None))
    except BaseException:
        outbox.put((rank, "error", traceback.format_exc(), None))
        raise
    finally:
        writer.close()


class DataParallelWriter:
    """K engines in K processes (started on the first prompts, kept for the next), each given every K-th
    prompt; their replies come back as they finish."""

    def __init__(self, spec: EngineSpec, engines: int):
        self.spec = spec
        self.engines = engines
        self.processes = []

    def start(self) -> None:
        # spawn: a fresh interpreter, whose devices are set before vLLM loads
        context = multiprocessing.get_context("spawn")
        self.outbox = context.Queue()
        on_cuda = torch.cuda.is_available()
        for rank in range(self.engines):
            inbox = context.Queue()
            environ = engine_environ(rank, self.engines, self.spec.tensor_parallel_size, on_cuda)
            process = context.Process(
                target=engine_process, args=(self.spec, environ, inbox, self.outbox, rank), daemon=False
            )
            process.start()
            self.processes.append((process, inbox))

    def stream(self, prompts: list[list[int]]) -> Iterator[tuple[int, Reply]]:
        if not self.processes:
            self.start()
        for rank, (_, inbox) in enumerate(self.processes):
            inbox.put([(index, prompts[index]) for index in range(rank, len(prompts), self.engines)])
        running = self.engines
        while running:
            rank, index, ids, finished = self.next_result()
            if index == "error":
                raise RuntimeError(f"data-parallel engine {rank} of {self.engines} failed:\n{ids}")
            if index is None:
                running -= 1
            else:
                yield index, Reply(ids, finished)

    def next_result(self) -> tuple:
        """The next reply of any engine; an engine process that died without saying why is an error."""
        while True:
            try:
                return self.outbox.get(timeout=10)
            except queue.Empty:
                for rank, (process, _) in enumerate(self.processes):
                    if not process.is_alive():
                        raise RuntimeError(
                            f"data-parallel engine {rank} of {self.engines} stopped (exit code {process.exitcode}) "
                            "before its replies were written; its log above says why"
                        ) from None

    def __call__(self, prompts: list[list[int]]) -> list[Reply]:
        return in_order(self.stream, prompts)

    def close(self) -> None:
        for _, inbox in self.processes:
            inbox.put(None)
        for process, _ in self.processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
        self.processes = []
