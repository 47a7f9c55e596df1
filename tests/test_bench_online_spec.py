"""`swiftkv bench --online` with a speculator and the extractive workload, and `--decode-steps`: the
options and their one-line refusals before any server starts, which server gets which config, the
acceptance rate from vLLM's benchmark (which reads the server's Prometheus counters), the extractive
prompts, the report; one small end-to-end run per mode with real vLLM on a tiny checkpoint."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}

# -- options ---------------------------------------------------------------------------------------


def parse(*argv):
    from swiftkv.cli import build_parser

    return build_parser().parse_args(["bench", "skv", "--baseline", "teacher", *argv])


@pytest.mark.parametrize(("speculate", "baseline_config"), [("both", NGRAM), ("swiftkv", None)])
def test_speculative_config_goes_to_the_sides_asked_for(speculate, baseline_config):
    from swiftkv.bench.online import OnlineSettings, online_settings, speculative_configs
    from swiftkv.cli.options import given_values

    args = parse(
        "--online",
        "--workload",
        "extractive",
        "--speculative-config",
        json.dumps(NGRAM),
        "--speculate",
        speculate,
    )
    given = given_values(args, OnlineSettings)
    assert given == {"workload": "extractive", "speculative_config": NGRAM, "speculate": speculate}
    assert speculative_configs(online_settings(given)) == {"baseline": baseline_config, "swiftkv": NGRAM}
    assert speculative_configs(online_settings({})) == {"baseline": None, "swiftkv": None}


def test_speculating_servers_get_vllms_json_option():
    from swiftkv.bench.online_server import speculative_args
    from swiftkv.vllm.speculative import speculative_options

    args = speculative_args(NGRAM)
    assert (
        args[0] == "--speculative-config" and speculative_options(args) == NGRAM
    )  # what `swiftkv serve` reads
    assert speculative_args(None) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"method": "eagle", "model": "x", "num_speculative_tokens": 2}', "'eagle' cannot run with SwiftKV"),
        ('{"method": "draft_model", "model": "x"}', "'draft_model' cannot run with SwiftKV"),
        ('{"method": "nonsense"}', "not one vLLM knows"),
        ("{method: ngram}", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        ("{}", "names no speculative method"),
    ],
)
def test_a_bad_speculative_config_is_one_error_at_parsing(text, message, capsys):
    """argparse refuses it, so no prompt is built and no server starts; the message names what works."""
    with pytest.raises(SystemExit) as exit_info:
        parse("--online", "--speculative-config", text)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --speculative-config" in err and message in err
    assert "ngram" in err  # what works instead


def test_the_library_refuses_a_bad_config_before_any_server(monkeypatch, tmp_path):
    """online_bench with settings built in code (no option parsing): refused before prompts or servers."""
    import swiftkv.bench.online as online
    from swiftkv.bench.offline import BenchSettings

    def no_server(*_args, **_kwargs):
        raise AssertionError("a server started")

    monkeypatch.setattr(online, "running_server", no_server)
    monkeypatch.setattr(online, "build_prompts", no_server)
    settings = online.online_settings({"speculative_config": {"method": "eagle3", "model": "x"}})
    with pytest.raises(ValueError, match="'eagle3' cannot run with SwiftKV.*'ngram'"):
        online.online_bench(
            BenchSettings(model="skv", baseline="teacher", out=str(tmp_path), dtype="float32"), settings
        )


def test_speculate_without_a_config_and_modes_together_are_errors(capsys):
    from swiftkv.cli import main

    assert main(["bench", "skv", "--baseline", "teacher", "--online", "--speculate", "swiftkv"]) == 2
    assert (
        "--speculate says which servers get --speculative-config; give the config too"
        in capsys.readouterr().err
    )
    assert main(["bench", "skv", "--baseline", "teacher", "--decode-steps", "--profile"]) == 2
    assert "--profile and --decode-steps are separate runs" in capsys.readouterr().err
    assert main(["bench", "skv", "--baseline", "teacher", "--decode-steps", "--workload", "extractive"]) == 2
    assert "--workload only apply with --online" in capsys.readouterr().err


def test_cli_rejects_an_unknown_workload(capsys):
    with pytest.raises(SystemExit):
        parse("--online", "--workload", "poems")
    assert "invalid choice: 'poems'" in capsys.readouterr().err


# -- acceptance rate: vLLM's benchmark reads the server's counters ---------------------------------


def test_speculative_stats_from_vllms_result():
    from swiftkv.bench.online_metrics import SLO, rate_row, speculative_stats
    from tests.test_bench_online import vllm_result

    spec = {
        "spec_decode_num_drafts": 2,
        "spec_decode_draft_tokens": 6,
        "spec_decode_accepted_tokens": 3,
        "spec_decode_acceptance_rate": 50.0,  # vLLM's percent
        "spec_decode_acceptance_length": 2.5,
        "spec_decode_per_position_acceptance_rates": [1.0, 0.5, 0.0],
    }
    assert speculative_stats(spec) == {
        "drafts": 2,
        "draft_tokens": 6,
        "accepted_tokens": 3,
        "acceptance_rate": 0.5,
        "mean_acceptance_length": 2.5,
        "per_position_acceptance_rates": [1.0, 0.5, 0.0],
    }
    idle = speculative_stats({})  # vLLM leaves the keys out when nothing was drafted
    assert idle["drafts"] == idle["draft_tokens"] == idle["accepted_tokens"] == 0
    assert idle["acceptance_rate"] is None and idle["mean_acceptance_length"] is None
    result = {**vllm_result(500, 50), **spec}
    assert rate_row(result, 1.0, 11, SLO(1.0, 0.1), speculating=True)["speculative"]["acceptance_rate"] == 0.5
    assert rate_row(result, 1.0, 11, SLO(1.0, 0.1), speculating=False)["speculative"] is None


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllms_benchmark_reads_the_counters_the_installed_vllm_exposes():
    """Fill vLLM's own SpecDecodingProm (in a fresh process: its counters go to the global registry),
    serve its Prometheus page before and after two drafts from a fake server, and run the client
    against it: guards the pairing of vLLM's counter names with its benchmark's reader, and our
    reading of the result, against a vLLM upgrade."""
    script = """
