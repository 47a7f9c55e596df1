"""Who sizes the KV cache of the engines swiftkv starts (serve, bench, the replies stage): the user when they
give a size; on CUDA otherwise vLLM (gpu_memory_utilization of the GPU); on vLLM's CPU build otherwise a
fixed 2 GiB, since that build's own default is a fraction of the host's RAM. The decision is a pure function
of the platform and the user's options, tested here on both platforms' inputs; the CPU engines themselves
run with it in the vLLM tests."""

import pytest

from swiftkv.bench.offline import BenchSettings, engine_settings
from swiftkv.bench.online_server import server_args
from swiftkv.vllm.engine import KV_CACHE_BYTES, kv_cache_bytes
from swiftkv.vllm.serve import serve_command, vllm_server_launcher


@pytest.mark.parametrize(
    ("on_cuda", "requested", "sized_otherwise", "expected"),
    [
        (True, None, False, None),  # CUDA, nothing given: vLLM's own sizing
        (False, None, False, KV_CACHE_BYTES),  # CPU build, nothing given: 2 GiB, not a share of RAM
        (True, 3 * 2**30, False, 3 * 2**30),  # the user's size, on either platform
        (False, 2**28, False, 2**28),
        (True, None, True, None),  # --gpu-memory-utilization given: nothing added
        (False, None, True, None),
    ],
)
def test_the_kv_size_is_the_users_else_vllms_on_cuda_else_two_gib(
    on_cuda, requested, sized_otherwise, expected
):
    assert kv_cache_bytes(on_cuda, requested, sized_otherwise) == expected
    assert KV_CACHE_BYTES == 2 * 2**30


def kv_option(command: list[str]) -> str | None:
    return (
        command[command.index("--kv-cache-memory-bytes") + 1]
        if "--kv-cache-memory-bytes" in command
        else None
    )


def test_serve_adds_the_cpu_size_only_on_the_cpu_build_and_never_over_the_users():
    launcher = vllm_server_launcher()
    assert kv_option(serve_command("/m", "m", [], on_cuda=True)) is None
    assert kv_option(serve_command("/m", "m", [], on_cuda=False)) == str(KV_CACHE_BYTES)
    for on_cuda in (True, False):
        theirs = serve_command("/m", "m", ["--gpu-memory-utilization", "0.8"], on_cuda=on_cuda)
        assert kv_option(theirs) is None and theirs[: len(launcher) + 1] == [*launcher, "/m"]
        given = serve_command("/m", "m", ["--kv-cache-memory-bytes=1000"], on_cuda=on_cuda)
        assert kv_option(given) is None and given[-1] == "--kv-cache-memory-bytes=1000"  # passed unchanged


def test_bench_engines_and_servers_follow_the_same_decision():
    auto = BenchSettings(model="m", baseline="b")
    assert auto.kv_cache_memory == "auto"
    on_gpu, on_cpu = engine_settings(auto, on_cuda=True), engine_settings(auto, on_cuda=False)
    assert "kv_cache_memory_bytes" not in on_gpu and on_cpu["kv_cache_memory_bytes"] == KV_CACHE_BYTES
    # on one GPU the offline bench's two engines are alive at once: each asks vLLM for half its default share
    assert on_gpu["gpu_memory_utilization"] == 0.45 and "gpu_memory_utilization" not in on_cpu
    given = BenchSettings(model="m", baseline="b", kv_cache_memory="512M")
    assert engine_settings(given, on_cuda=True)["kv_cache_memory_bytes"] == 512 * 2**20
    gpu_args = server_args(on_gpu, 8000, "m")  # the online bench's servers alike
    assert kv_option(gpu_args) is None and gpu_args[gpu_args.index("--gpu-memory-utilization") + 1] == "0.45"
    assert kv_option(server_args(on_cpu, 8000, "m")) == str(KV_CACHE_BYTES)
    memory = ("kv_cache_memory_bytes", "gpu_memory_utilization")
    assert {k: v for k, v in on_gpu.items() if k not in memory} == {
        k: v for k, v in on_cpu.items() if k not in memory
    }
