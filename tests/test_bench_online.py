"""`swiftkv bench --online`: our rows from vLLM's benchmark results (fabricated result dicts with
known numbers), the SLO and the highest rate within it, the session order, prompts, server commands
and process-group shutdown, the CLI options, vLLM's benchmark client (its signature, the version gate,
the seeded schedule, a fake streaming server), the report; and one end-to-end `--quick` run with two
real vLLM servers on a tiny checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from swiftkv.bench.online_metrics import (
    SLO,
    choose_slo,
    compare,
    default_rates,
    idle_latency,
    max_sustained_rate,
    rate_row,
)

# -- metrics ---------------------------------------------------------------------------------------


def vllm_result(ttft_ms: float, tpot_ms: float, output_len: int = 11, requests: int = 4, **changes) -> dict:
    """A result dict as vLLM's `benchmark` returns it (its keys, times in ms as numpy floats, as its
    np.percentile gives them), every request alike; `changes` overrides any key."""
    duration, latency_ms = 5.0, ttft_ms + (output_len - 1) * tpot_ms
    result = {
        "duration": duration,
        "completed": requests,
        "failed": 0,
        "request_throughput": requests / duration,
        "request_goodput": requests / duration,
        "output_throughput": requests * output_len / duration,
        "total_token_throughput": requests * (100 + output_len) / duration,
        "output_lens": [output_len] * requests,
        "errors": [""] * requests,
    }
    for name, value in (("ttft", ttft_ms), ("tpot", tpot_ms), ("itl", tpot_ms), ("e2el", latency_ms)):
        for stat in ("mean", "median", "p50", "p99"):
            result[f"{stat}_{name}_ms"] = value
    return {k: np.float64(v) if k.endswith("_ms") else v for k, v in {**result, **changes}.items()}


def test_rate_row_takes_vllms_numbers_in_seconds():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    result = vllm_result(
        500,
        50,
        output_len=8,
        mean_ttft_ms=700.0,
        p50_ttft_ms=600.0,
        p99_ttft_ms=1500.0,
        p50_tpot_ms=40.0,
        p99_tpot_ms=80.0,
        p99_itl_ms=95.0,
        mean_e2el_ms=1200.0,
        p99_e2el_ms=2100.0,
        request_goodput=0.3,
    )
    row = rate_row(result, 0.5, 8, slo, speculating=False)
    assert row["rate"] == 0.5 and row["completed"] == 4 and row["failed"] == 0 and row["errors"] == []
    assert (row["duration_s"], row["request_throughput"], row["goodput"]) == (5.0, 0.8, 0.3)
    assert row["output_throughput"] == pytest.approx(4 * 8 / 5)
    assert (row["ttft_mean_s"], row["ttft_p50_s"], row["ttft_p99_s"]) == pytest.approx((0.7, 0.6, 1.5))
    assert (row["tpot_mean_s"], row["tpot_p50_s"], row["tpot_p99_s"]) == pytest.approx((0.05, 0.04, 0.08))
    assert (row["itl_p50_s"], row["itl_p99_s"]) == pytest.approx((0.05, 0.095))
    assert (row["latency_mean_s"], row["latency_p99_s"]) == pytest.approx((1.2, 2.1))  # vLLM's E2EL
    assert not row["meets_slo"] and row["speculative"] is None  # p99 TTFT 1.5 s > 1 s
    assert json.loads(json.dumps(row))["ttft_p99_s"] == 1.5  # plain Python numbers, as online.json needs
    assert rate_row({**result, "p99_ttft_ms": 900.0}, 0.5, 8, slo, False)["meets_slo"]
    assert not rate_row({**result, "p99_tpot_ms": 101.0}, 0.5, 8, slo, False)["meets_slo"]


def test_a_request_of_the_wrong_length_or_an_error_fails_and_breaks_the_slo():
    result = vllm_result(
        500, 50, output_len=8, output_lens=[8, 7, 0, 8], errors=["", "", "HTTP 500: boom", ""], completed=3
    )
    row = rate_row(result, 1.0, 8, SLO(1.0, 0.1), speculating=False)
    assert row["completed"] == 2 and row["failed"] == 2  # vLLM counted the 7-token request as a success
    assert row["errors"] == ["HTTP 500: boom", "made 7 tokens, expected 8"]
    assert row["ttft_p99_s"] == pytest.approx(0.5) and not row["meets_slo"]


def test_a_rate_where_no_request_succeeded_has_no_latencies():
    result = vllm_result(
        0, 0, output_len=8, requests=2, output_lens=[0, 0], errors=["refused"] * 2, completed=0
    )
    row = rate_row(result, 1.0, 8, SLO(1.0, 0.1), speculating=False)
    assert row["failed"] == 2 and row["errors"] == ["refused"] and not row["meets_slo"]
    assert math.isnan(row["ttft_p99_s"]) and math.isnan(row["tpot_p50_s"])  # vLLM's 0 ms is no answer


def test_idle_latency_is_vllms_medians_and_needs_every_request():
    result = vllm_result(
        500, 50, output_len=8, requests=3, median_ttft_ms=400.0, median_tpot_ms=30.0, median_e2el_ms=610.0
    )
    assert json.dumps(idle_latency(result, 8))
    assert idle_latency(result, 8) == pytest.approx(
        {"ttft_s": 0.4, "tpot_s": 0.03, "latency_s": 0.61, "requests": 3}
    )
    with pytest.raises(RuntimeError, match="idle server failed: made 7 tokens, expected 8"):
        idle_latency({**result, "output_lens": [8, 7, 8]}, 8)


def test_the_slo_is_vllms_goodput_config_in_milliseconds():
    assert SLO(1.5, 0.2).goodput_config() == pytest.approx({"ttft": 1500.0, "tpot": 200.0})


@pytest.mark.parametrize(
    ("meets", "expected"),
    [
        ([True, True, True, True], 4.0),
        ([True, True, False, False], 2.0),
        ([True, False, True, True], 1.0),  # a pass above a failure is noise, not capacity
        ([False, True, True, True], None),
    ],
)
def test_max_sustained_rate(meets, expected):
    assert max_sustained_rate([1.0, 2.0, 3.0, 4.0], meets) == expected
    assert (
        max_sustained_rate([4.0, 3.0, 2.0, 1.0], meets[::-1]) == expected
    )  # order of the input is irrelevant


def test_default_rates_are_multiples_of_the_prefill_bound_capacity():
    assert default_rates(idle_ttft=4.0, multipliers=(2.0, 0.5, 1.0)) == [0.125, 0.25, 0.5]


def test_slo_from_factors_or_explicit_bounds():
    slo = choose_slo(idle_ttft=2.0, idle_tpot=0.05, ttft_s=0.0, ttft_factor=3.0, tpot_s=0.0, tpot_factor=4.0)
    assert (slo.ttft_s, slo.tpot_s) == (6.0, pytest.approx(0.2))
    assert "3 x baseline idle TTFT" in slo.how
    slo = choose_slo(idle_ttft=2.0, idle_tpot=0.05, ttft_s=1.5, ttft_factor=3.0, tpot_s=0.3, tpot_factor=4.0)
    assert (slo.ttft_s, slo.tpot_s) == (1.5, 0.3) and "given" in slo.how


def row(ttft_p99: float, tpot_p50: float, meets: bool) -> dict:
    return {"ttft_p99_s": ttft_p99, "tpot_p50_s": tpot_p50, "meets_slo": meets, "goodput": 1.0}


def test_compare_gives_sustained_rates_their_ratio_and_tpot_at_saturation():
    rates = [1.0, 2.0, 3.0]
    baseline = [row(1.0, 0.10, True), row(2.0, 0.20, True), row(9.0, 0.40, False)]
    swiftkv = [row(0.5, 0.08, True), row(1.0, 0.10, True), row(2.0, 0.20, True)]
    summary = compare(rates, baseline, swiftkv)
    assert summary["max_rate"] == {"baseline": 2.0, "swiftkv": 3.0}
    assert summary["max_rate_is_lower_bound"] == {"baseline": False, "swiftkv": True}
    assert summary["max_rate_ratio"] == pytest.approx(1.5)
    assert summary["baseline_saturation_rate"] == 2.0
    assert summary["tpot_p50_ratio_at_saturation"] == pytest.approx(0.5)
    assert [r["ttft_p99_ratio"] for r in summary["per_rate"]] == pytest.approx([0.5, 0.5, 2 / 9])


def test_compare_when_the_baseline_sustains_no_rate():
    summary = compare([1.0], [row(9.0, 0.4, False)], [row(1.0, 0.1, True)])
    assert summary["max_rate_ratio"] is None and summary["tpot_p50_ratio_at_saturation"] is None


# -- schedule, prompts, JSON -----------------------------------------------------------------------


def test_sessions_alternate_who_goes_first_and_share_a_server_back_to_back():
    from swiftkv.bench.online import sessions

    assert sessions(3) == [("baseline", [0]), ("swiftkv", [0, 1]), ("baseline", [1, 2]), ("swiftkv", [2])]
    for count in (1, 2, 5):
        pairs = [(model, i) for model, indices in sessions(count) for i in indices]
        assert sorted(pairs) == sorted((m, i) for m in ("baseline", "swiftkv") for i in range(count))
        assert sessions(count)[0][0] == "baseline"  # its idle server sets the rates and the SLO


def test_token_prompts_have_the_exact_length_and_start_with_a_new_text():
    from swiftkv.bench.online_prompts import token_prompts

    texts = ["a b c", "d e", "f g h i j k", "l", "m n o p"]
    vocab = {w: i for i, w in enumerate("abcdefghijklmnop")}

    def encode(text):
        return [vocab[w] for w in text.split()]

    prompts = token_prompts(iter(texts), encode, count=2, length=4)
    assert prompts == [[0, 1, 2, 3], [5, 6, 7, 8]]
    with pytest.raises(ValueError, match="only 3 prompts"):
        token_prompts(iter(texts), encode, count=4, length=3)


def test_json_ready_turns_non_finite_numbers_into_null():
    from swiftkv.bench.online import json_ready

    report = {"a": [1.0, math.nan], "b": {"c": math.inf, "d": "x"}, "e": (2, 3)}
    assert json.loads(json.dumps(json_ready(report), allow_nan=False)) == {
        "a": [1.0, None],
        "b": {"c": None, "d": "x"},
        "e": [2, 3],
    }


# -- servers ---------------------------------------------------------------------------------------


ENGINE = {
    "dtype": "float32",
    "max_model_len": 1024,
    "kv_cache_memory_bytes": 2**28,
    "enable_prefix_caching": False,
    "enforce_eager": True,
}


def test_server_commands_differ_only_in_fast_prefill():
    """Same options for both; only `swiftkv serve` adds --kv-sharing-fast-prefill (and nothing else:
    the dtype, memory and name are given, so none of its defaults applies)."""
    from swiftkv.bench.online_server import baseline_command, server_args, swiftkv_command
    from swiftkv.vllm.serve import serve_command, vllm_server_launcher

    args = server_args(ENGINE, 8123, "m")
    assert args[args.index("--dtype") + 1] == "float32"
    assert "--no-enable-prefix-caching" in args and "--enforce-eager" in args
    baseline = baseline_command("/teacher", args)
    assert baseline == [*vllm_server_launcher(), "/teacher", *args]
    assert "--kv-sharing-fast-prefill" not in baseline
    swiftkv = swiftkv_command("/skv", args)
    assert swiftkv[1:5] == ["-m", "swiftkv.cli", "serve", "/skv"] and swiftkv[5:] == args
    served = serve_command("/skv", "/skv", args)  # what `swiftkv serve` then runs
    assert served == [*vllm_server_launcher(), "/skv", "--kv-sharing-fast-prefill", *args]


def test_stop_server_ends_the_whole_process_group():
    from swiftkv.bench.online_server import group_alive, stop_server

    process = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    time.sleep(0.3)
    assert group_alive(process.pid)
    stop_server(process, grace=10)
    assert process.returncode is not None and not group_alive(process.pid)


def test_a_server_that_exits_early_fails_with_its_log(tmp_path):
    from swiftkv.bench.online_server import free_port, running_server

    command = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    with (
        pytest.raises(RuntimeError, match="(?s)code 3.*no such model"),
        running_server(command, dict(os.environ), f"http://127.0.0.1:{free_port()}", tmp_path / "s.log", 60),
    ):
        pass


# -- the client: vLLM's benchmark ------------------------------------------------------------------


PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


def test_the_client_calls_the_installed_vllms_benchmark_with_our_settings():
    from vllm.benchmarks import serve

    from swiftkv.bench.online_client import Target, benchmark_arguments, check_signature

    target = Target("http://127.0.0.1:1", "m", None, output_len=8)
    arguments = benchmark_arguments(serve, target, PROMPTS, 0.5, None, SLO(2.0, 0.1), False)
    check_signature(serve.benchmark, arguments)  # every name exists, nothing required is missing
    assert [(r.prompt, r.prompt_len, r.expected_output_len) for r in arguments["input_requests"]] == [
        (p, len(p), 8) for p in PROMPTS
    ]
    assert arguments["ignore_eos"] and arguments["extra_body"] == {"temperature": 0.0}
    assert (arguments["request_rate"], arguments["burstiness"]) == (0.5, 1.0)
    assert arguments["selected_percentiles"] == [50.0, 99.0]
    assert arguments["goodput_config_dict"] == pytest.approx({"ttft": 2000.0, "tpot": 100.0})


def test_a_changed_benchmark_signature_is_one_error_naming_the_parameter():
    from swiftkv.bench.online_client import check_signature

    def benchmark(task_type, request_rate, burstiness=1.0, **_ignored):
        pass

    check_signature(benchmark, {"task_type": 1, "request_rate": 2.0})
    with pytest.raises(RuntimeError, match=r"benchmark of vLLM \S+ has no parameter 'ignore_eos'"):
        check_signature(
            lambda task_type, request_rate: None, {"task_type": 1, "request_rate": 2, "ignore_eos": 1}
        )
    with pytest.raises(
        RuntimeError, match="requires the parameter 'request_rate', which swiftkv does not pass"
    ):
        check_signature(benchmark, {"task_type": 1})


def test_an_unsupported_vllm_is_our_error_before_its_benchmark_is_imported(monkeypatch):
    from swiftkv.bench.online_client import Target, run
    from swiftkv.vllm import versions

    monkeypatch.setattr(versions, "installed_vllm_version", lambda: "0.40.0")
    monkeypatch.delenv(versions.OVERRIDE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "vllm.benchmarks", None)  # importing it now is an ImportError
    with pytest.raises(
        ValueError, match=r"swiftkv supports vLLM 0\.26 to 0\.33\.x, and vLLM 0\.40\.0 is installed"
    ):
        run(Target("http://127.0.0.1:1", "m", None, 8), PROMPTS)


def test_the_same_seed_and_rate_give_the_same_schedule(monkeypatch):
    """vLLM's benchmark against a request function that answers at once, on a clock that only its
    sleeps advance: the sleeps between sends are the schedule."""
    import types

    from vllm.benchmarks import serve
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    from swiftkv.bench.online_client import Target, run

    clock, sleeps, real_sleep = [0.0], [], asyncio.sleep

    async def sleep(seconds):
        sleeps.append(seconds)
        clock[0] += seconds
        await real_sleep(0)

    async def answer(request_func_input, session, pbar=None):
        return RequestFuncOutput(success=True, output_tokens=8, ttft=0.1, latency=0.8, start_time=clock[0])

    async def no_counters(base_url, session):
        return None

    monkeypatch.setitem(serve.ASYNC_REQUEST_FUNCS, "openai", answer)
    monkeypatch.setattr(serve, "fetch_spec_decode_metrics", no_counters)
    monkeypatch.setattr(serve, "fetch_diffusion_metrics", no_counters)
    monkeypatch.setattr(
        serve, "time", types.SimpleNamespace(time=lambda: clock[0], perf_counter=time.perf_counter)
    )
    monkeypatch.setattr(serve, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": sleep}))
    target = Target("http://127.0.0.1:1", "m", None, output_len=8)

    def schedule(seed: int, index: int, rate: float) -> list[float]:
        sleeps.clear()
        clock[0] = 0.0  # the sleeps are differences of times on this clock: the same start, the same floats
        np.random.random(3)  # moves numpy's global RNG on: each run must seed it again
        result = run(target, PROMPTS * 4, rate, seed=(seed, index))
        assert result["completed"] == 16
        return list(sleeps)

    first = schedule(0, 1, 0.5)
    assert len(first) == 16 and first == schedule(0, 1, 0.5)  # both models' schedule at rate 1
    assert sum(first) == pytest.approx(16 / 0.5)  # vLLM rescales: the last request goes out at N / rate
    assert first != schedule(0, 2, 0.5) and first != schedule(1, 1, 0.5)


class NoTokenizer:
    """vLLM's benchmark needs a tokenizer to report TTFT/TPOT/ITL, and calls it only to count the
    output of a server that sent no usage; the fake server sends it."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("vLLM counted the tokens itself: the usage chunk was not read")


