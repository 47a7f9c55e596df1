"""The replies stage at scale: every pending prompt handed to the engine at once, walk by walk, the replies
appended in the walk's order as they finish. Two vLLM engines write the same file as one, token for token;
a run killed mid-way resumes to the same file as a run never stopped; a walk asks only for prompts the
finished walk asks for (no reply written in vain)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from swiftkv.data.tokens import Reply
from swiftkv.replies import RepliesSettings, write_replies
from tests.test_long_mix import long_chats
from tests.tiny import random_chats, save_tiny_teacher, tiny_tokenizer, write_jsonl


def settings_for(tmp_path, out: str, **given) -> RepliesSettings:
    data = tmp_path / "chats.jsonl"
    if not data.exists():
        write_jsonl(data, random_chats(400, seed=11))
    values = dict(data=str(data), tokens=3000, heldout_tokens=64, reply_tokens=8, dtype="float32")
    return RepliesSettings(source=str(tmp_path / "teacher"), out=str(tmp_path / out), **{**values, **given})


def test_walks_ask_only_for_prompts_the_finished_walk_needs(tmp_path, monkeypatch):
    """Replies shorter than --reply-tokens: the first walk guesses them full length, so it asks for fewer
    prompts than the budget takes, and a second walk asks for the rest; the file is exactly the prompts the
    finished walk reads, in its order (the same file as replies written chunk by chunk as the walk reaches
    them)."""
    calls = []

    def short_writer(settings, eos):
        def generate(prompts):
            calls.append(len(prompts))
            return [Reply([3 + sum(p) % 40, eos], True) for p in prompts]

        generate.batch = 8
        return generate

    monkeypatch.setattr("swiftkv.replies.stage.reply_generator", short_writer)
    write_jsonl(tmp_path / "chats.jsonl", long_chats(300, seed=2))
    given = dict(tokens=12000, heldout_tokens=1600, long_share=0.5, long_prompt_tokens=1500)
    settings = settings_for(tmp_path, "walked.jsonl", **given)
    cache = write_replies(settings, tiny_tokenizer())
    walked = (tmp_path / "walked.jsonl").read_text()
    keys = [json.loads(line)["key"] for line in walked.splitlines()]
    assert len(keys) == len(set(keys)) == cache.generated == sum(calls)

    # The same split read chunk by chunk by a cache that generates what each chunk lacks, as it goes.
    from swiftkv.data.mixture import read_data
    from swiftkv.data.split import split_documents
    from swiftkv.replies import ReplyCache

    tokenizer = tiny_tokenizer()
    chunked = ReplyCache(
        tmp_path / "chunked.jsonl", short_writer(settings, tokenizer.eos_token_id), tokenizer
    )
    split_documents(
        read_data(settings.data, settings.seed),
        tiny_tokenizer(),
        settings.seed,
        settings.heldout_tokens,
        settings.tokens,
        replies=chunked,
        long_mix=settings.long_mix(),
    )
    assert (tmp_path / "chunked.jsonl").read_text() == walked


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_two_engines_write_what_one_engine_writes(tmp_path):
    """The engines as `write_replies` streams them (its whole path on vLLM runs in test_gpu_guide): two
    engine processes, each given every other prompt, give every reply one engine gives, token for token.
    Eager engines: compiling the CPU engine's graphs three times would take minutes."""
    import torch

    from swiftkv.replies.vllm_engines import DataParallelWriter, EngineSpec, EngineWriter

    folder = save_tiny_teacher(
        tmp_path / "teacher", hidden_size=128, num_attention_heads=2, num_key_value_heads=1
    )
    rng = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(4, 120, (int(n),), generator=rng).tolist()
        for n in torch.randint(3, 60, (96,), generator=rng)
    ]
    spec = EngineSpec(str(folder), 12, "float32", tiny_tokenizer().eos_token_id, enforce_eager=True)
    one = EngineWriter(spec)
    streamed = list(one.stream(prompts))
    one.close()
    two = DataParallelWriter(spec, 2)
    try:
        assert two(prompts) == [reply for _, reply in sorted(streamed, key=lambda pair: pair[0])]
    finally:
        two.close()
    assert sorted(index for index, _ in streamed) == list(range(len(prompts)))
    assert {len(reply.ids) for _, reply in streamed} != {12}  # some replies stop early: the test sees order


def replies_run(tmp_path, out: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "swiftkv.cli", "replies", str(tmp_path / "teacher"), "--out"]
    command += [str(tmp_path / out), "--data", str(tmp_path / "chats.jsonl"), "--tokens", "40000"]
    command += ["--heldout-tokens", "64", "--reply-tokens", "24", "--engine", "hf", "--dtype", "float32"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def lines_of(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_file(tmp_path):
    save_tiny_teacher(tmp_path / "teacher")
    write_jsonl(tmp_path / "chats.jsonl", random_chats(2000, seed=12))
    whole = replies_run(tmp_path, "whole.jsonl")
    assert whole.wait(timeout=600) == 0, whole.stderr.read()

    killed = tmp_path / "killed.jsonl"
    run = replies_run(tmp_path, "killed.jsonl")
    while lines_of(killed) < 64 and run.poll() is None:
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    written = lines_of(killed)
    total = lines_of(tmp_path / "whole.jsonl")
    assert 0 < written < total, f"the kill came at {written} of {total} replies: expected mid-way"

    again = replies_run(tmp_path, "killed.jsonl")
    assert again.wait(timeout=600) == 0, again.stderr.read()
    assert killed.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_the_plan_gives_the_stages_work_and_time_at_the_runs_shape(tmp_path, capsys):
    """`swiftkv replies --plan`: the prompts the tokens hold at the data's mean prompt length and full-length
    replies, the writer's rates timed on this device, and the time they give, divided by the engines."""
    from swiftkv.cli import main
    from swiftkv.data.tokens import first_prompt
    from swiftkv.distill.measure.replies_time import plan_replies

    save_tiny_teacher(tmp_path / "teacher")
    settings = settings_for(tmp_path, "unused.jsonl", tokens=1_000_000, reply_tokens=64, engine="hf")
    plan = plan_replies(settings)
    chats = [record["messages"] for record in random_chats(400, seed=11)[:256]]
    lengths = [len(first_prompt(tiny_tokenizer(), chat)[1]) for chat in chats]
    assert plan.mean_prompt_tokens == pytest.approx(sum(lengths) / len(lengths))
    assert plan.prompts == round(1_000_000 / (plan.mean_prompt_tokens + 64))
    assert plan.reply_tokens == plan.prompts * 64
    seconds = plan.prompt_tokens / plan.prefill_tokens_per_s + plan.reply_tokens / plan.decode_tokens_per_s
    assert plan.device_hours == pytest.approx(seconds / 3600)
    assert plan.prefill_tokens_per_s > plan.decode_tokens_per_s > 0  # a prefill's tokens share each step

    args = ["replies", str(tmp_path / "teacher"), "--data", settings.data, "--tokens", "1M", "--plan"]
    assert main([*args, "--reply-tokens", "64", "--engine", "hf"]) == 0
    printed = capsys.readouterr().out
    assert f"about {plan.prompts:,} prompts" in printed and "h on 1 engine(s)" in printed
    assert not (tmp_path / "unused.jsonl").exists()