from types import SimpleNamespace
import prometheus_client
from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats
prom = SpecDecodingProm(SimpleNamespace(num_speculative_tokens=3), ["model_name", "engine"], {0: ["m", "0"]})
print(prometheus_client.generate_latest().decode())
print("=====")
stats = SpecDecodingStats.new(3)
stats.observe_draft(3, 2)
stats.observe_draft(3, 0)
prom.observe(stats, 0)
print(prometheus_client.generate_latest().decode())
"""
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=500)
    assert finished.returncode == 0, finished.stderr[-3000:]
    before, after = finished.stdout.split("=====\n")
    from swiftkv.bench.online_client import Target, run, spec_counters_exposed
    from swiftkv.bench.online_metrics import SLO, rate_row
    from tests.test_bench_online import NoTokenizer, fake_server

    slo = SLO(5.0, 1.0)
    with fake_server(tokens=4, gap=0.01, metrics=lambda served: after if served else before) as (port, _):
        target = Target(f"http://127.0.0.1:{port}", "m", NoTokenizer(), output_len=4)
        assert spec_counters_exposed(target.base_url)
        result = run(target, [[1, 2], [3, 4]], 50.0, slo=slo, seed=(0, 0))
    with fake_server(tokens=4, gap=0.01) as (port, _):
        assert not spec_counters_exposed(f"http://127.0.0.1:{port}")  # no /metrics page
    spec = rate_row(result, 50.0, 4, slo, speculating=True)["speculative"]
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (2, 6, 2)
    assert spec["acceptance_rate"] == pytest.approx(2 / 6)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 2 / 2)
    assert spec["per_position_acceptance_rates"] == pytest.approx([0.5, 0.5, 0.0])


# -- extractive prompts ----------------------------------------------------------------------------


def conversations(count: int = 120) -> list[list[dict]]:
    """Chats whose first reply is 40..~120 tokens and names its conversation (answer{i})."""
    return [
        [
            {"role": "user", "content": f"What is item number {i}?"},
            {
                "role": "assistant",
                "content": f"answer{i} is " + "a small red box with a lid. " * (6 + i % 11),
            },
        ]
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def tokenizer():
    from swiftkv.sources import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def test_extractive_prompts_are_templated_passages_plus_question_or_document_plus_summary(tokenizer):
    from swiftkv.bench.online_prompts import extractive_prompts
    from swiftkv.data.long_prompts import DOCUMENT_TAIL, PASSAGES_HEAD

    prompts = extractive_prompts(tokenizer, 6, 512, conversations=conversations)
    assert len(prompts) == 6
    assert prompts == extractive_prompts(tokenizer, 6, 512, conversations=conversations)  # deterministic
    assert (
        extractive_prompts(tokenizer, 3, 512, conversations=conversations) == prompts[:3]
    )  # more keeps the first
    for k, ids in enumerate(prompts):
        assert 256 <= len(ids) <= 512
        text = tokenizer.decode(ids)
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")  # chat template
        if k % 2 == 0:
            assert PASSAGES_HEAD in text and "Passage 2:" in text
            number = int(text.rsplit("What is item number ", 1)[1].split("?")[0])
            assert f"answer{number} is" in text  # the passage that answers the question is among them
        else:
            assert DOCUMENT_TAIL in text and "Question:" not in text


def test_extractive_prompts_too_short_or_too_few_are_one_error(tokenizer):
    from swiftkv.bench.online_prompts import extractive_prompts

    with pytest.raises(ValueError, match="--prompt-len 40 is too short for the extractive workload"):
        extractive_prompts(tokenizer, 2, 40, conversations=conversations)
    with pytest.raises(ValueError, match=r"make only \d+ extractive prompts.*50 needed"):
        extractive_prompts(tokenizer, 50, 512, conversations=lambda: conversations(30))


# -- report ----------------------------------------------------------------------------------------


def test_report_names_each_sides_config_and_gives_acceptance(tmp_path):
    from swiftkv.bench.online_metrics import compare
    from swiftkv.bench.online_report import format_table, plot
    from tests.test_bench_online import synthetic_report

    report = synthetic_report()
    for rows, rate in ((report["results"]["swiftkv"], 0.6), (report["results"]["baseline"], None)):
        for row in rows:
            row["speculative"] = None if rate is None else {"acceptance_rate": rate}
    report["speculative_config"] = {"baseline": None, "swiftkv": NGRAM}
    report["workload"]["kind"] = "extractive"
    report["summary"] = compare(report["rates"], report["results"]["baseline"], report["results"]["swiftkv"])
    assert report["summary"]["per_rate"][0]["acceptance_rate"] == {"baseline": None, "swiftkv": 0.6}
    table = format_table(report)
    assert "baseline: no speculation" in table
    assert f"SwiftKV: --speculative-config '{json.dumps(NGRAM)}'" in table
    assert "acceptance rate" in table and "TPOT p99 (ms)" in table
    assert any(line.split()[-2:] == ["n/a", "0.600"] for line in table.splitlines())
    plot(report, tmp_path / "online.png")
    assert (tmp_path / "online.png").stat().st_size > 0


def test_side_labels():
    from swiftkv.bench.online_report import side_label

    assert side_label("swiftkv", NGRAM) == "SwiftKV + ngram k=3"
    assert side_label("baseline", None) == "baseline"


def test_decode_steps_table_and_plot(tmp_path):
    from swiftkv.bench.profile import format_decode_steps, plot_decode_steps

    def result(step_ms):
        times = [step_ms / 1e3] * 5
        return {
            "step_s": times,
            "median_step_s": times[0],
            "mean_step_s": times[0],
            "every_step_decoded_the_whole_batch": True,
        }

    report = {
        "scenario": {"batch": 8, "context_len": 2000, "steps": 5, "warmup_steps": 1},
        "settings": {"dtype": "float32"},
        "baseline": result(40.0),
        "swiftkv": result(30.0),
        "median_step_ratio": 0.75,
    }
    table = format_decode_steps(report)
    assert "median step" in table and "0.750" in table and "warning" not in table
    plot_decode_steps(report, tmp_path / "d.png")
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"


# -- end to end ------------------------------------------------------------------------------------


def tiny_pair(tmp_path: Path) -> tuple[Path, Path]:
    from swiftkv.replies import save_plain_teacher
    from tests.test_vllm_model import tiny_checkpoint

    skv, teacher = tmp_path / "skv", tmp_path / "teacher"
    tiny_checkpoint(skv, "llama", group_size=2)
    save_plain_teacher(skv, teacher)
    return skv, teacher


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_quick_online_bench_extractive_with_ngram_on_swiftkv_only(tmp_path):
    """The real command: extractive prompts, ngram on SwiftKV's server only; its rates report the
    speculator's counters, the plain baseline's report none."""
    skv, teacher = tiny_pair(tmp_path)
    out = tmp_path / "out"
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
        "--workload",
        "extractive",
        "--prompt-len",
        "256",
        "--output-len",
        "16",
        "--speculative-config",
        json.dumps(NGRAM),
        "--speculate",
        "swiftkv",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=2300)
    assert finished.returncode == 0, finished.stderr[-6000:]
    report = json.loads((out / "online.json").read_text())
    assert report["workload"]["kind"] == "extractive" and "passages" in report["workload"]["prompt_source"]
    assert report["speculative_config"] == {"baseline": None, "swiftkv": NGRAM}
    for model in ("baseline", "swiftkv"):
        for result in report["results"][model]:
            assert result["completed"] == 6 and result["failed"] == 0, result
            assert all(
                math.isfinite(result[k]) for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
            )
    for result in report["results"]["baseline"]:
        assert result["speculative"] is None
    for result in report["results"]["swiftkv"]:
        spec = result["speculative"]
        assert spec["drafts"] >= 0 and spec["accepted_tokens"] <= spec["draft_tokens"]
        assert spec["acceptance_rate"] is None or 0 <= spec["acceptance_rate"] <= 1
    assert (
        "SwiftKV: --speculative-config" in finished.stdout and "baseline: no speculation" in finished.stdout
    )
    logs = {
        s["model"]: (out / s["log"]).read_text().splitlines()[0] for s in report["sessions"]
    }  # relative to OUT
    assert "--speculative-config" in logs["swiftkv"] and "--speculative-config" not in logs["baseline"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_decode_steps(tmp_path):
    """`swiftkv bench --decode-steps --quick`: every timed step decoded the whole batch, both models."""
    skv, teacher = tiny_pair(tmp_path)
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "swiftkv.cli",
        "bench",
        str(skv),
        "--baseline",
        str(teacher),
        "--decode-steps",
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
    report = json.loads((out / "decode-steps.json").read_text())
    for model in ("baseline", "swiftkv"):
        result = report[model]
        assert len(result["step_s"]) == report["scenario"]["steps"] and result["median_step_s"] > 0
        assert result["every_step_decoded_the_whole_batch"], result
    assert report["median_step_ratio"] > 0 and (out / "decode-steps.png").stat().st_size > 0
    assert "median step" in finished.stdout