@contextlib.contextmanager
def fake_server(tokens: int, gap: float, metrics=None):
    """A vLLM-like server on its own thread: /v1/completions streams `tokens` chunks `gap` seconds
    apart, then usage; /metrics (when given) is metrics(requests received so far). Yields the port
    and the request bodies."""
    from aiohttp import web

    from swiftkv.bench.online_server import free_port

    seen = []

    async def completions(http_request):
        body = await http_request.json()
        seen.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(http_request)
        for i in range(tokens):
            await asyncio.sleep(gap)
            chunk = {"choices": [{"text": f"t{i}", "index": 0}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def metrics_page(_request):
        return web.Response(text=metrics(len(seen)))

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    if metrics:
        app.router.add_get("/metrics", metrics_page)
    loop, runner, port = asyncio.new_event_loop(), web.AppRunner(app), free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port, seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_the_client_streams_token_ids_and_vllm_times_every_token():
    from swiftkv.bench.online_client import Target, run

    slo = SLO(ttft_s=5.0, tpot_s=1.0)  # loose: the machine is shared
    with fake_server(tokens=5, gap=0.05) as (port, seen):
        target = Target(f"http://127.0.0.1:{port}", "m", NoTokenizer(), output_len=5)
        row = rate_row(run(target, PROMPTS[:2], 20.0, slo=slo, seed=(0, 0)), 20.0, 5, slo, speculating=False)
        short = run(Target(target.base_url, "m", NoTokenizer(), output_len=6), PROMPTS[:1], max_concurrency=1)
    assert sorted(body["prompt"] for body in seen[:2]) == [[1, 2, 3], [4, 5]]
    body = seen[0]
    assert body["model"] == "m" and body["max_tokens"] == 5 and body["stream"] is True
    assert body["ignore_eos"] is True and body["temperature"] == 0.0
    assert row["completed"] == 2 and row["failed"] == 0 and row["meets_slo"], row
    assert 0.05 <= row["ttft_p50_s"] < 1.0 and 0.04 <= row["tpot_p50_s"] < 0.5 and 0.04 <= row["itl_p50_s"]
    assert row["duration_s"] >= 5 * 0.05 and row["goodput"] == pytest.approx(2 / row["duration_s"])
    assert short["output_lens"] == [5]  # max_tokens 6, but the server made 5: failed, for us
    with pytest.raises(RuntimeError, match="made 5 tokens, expected 6"):
        idle_latency(short, 6)


# -- CLI and report --------------------------------------------------------------------------------


def parse(*argv):
    from swiftkv.cli import build_parser

    return build_parser().parse_args(["bench", "skv", "--baseline", "teacher", *argv])


def test_cli_online_options_and_quick_defaults():
    from swiftkv.bench.online import QUICK, OnlineSettings, online_settings
    from swiftkv.cli.options import given_values

    args = parse("--online", "--rates", "0.1,0.2,0.4,0.8", "--slo-tpot", "0.5", "--quick")
    given = given_values(args, OnlineSettings)
    assert args.online and given == {"rates": (0.1, 0.2, 0.4, 0.8), "slo_tpot": 0.5}
    settings = online_settings(given, quick=True)
    assert settings.rates == (0.1, 0.2, 0.4, 0.8) and settings.num_requests == QUICK["num_requests"]
    assert online_settings({"num_requests": 9}, quick=True).num_requests == 9  # given beats quick
    assert online_settings({}).prompt_len == 2000 and online_settings({}).output_len == 200


@pytest.mark.parametrize("argv", [["--online", "--rates", "0,1"], ["--online", "--rates", "fast"]])
def test_cli_rejects_bad_rates(argv, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "rates" in capsys.readouterr().err


def test_online_options_without_online_are_an_error(capsys):
    from swiftkv.cli import main

    assert main(["bench", "skv", "--baseline", "teacher", "--num-requests", "5"]) == 2
    assert "--num-requests only apply with --online" in capsys.readouterr().err


def test_check_settings_rejects_prompts_longer_than_the_context():
    from swiftkv.bench.online import check_settings, online_settings

    with pytest.raises(ValueError, match="max-model-len"):
        check_settings(online_settings({}), max_model_len=2048)
    with pytest.raises(ValueError, match="output-len"):
        check_settings(online_settings({"output_len": 1}), max_model_len=4096)


def synthetic_report() -> dict:
    slo = SLO(1.0, 0.1, "p99 TTFT <= 1 s; p99 TPOT <= 0.1 s")
    rates, rows = [1.0, 2.0], {}
    for model, slowdown in (("baseline", 2.0), ("swiftkv", 1.0)):
        rows[model] = [
            rate_row(vllm_result(300 * slowdown * r, 40 * slowdown), r, 11, slo, speculating=False)
            for r in rates
        ]
    return {
        "model": "out/skv",
        "baseline_model": "teacher",
        "rates": rates,
        "slo": {"ttft_s": 1.0, "how": slo.how},
        "workload": {"prompt_len": 2000, "output_len": 200},
        "results": rows,
        "idle": {"baseline": {"ttft_s": 0.3}, "swiftkv": {"ttft_s": 0.15}},
        "summary": compare(rates, rows["baseline"], rows["swiftkv"]),
    }


def test_report_table_and_plot(tmp_path):
    from swiftkv.bench.online_report import format_table, plot

    report = synthetic_report()
    table = format_table(report)
    assert "highest rate within the SLO: baseline 1 req/s, SwiftKV 2 req/s (the highest tested" in table
    assert "SwiftKV / baseline sustained rate: 2.000" in table
    assert "TPOT p50 ratio at the baseline's saturation rate (1 req/s): 0.500" in table
    plot(report, tmp_path / "online.png")
    assert (tmp_path / "online.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- end to end ------------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_online_bench_end_to_end(tmp_path):
    """The real command on a tiny SwiftKV checkpoint (SmolLM2's tokenizer, head_dim 64) against its
    plain teacher: two vLLM servers in turn, ShareGPT prompts, both rates, JSON and PNG."""
    from swiftkv.replies import save_plain_teacher
    from tests.test_vllm_model import tiny_checkpoint

    skv, teacher, out = tmp_path / "skv", tmp_path / "teacher", tmp_path / "out"
    tiny_checkpoint(skv, "llama", group_size=2)
    save_plain_teacher(skv, teacher)
    command = [
        sys.executable,
        "-m",
        "swiftkv.cli",
        "bench",
        str(skv),
        "--baseline",
        str(teacher),
        "--online",
        "--quick",
        "--out",
        str(out),
        "--max-model-len",
        "512",
        "--kv-cache-memory",
        "256M",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=1700)
    assert finished.returncode == 0, finished.stderr[-6000:]
    report = json.loads((out / "online.json").read_text())
    assert len(report["rates"]) == 2 and report["workload"]["prompt_source"].startswith("ShareGPT")
    assert report["server_settings"]["enforce_eager"] is True
    for model in ("baseline", "swiftkv"):
        assert report["idle"][model]["ttft_s"] > 0
        for rate, result in zip(report["rates"], report["results"][model], strict=True):
            assert result["rate"] == rate and result["completed"] == 6 and result["failed"] == 0, result
            for key in (
                "ttft_p50_s",
                "ttft_p99_s",
                "tpot_p50_s",
                "tpot_p99_s",
                "itl_p50_s",
                "itl_p99_s",
                "output_throughput",
                "request_throughput",
                "goodput",
            ):
                assert isinstance(result[key], float) and math.isfinite(result[key]), (model, key, result)
    assert len(report["summary"]["per_rate"]) == 2
    assert (out / "online.png").stat().st_size > 0
    assert "highest rate within the SLO" in finished.stdout
    for session in report[
        "sessions"
    ]:  # each log starts with the command line; `swiftkv serve` prints its own
        lines = (out / session["log"]).read_text().splitlines()  # the record names it relative to OUT
        if session["model"] == "swiftkv":
            assert any(
                line.startswith("swiftkv serve: ") and "--kv-sharing-fast-prefill" in line for line in lines
            )
        else:
            assert "--kv-sharing-fast-prefill" not in lines[0]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_profile_of_one_mixed_step(tmp_path):
    """`swiftkv bench --profile --quick` on a tiny SwiftKV checkpoint and its plain teacher: the mixed
    step holds the whole prompt, SwiftKV's regions nest inside its forward, the baseline has none."""
    from swiftkv.bench.profile import MODEL, STEP, SWIFTKV_REGIONS
    from swiftkv.replies import save_plain_teacher
    from tests.test_vllm_model import tiny_checkpoint

    skv, teacher, out = tmp_path / "skv", tmp_path / "teacher", tmp_path / "out"
    tiny_checkpoint(skv, "llama", group_size=2)
    save_plain_teacher(skv, teacher)
    command = [
        sys.executable,
        "-m",
        "swiftkv.cli",
        "bench",
        str(skv),
        "--baseline",
        str(teacher),
        "--profile",
        "--quick",
        "--out",
        str(out),
        "--max-model-len",
        "512",
        "--kv-cache-memory",
        "256M",
        "--enforce-eager",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=1100)
    assert finished.returncode == 0, finished.stderr[-6000:]
    report = json.loads((out / "profile.json").read_text())
    for model in ("baseline", "swiftkv"):
        result = report[model]
        assert result["prompt_in_one_step"] and result["mixed_step_s"] > 0 and result["decode_step_s"] > 0
        regions = result["regions"]
        assert 0 < regions[MODEL] <= regions[STEP]
        assert any(op["op"].endswith("onednn_mm") or "mm" in op["op"] for op in result["top_ops"])
    assert not set(SWIFTKV_REGIONS) & set(report["baseline"]["regions"])
    swift = report["swiftkv"]["regions"]
    assert set(SWIFTKV_REGIONS) <= set(swift)  # a mixed step gathers the logits rows
    assert sum(swift[name] for name in SWIFTKV_REGIONS) <= swift[MODEL] * 1.01
    assert (
        "ours (kv-write + rows)" in finished.stdout
        and "top operators by self time, SwiftKV" in finished.stdout
    )


def test_profile_and_online_are_separate_runs(capsys):
    from swiftkv.cli import main

    assert main(["bench", "skv", "--baseline", "teacher", "--profile", "--online"]) == 2
    assert "--online and --profile are separate runs" in capsys.readouterr().err
