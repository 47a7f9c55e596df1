"""Long prompts in the training mix (SwiftKV's own workload: a long prompt, a short answer): built from
train chats after the first prompts, answered by the reply writer, packed whole from a block start,
written by the replies stage exactly as distill reads them, and checked before any work."""

from __future__ import annotations

import json

import pytest

from swiftkv.data.chat import read_source
from swiftkv.data.long_prompts import DOCUMENT_TAIL, PASSAGES_HEAD, long_prompt_documents
from swiftkv.data.packing import load_blocks, pack
from swiftkv.data.split import LongMix, split_documents
from swiftkv.data.tokens import Document
from swiftkv.distill.settings import settings_for
from swiftkv.replies import RepliesSettings, ReplyCache, reply_cache, write_replies
from tests.test_replies import fake_writer
from tests.tiny import random_chats, tiny_tokenizer, write_jsonl

REPLY = 6  # tokens of a fake reply (5 words + end of turn)


def long_chats(count: int, seed: int = 0) -> list[dict]:
    """Chats whose first replies are passage-sized (100 words): ten make a long prompt."""
    return random_chats(count, seed=seed, words=100)


def test_a_whole_document_starts_a_block_and_is_never_cut():
    short = [
        Document(list(range(3 + 10 * k, 3 + 10 * k + n)), [True] * n) for k, n in enumerate((5, 9, 7, 6))
    ]
    whole = Document([90 + i for i in range(12)], [False] * 8 + [True] * 4, whole=True)
    blocks = pack([short[0], whole, short[1], short[2], short[3]], 16)
    # Block 0: short 0 (5), short 1 (9), then 2 tokens of short 2, whose tail is dropped so that the
    # waiting whole document starts block 1; short 3 follows it. The partial third block is dropped.
    assert blocks.input_ids[0].tolist() == short[0].ids + short[1].ids + short[2].ids[:2]
    assert blocks.input_ids[1].tolist() == whole.ids + short[3].ids[:4]
    assert blocks.position_ids[1, :12].tolist() == list(range(12))
    # Its answer is trained after the whole prompt: positions 7..10 predict tokens 8..11.
    assert blocks.loss_mask[1, :12].nonzero().squeeze(1).tolist() == [7, 8, 9, 10]
    with pytest.raises(ValueError, match="cannot fit a 8-token block"):
        pack([whole], 8)


def test_long_prompt_documents_are_long_whole_and_answered_by_the_writer(tmp_path):
    tokenizer = tiny_tokenizer()
    chats = [r["messages"] for r in long_chats(80)]
    replies = ReplyCache(tmp_path / "replies.jsonl", fake_writer([]), tokenizer)
    documents = long_prompt_documents(iter(chats), tokenizer, 6000, replies, max_prompt_tokens=1500)
    assert sum(len(d.ids) for d in documents) >= 6000
    for document in documents:
        prompt = document.is_target.index(True)
        assert document.whole and 1000 <= prompt <= 1500 and len(document.ids) - prompt == REPLY
        assert all(document.is_target[prompt:])
    # The writer saw passages + a question and documents + a summary request, alternately.
    asked = [chat[-2]["content"] for chat in read_source(str(tmp_path / "replies.jsonl"))]
    assert asked[0].startswith(PASSAGES_HEAD) and asked[1].endswith(DOCUMENT_TAIL)
    again = long_prompt_documents(
        iter(chats),
        tokenizer,
        6000,
        ReplyCache(tmp_path / "again.jsonl", fake_writer([])),
        max_prompt_tokens=1500,
    )
    assert [d.ids for d in again] == [d.ids for d in documents]


def test_the_long_share_comes_after_the_first_prompts_and_leaves_the_held_out_alone(tmp_path):
    tokenizer = tiny_tokenizer()
    examples = [r["messages"] for r in long_chats(200, seed=1)]
    cache = ReplyCache(tmp_path / "replies.jsonl", fake_writer([]))
    plain_held, plain = split_documents(examples, tokenizer, 0, 512, 8000, replies=cache)
    held, mixed = split_documents(
        examples, tokenizer, 0, 512, 8000, replies=cache, long_mix=LongMix(0.5, 1500)
    )
    assert [d.ids for d in held] == [d.ids for d in plain_held]
    short = [d for d in mixed if not d.whole]
    long = [d for d in mixed if d.whole]
    assert [d.ids for d in short] == [
        d.ids for d in plain[: len(short)]
    ]  # the same first prompts, fewer of them
    assert 3500 <= sum(len(d.ids) for d in long) <= 4000 + 1500 + REPLY
    where = [k for k, d in enumerate(mixed) if d.whole]
    assert where[0] > 0 and where[-1] < len(mixed) - 1  # spread among the short ones, which fill their room


def test_whole_documents_with_nothing_to_fill_their_room_get_filler():
    whole = [Document([50 + k] * 10, [False] * 6 + [True] * 4, whole=True) for k in range(3)]
    blocks = pack(whole, 16)
    assert len(blocks) == 2  # the third one's block is partial, so dropped
    for row, document in enumerate(whole[:2]):
        assert blocks.input_ids[row, :10].tolist() == document.ids and blocks.position_ids[row, 10] == 0
        assert not blocks.loss_mask[row, 9:].any()  # nothing trains on the filler


def test_the_replies_stage_writes_every_long_answer_distill_reads(tmp_path, monkeypatch):
    monkeypatch.setattr("swiftkv.replies.stage.reply_generator", lambda settings, eos: fake_writer([]))
    data = str(write_jsonl(tmp_path / "chats.jsonl", long_chats(300, seed=2)))
    settings = RepliesSettings(
        source="unused",
        out=str(tmp_path / "replies.jsonl"),
        data=data,
        tokens=12000,
        heldout_tokens=1600,
        long_share=0.5,
        long_prompt_tokens=1500,
    )
    tokenizer = tiny_tokenizer()
    assert write_replies(settings, tokenizer).generated > 0
    reader = reply_cache(settings, tokenizer, may_generate=False)  # refuses any reply the stage did not write
    train, _ = load_blocks(
        data, tokenizer, 1600, 12000, 1600, seed=0, replies=reader, long_mix=settings.long_mix()
    )
    assert bool((train.position_ids >= 1000).any())  # long documents reached the blocks in one piece
    lines = (tmp_path / "replies.jsonl").read_text().splitlines()
    assert len({json.loads(line)["key"] for line in lines}) == len(lines)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"long_share": 0.3, "seq_len": 1024}, "expected --seq-len of at least 1193, got 1024"),
        ({"long_share": 0.3, "seq_len": 2048, "targets": "human"}, "expected --targets teacher or mixed"),
        ({"long_share": 1.5, "seq_len": 2048}, r"expected a share of the written tokens in \(0, 1\]"),
    ],
)
def test_bad_long_share_is_one_clear_error(given, message):
    with pytest.raises(ValueError, match=message):
        settings_for("tiny", **given).check_written_replies()


def test_distill_asks_the_replies_stage_for_long_prompts_that_fit_its_blocks():
    replies = settings_for("tiny", long_share=0.25, seq_len=2048).replies_settings()
    assert replies.long_mix() == LongMix(0.25, 2048 - 64 - 1)
    assert settings_for("tiny").replies_settings().long_mix() is None
