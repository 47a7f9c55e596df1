"""The replies stage (`swiftkv replies`): resumes without duplicates, writes chat records `--data` reads,
walks the same seeded split as distill's packing (unchanged by the move), and distill trains on what it
wrote without generating anything."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from swiftkv.cli import main
from swiftkv.data.chat import read_source
from swiftkv.data.packing import load_blocks
from swiftkv.data.tokens import Reply
from swiftkv.replies import RepliesSettings, ReplyCache, read_replies, reply_cache, write_replies
from tests.test_distill_cli import TRAIN_ARGS
from tests.tiny import random_chats, save_tiny_folder, tiny_tokenizer, write_jsonl


def fake_writer(calls: list, batch: int | None = None):
    """A deterministic stand-in for the model that writes the replies (real ones: test_distill_recipes, vLLM)."""

    def generate(prompts):
        calls.append(len(prompts))
        return [Reply([3 + (sum(p) + k) % 50 for k in range(5)] + [2], True) for p in prompts]

    if batch:
        generate.batch = batch
    return generate


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("share", "heldout", "train", "mask"),
    [
        (None, "c023954765c96811", "19a09eb87173e620", "93f2e6996b741add"),
        (0.0, "c023954765c96811", "ef442c6d7881ffd6", "b77197c92ccc4950"),
        (0.5, "c023954765c96811", "5bcd2ac32cba4a50", "1953b857da1d8983"),
    ],
)
def test_the_split_is_unchanged(tmp_path, share, heldout, train, mask):
    """The blocks of human, teacher and mixed targets are byte for byte those the code gave before the
    split moved to `data/split.py` (digests taken at commit dbf2db2): same held-out ids, same train ids."""
    data = str(write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=5)))
    replies = None if share is None else ReplyCache(tmp_path / "replies.jsonl", fake_writer([]))
    blocks, held = load_blocks(
        data, tiny_tokenizer(), 64, 1024, 256, seed=0, replies=replies, human_share=share or 0.0
    )
    assert (digest(held.input_ids), digest(blocks.input_ids), digest(blocks.loss_mask)) == (
        heldout,
        train,
        mask,
    )


def test_stage_resumes_without_duplicates_and_writes_chat_records(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        "swiftkv.replies.stage.reply_generator", lambda settings, eos: fake_writer(calls, batch=4)
    )
    data = str(write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=3)))
    out = tmp_path / "replies.jsonl"
    settings = RepliesSettings(source="unused", out=str(out), data=data, tokens=200, heldout_tokens=64)
    first = write_replies(settings, tiny_tokenizer())
    assert first.generated == sum(calls) == len(read_replies(out)) > 0
    before = out.read_text()
    # A kill mid-write leaves a torn last line: it is cut off, the rest reused, nothing duplicated.
    with out.open("a") as handle:
        handle.write('{"key": "abc", "reply_ids": [4, 5')
    again = write_replies(RepliesSettings(**{**vars(settings), "tokens": 400}), tiny_tokenizer())
    assert again.generated > 0 and out.read_text().startswith(before)
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == first.generated + again.generated
    calls.clear()
    assert (
        write_replies(RepliesSettings(**{**vars(settings), "tokens": 400}), tiny_tokenizer()).generated == 0
    )
    assert calls == []
    # Each line is a chat record: the prompt, then the reply as text.
    chats = list(read_source(str(out)))
    assert len(chats) == len(keys)
    assert all(chat[-1]["role"] == "assistant" and chat[-2]["role"] == "user" for chat in chats)
    tokenizer = tiny_tokenizer()
    record = json.loads(out.read_text().splitlines()[0])
    assert chats[0][-1]["content"] == tokenizer.decode(record["reply_ids"], skip_special_tokens=True)


def test_distill_trains_on_the_replies_the_stage_wrote(tmp_path, monkeypatch, capsys):
    """`swiftkv replies` with the run's split settings writes every reply distill asks for: the run then
    generates nothing (its reply writer would fail the test)."""
    folder = save_tiny_folder(tmp_path / "student")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    out = tmp_path / "replies.jsonl"
    assert (
        main(
            [
                "replies",
                str(folder),
                "--data",
                str(data),
                "--out",
                str(out),
                "--tokens",
                "512",
                "--heldout-tokens",
                "64",
                "--reply-tokens",
                "6",
                "--engine",
                "hf",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    assert f"wrote {out}" in capsys.readouterr().out and read_replies(out)

    def refuse(prompts):
        raise AssertionError("distill generated replies the stage should have written")

    monkeypatch.setattr("swiftkv.replies.stage.reply_generator", lambda settings, eos: refuse)
    args = [a if a != "human" else "teacher" for a in TRAIN_ARGS]
    assert (
        main(
            [
                "distill",
                str(folder),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "out"),
                *args,
                "--teacher-data",
                str(out),
                "--reply-tokens",
                "6",
            ]
        )
        == 0
    )
    assert "(0 generated now)" in capsys.readouterr().out


@pytest.mark.parametrize("skip_tokens", [0, 3000])
def test_every_turn_replies_are_written_exactly_as_distill_reads_them(tmp_path, monkeypatch, skip_tokens):
    """With --skip-tokens too: the stage writes the passed-over prompts' replies (the split counts their
    tokens) and the ones after them, exactly what the run reads back."""
    from swiftkv.distill.core.trainer import training_blocks
    from swiftkv.distill.settings import settings_for

    monkeypatch.setattr("swiftkv.replies.stage.reply_generator", lambda settings, eos: fake_writer([]))
    data = str(write_jsonl(tmp_path / "chats.jsonl", random_chats(80, seed=4, turns=3)))
    run = settings_for(
        "tiny",
        targets="teacher",
        prompt_turns="every",
        data=data,
        tokens=6000,
        heldout_tokens=600,
        seq_len=200,
        batch_size=1,
        teacher_data=str(tmp_path / "replies.jsonl"),
        skip_tokens=skip_tokens,
    )
    tokenizer = tiny_tokenizer()
    written = write_replies(run.replies_settings(), tokenizer)
    first_turns = RepliesSettings(
        source="tiny", out=str(tmp_path / "first.jsonl"), data=data, tokens=6000, heldout_tokens=600
    )
    assert written.generated > write_replies(first_turns, tokenizer).generated  # ~3 prompts per 3-turn chat
    reader = reply_cache(
        run.replies_settings(), tokenizer, may_generate=False
    )  # refuses anything not written
    train, _ = training_blocks(run, tokenizer, reader)
    assert train.num_tokens >= 6000


def test_prompt_turns_need_written_replies():
    from swiftkv.distill.settings import settings_for

    with pytest.raises(ValueError, match="--prompt-turns every: .* expected --targets teacher or mixed"):
        settings_for("tiny", prompt_turns="every", targets="human").check_written_replies()


def test_a_run_short_of_data_says_how_many_tokens_it_trains(tmp_path, capsys):
    from swiftkv.distill.core.trainer import short_of_tokens
    from swiftkv.distill.parallel.world import World
    from swiftkv.distill.settings import settings_for

    run = settings_for("tiny", targets="teacher", tokens=8192, seq_len=1024, batch_size=2)
    short_of_tokens(run, 4096, World())
    assert "gives 4,096 train tokens of the 8,192 asked" in capsys.readouterr().err
    short_of_tokens(run, 8192, World())
    assert capsys.readouterr().err == ""


def test_a_compressed_reply_file_is_read_and_never_appended_to(tmp_path):
    """Reply ids kept as .jsonl.xz (as in the repository) read like the plain file; asked for a reply it
    lacks, the cache refuses before generating, since appending text would break the archive."""
    import lzma

    from swiftkv.data.tokens import prompt_key
    from swiftkv.replies import append_replies

    append_replies(tmp_path / "r.jsonl", {prompt_key([4, 5]): Reply([7, 2], True)})
    packed = tmp_path / "r.jsonl.xz"
    packed.write_bytes(lzma.compress((tmp_path / "r.jsonl").read_bytes()))
    assert read_replies(packed) == read_replies(tmp_path / "r.jsonl")
    calls: list = []
    cache = ReplyCache(packed, fake_writer(calls))
    assert cache.get([[4, 5]]) == [Reply([7, 2], True)]
    with pytest.raises(ValueError, match="lacks 1 of the replies asked for"):
        cache.get([[4, 5], [6]])
    assert calls == [] and read_replies(packed) == read_replies(tmp_path / "r.jsonl")


def test_a_reply_file_is_read_line_by_line_into_packed_ids(tmp_path):
    """A GPU-scale reply file (~10^9 tokens) has to fit one host when distill reads it: reading holds about
    4 bytes a token (a Python int list takes ~36, and the file's whole text would come on top), and a torn
    last line longer than one read-back chunk is still cut off."""
    import tracemalloc

    from swiftkv.replies import append_replies

    replies = {f"k{i}": Reply(list(range(1000 + i, 1500 + i)), i % 2 == 0) for i in range(400)}
    path = tmp_path / "r.jsonl"
    append_replies(path, replies)
    whole = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(b'{"key": "torn", "reply_ids": [' + b"7, " * 30_000)  # ~90 KB: past one chunk
    tracemalloc.start()
    read = read_replies(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert read == replies and path.stat().st_size == whole
    tokens = 400 * 500
    assert peak < 10 * tokens, f"{peak / tokens:.1f} bytes a token"
