"""The two OpenAI servers of the online benchmark, one at a time: their command lines (the same
options for both; only SwiftKV's goes through `swiftkv serve`, which adds --kv-sharing-fast-prefill)
and their lifecycle (start on a free port, wait for /health, stop the whole process group)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ..vllm.env import configure_cpu_env
from ..vllm.serve import vllm_server_launcher

HOST = "127.0.0.1"


def server_args(engine: dict, port: int, served_name: str) -> list[str]:
    """vLLM server options from `swiftkv.bench.offline.engine_settings` (the offline bench's engine
    settings, so both benches run the models alike) plus the address."""
    args = [
        "--host",
        HOST,
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--seed",
        "0",
        "--dtype",
        engine["dtype"],
        "--max-model-len",
        str(engine["max_model_len"]),
        "--enable-prefix-caching" if engine["enable_prefix_caching"] else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]  # one log line per request is noise at high rates
    if "kv_cache_memory_bytes" in engine:  # absent on CUDA unless given: vLLM sizes the cache
        args += ["--kv-cache-memory-bytes", str(engine["kv_cache_memory_bytes"])]
    else:
        args += ["--gpu-memory-utilization", str(engine["gpu_memory_utilization"])]
    return args + (["--enforce-eager"] if engine["enforce_eager"] else [])


def speculative_args(config: dict | None) -> list[str]:
    """The server option of a speculative config (vLLM's own JSON, so `vllm serve` and `swiftkv serve`
    read it alike); none without one."""
    return [] if config is None else ["--speculative-config", json.dumps(config)]


def baseline_command(folder: str, args: list[str]) -> list[str]:
    """Plain vLLM serving the teacher: no --kv-sharing-fast-prefill (every prompt token runs every layer)."""
    return [*vllm_server_launcher(), folder, *args]


def swiftkv_command(folder: str, args: list[str]) -> list[str]:
    """SwiftKV as users serve it: `swiftkv serve` with the same options."""
    return [sys.executable, "-m", "swiftkv.cli", "serve", folder, *args]


def server_env() -> dict[str, str]:
    """The environment of both servers: `swiftkv serve` sets the CPU environment for itself; the
    baseline gets the same values here, so neither reserves a core or binds differently."""
    env = dict(os.environ)
    configure_cpu_env(env)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


def wait_healthy(base_url: str, process: subprocess.Popen, timeout: float, log_path: Path) -> float:
    """Seconds until /health answers 200; raises with the log's tail if the server exits or times out."""
    started = time.perf_counter()
    while not healthy(base_url):
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with code {process.returncode} before it was healthy; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        if time.perf_counter() - started > timeout:
            raise RuntimeError(
                f"server not healthy after {timeout:.0f} s; log {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(1)
    return time.perf_counter() - started


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def stop_server(process: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM to the server's process group (API server, engine core, workers), SIGKILL to what
    is left after `grace` seconds. The group is the one `start_new_session` made for this server."""
    pgid = process.pid
    signal_group(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        signal_group(pgid, signal.SIGKILL)
        process.wait()
    deadline = time.perf_counter() + grace  # the engine core may outlive the API server briefly
    while group_alive(pgid) and time.perf_counter() < deadline:
        time.sleep(0.5)
    if group_alive(pgid):
        signal_group(pgid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(
    command: list[str], env: dict[str, str], base_url: str, log_path: Path, timeout: float
) -> Iterator[float]:
    """Start `command` (output to `log_path`) in its own process group, yield the seconds it took to
    become healthy, and stop it however the block ends."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            yield wait_healthy(base_url, process, timeout, log_path)
        finally:
            stop_server(process)
