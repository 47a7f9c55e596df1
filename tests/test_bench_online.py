"""`swiftkv bench --online`: the metrics (percentiles, TTFT/TPOT/ITL from token times, goodput, the
SLO and the highest rate within it), the seeded Poisson schedule, the session order, prompts, server
commands and process-group shutdown, the CLI options, the streaming client against a fake server,
the report; and one end-to-end `--quick` run with two real vLLM servers on a tiny checkpoint."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from swiftkv.bench.online_metrics import (
    SLO,
    RequestResult,
    choose_slo,
    compare,
    default_rates,
    max_sustained_rate,
    percentile,
    poisson_arrivals,
    summarize,
)

# -- metrics ---------------------------------------------------------------------------------------


def test_percentile_interpolates_like_numpy():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0


def test_percentile_ignores_nan_and_is_nan_for_nothing():
    assert percentile([1.0, math.nan, 3.0], 50) == 2.0
    assert math.isnan(percentile([], 50))


def test_ttft_itl_tpot_from_token_times():
    result = RequestResult.from_token_times(10.0, [10.5, 10.6, 10.8, 11.1], prompt_tokens=7)
    assert result.ttft == pytest.approx(0.5)
    assert result.itl == pytest.approx([0.1, 0.2, 0.3])
    assert result.latency == pytest.approx(1.1)
    assert result.tpot == pytest.approx((1.1 - 0.5) / 3)  # the mean of the ITLs when one token per chunk
    assert result.output_tokens == 4 and result.prompt_tokens == 7 and result.success


def test_tpot_needs_two_tokens_and_a_success():
    assert math.isnan(RequestResult.from_token_times(0.0, [0.3]).tpot)
    assert not RequestResult.from_token_times(0.0, []).success
    assert math.isnan(RequestResult(ttft=0.1, latency=1.0, output_tokens=5, success=False).tpot)


def request(ttft: float, tpot: float, tokens: int = 11, prompt: int = 100) -> RequestResult:
    return RequestResult.from_token_times(0.0, [ttft + i * tpot for i in range(tokens)], prompt_tokens=prompt)


def test_summarize_throughput_goodput_and_slo():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    results = [request(0.5, 0.05), request(0.8, 0.05), request(2.0, 0.05), request(0.5, 0.2)]
    row = summarize(results, duration=10.0, slo=slo)
    assert row["completed"] == 4 and row["failed"] == 0
    assert row["request_throughput"] == pytest.approx(0.4)
    assert row["output_throughput"] == pytest.approx(4 * 11 / 10)
    assert row["total_token_throughput"] == pytest.approx(4 * 111 / 10)
    assert row["goodput"] == pytest.approx(2 / 10)  # the slow first token and the slow decode miss the SLO
    assert row["ttft_p50_s"] == pytest.approx(0.65)
    assert row["tpot_p50_s"] == pytest.approx(0.05)
    assert row["itl_p99_s"] == pytest.approx(0.2)
    assert not row["meets_slo"]  # p99 TTFT ~2 s > 1 s
    assert summarize(results[:2], 10.0, slo)["meets_slo"]


def test_a_failed_request_breaks_the_slo_and_counts_in_no_metric():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    row = summarize([request(0.5, 0.05), RequestResult(error="boom")], duration=5.0, slo=slo)
    assert row["completed"] == 1 and row["failed"] == 1
    assert row["ttft_p99_s"] == pytest.approx(0.5)
    assert row["goodput"] == pytest.approx(1 / 5)
    assert not row["meets_slo"]


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


def test_poisson_arrivals_are_seeded_with_mean_gap_one_over_rate():
    rate, count = 2.5, 20000
    times = poisson_arrivals(rate, count, seed=[0, 1])
    assert times == poisson_arrivals(rate, count, seed=[0, 1])
    assert times != poisson_arrivals(rate, count, seed=[0, 2])
    assert len(times) == count and times[0] == 0.0
    gaps = np.diff(times)
    assert (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)  # standard error ~0.7%
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: std = mean
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 3, seed=0)


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


# -- the client against a fake streaming server ----------------------------------------------------


async def fake_completions(tokens: int, gap: float, seen: list):
    """A /v1/completions that streams `tokens` chunks `gap` seconds apart, then usage, like vLLM."""
    from aiohttp import web

    from swiftkv.bench.online_server import free_port

    async def handle(http_request):
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

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def test_client_streams_token_ids_and_times_every_token():
    from swiftkv.bench.online import Client

    async def scenario():
        seen = []
        runner, port = await fake_completions(tokens=5, gap=0.05, seen=seen)
        try:
            client = Client(f"http://127.0.0.1:{port}", "m", output_len=5)
            results, duration = await client.poisson([[1, 2, 3], [4, 5]], [0.0, 0.1], "test")
            short = await Client(f"http://127.0.0.1:{port}", "m", output_len=6).sequential([[1]])
        finally:
            await runner.cleanup()
        return seen, results, duration, short

    seen, results, duration, short = asyncio.run(scenario())
    assert seen[0]["prompt"] == [1, 2, 3] and seen[0]["max_tokens"] == 5
    assert seen[0]["ignore_eos"] is True and seen[0]["temperature"] == 0.0 and seen[0]["stream"] is True
    for result, prompt_len in zip(results, (3, 2), strict=True):
        assert result.success and result.output_tokens == 5 and result.prompt_tokens == prompt_len
        assert 0.05 <= result.ttft < 1.0 and len(result.itl) == 4  # loose: the machine is shared
        assert 0.04 <= result.tpot < 0.5
    assert duration >= 0.1 + 5 * 0.05
    assert not short[0].success and "expected 6" in short[0].error  # ignore_eos makes the count exact


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
            {"rate": r, **summarize([request(0.3 * slowdown * r, 0.04 * slowdown)] * 4, 5.0, slo)}
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
