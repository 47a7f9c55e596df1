"""Training prompts shaped like the long-prompt QA workload (`--long-share S --long-kind passage-qa`,
`swiftkv.data.qa_mix`): the evaluation's prompt over passages of train chats (prose replies and pasted
documents), answered by the reply writer and packed whole; written by the replies stage exactly as distill
reads them; disjoint from the shipped evaluation sets (no sentence of their passages, none of their fact
names), on made-up chats and on ShareGPT itself; bad settings are one clear error before any work."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from swiftkv.data.chat import read_source
from swiftkv.data.long_prompts import text_counter
from swiftkv.data.packing import load_blocks
from swiftkv.data.passage_qa import (
    NAMES,
    QA_INSTRUCTION,
    SHIPPED_SETS_DIR,
    TRAIN_NAMES,
    eval_sentences,
    shares_text_with_eval,
    text_sentences,
)
from swiftkv.data.qa_mix import chat_passages, document_pieces, qa_prompt_documents, qa_prompts
from swiftkv.data.split import LongMix, split_documents
from swiftkv.data.tokens import prompt_ids
from swiftkv.distill.settings import settings_for
from swiftkv.replies import RepliesSettings, ReplyCache, reply_cache, write_replies
from tests.test_replies import fake_writer
from tests.tiny import tiny_tokenizer, write_jsonl

RANGE = (300, 600)  # prompt tokens of the tests' QA prompts (the tiny tokenizer counts words)


def prose(tag: str, sentences: int = 10) -> str:
    """A passage of English sentences that no other text holds (`tag` in each)."""
    return " ".join(
        f"This is sentence {j} of the reply {tag}, written for this test only." for j in range(sentences)
    )


def chat(reply: str, question: str = "Tell me something.") -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


def eval_passages(count: int) -> list[str]:
    lines = (SHIPPED_SETS_DIR / "passages-1500.jsonl").read_text().splitlines()
    return [p for line in lines for p in json.loads(line)["passages"]][:count]


def longest_sentence(text: str) -> str:
    return max((s for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s[-1:] in ".!?"), key=len)


def asked(path) -> list[str]:
    """The prompts the writer answered, from the replies file (each line is a chat record)."""
    return [example[-2]["content"] for example in read_source(str(path))]


def passages_of(prompt: str) -> list[str]:
    body = prompt.split("Question: ")[0]
    return [part.strip() for part in re.split(r"Passage \d+:\n", body)[1:]]


def test_qa_prompts_are_the_eval_prompt_over_train_passages_answered_whole(tmp_path):
    tokenizer = tiny_tokenizer()
    chats = [chat(prose(f"r{k}", sentences=5)) for k in range(120)]
    replies = ReplyCache(tmp_path / "replies.jsonl", fake_writer([]), tokenizer)
    documents = qa_prompt_documents(iter(chats), tokenizer, 3000, replies, 560, token_range=RANGE)
    assert sum(len(d.ids) for d in documents) >= 3000
    for document in documents:
        prompt = document.is_target.index(True)
        assert document.whole and prompt <= 560 and all(document.is_target[prompt:])
    prompts = asked(tmp_path / "replies.jsonl")  # one writer's batch: as many as the chats give
    assert len(prompts) > len(documents)
    used = []
    for prompt in prompts:
        assert prompt.startswith(QA_INSTRUCTION)
        name = next(n for n in TRAIN_NAMES if f" {n} " in prompt.rsplit("Question: ", 1)[1])
        passages = passages_of(prompt)
        assert len(passages) >= 4 and sum(f" {name} " in p for p in passages) == 1  # one passage answers
        assert sum(any(f" {n} " in p for n in TRAIN_NAMES) for p in passages) == 4  # the fact + 3 decoys
        used += re.findall(r"reply (r\d+),", prompt)
    assert len(used) == len(set(used)) * 5  # each reply (five sentences) serves one prompt
    again = qa_prompt_documents(
        iter(chats), tokenizer, 3000, ReplyCache(tmp_path / "again.jsonl", fake_writer([])), 560, RANGE
    )
    assert [d.ids for d in again] == [d.ids for d in documents]  # deterministic


def test_passages_are_prose_replies_and_pieces_of_pasted_documents():
    count = text_counter(tiny_tokenizer())
    paragraphs = [prose(f"d{k}", sentences=5) for k in range(6)]  # 60 words each
    pasted = "Summarise this for me please:\n\n" + "\n\n".join(paragraphs)
    pieces = document_pieces(pasted, count)
    assert pieces[0].startswith(paragraphs[0])  # the request before the pasted text is left out
    assert "\n\n".join(pieces) == "\n\n".join(paragraphs) and all(50 <= count(p) <= 400 for p in pieces)
    example = [
        {"role": "user", "content": pasted},
        {"role": "assistant", "content": prose("a")},
        {"role": "user", "content": "short question, no document"},
        {"role": "assistant", "content": "```python\nprint(1)\n```" + prose("code")},  # not prose
        {"role": "assistant", "content": "too short"},
    ]
    found = chat_passages(example, "chat 0", count)
    assert [p.text for p in found] == [*pieces, prose("a")]
    assert [p.source for p in found][-1] == "chat 0, turn 1, assistant"
    assert chat_passages("a plain text", "x", count) == [] and chat_passages(None, "x", count) == []


def test_no_passage_that_shares_a_sentence_with_the_eval_sets_is_used(tmp_path):
    """Copies of the shipped sets' passages, whole or one sentence of them inside fresh text, are dropped."""
    tokenizer = tiny_tokenizer()
    copies = eval_passages(12)
    one_sentence = [
        f"{prose(f'm{k}', 5)} {longest_sentence(p)} {prose(f'n{k}', 5)}" for k, p in enumerate(copies)
    ]
    fresh = [prose(f"f{k}") for k in range(40)]
    chats = [chat(text) for trio in zip(copies, one_sentence, fresh, strict=False) for text in trio] + [
        chat(text) for text in fresh[12:]
    ]
    count = text_counter(tokenizer)
    kept = [p.text for e in chats for p in chat_passages(e, "x", count)]
    assert kept == fresh  # every copy dropped, every fresh reply kept
    assert all(shares_text_with_eval(text) for text in copies + one_sentence)
    prompts = [m[0]["content"] for m, _ in qa_prompts(iter(chats), tokenizer, count, RANGE)]
    assert prompts and all(text_sentences(p).isdisjoint(eval_sentences()) for p in prompts)


def test_train_fact_names_are_none_of_the_evals():
    assert not set(TRAIN_NAMES) & set(NAMES) and len(set(TRAIN_NAMES)) == len(TRAIN_NAMES) >= 4


@pytest.mark.slow  # streams the 125 MB ShareGPT file
def test_on_sharegpt_no_train_prompt_holds_an_eval_passages_sentence():
    """ShareGPT repeats conversations across records: some train records hold sentences of the held-out
    passages the eval sets are built from. Those passages are dropped, and no QA prompt holds any of them."""
    tokenizer = tiny_tokenizer()
    count = text_counter(tokenizer)
    chats = list(itertools.islice(read_source("sharegpt"), 1500))
    replies = [m["content"] for e in chats if e for m in e if m["role"] == "assistant"]
    assert sum(shares_text_with_eval(text) for text in replies) > 10  # the check has duplicates to catch
    prompts = [m[0]["content"] for m, _ in qa_prompts(iter(chats), tokenizer, count, (1000, 1800))]
    assert len(prompts) > 50
    assert all(text_sentences(p).isdisjoint(eval_sentences()) for p in prompts)


def test_the_split_puts_qa_prompts_after_the_first_prompts_and_leaves_the_held_out_alone(tmp_path):
    tokenizer = tiny_tokenizer()
    examples = [chat(prose(f"r{k}"), question="w1 w2 w3") for k in range(300)]
    cache = ReplyCache(tmp_path / "replies.jsonl", fake_writer([]), tokenizer)
    plain_held, plain = split_documents(examples, tokenizer, 0, 512, 6000, replies=cache)
    held, mixed = split_documents(
        examples, tokenizer, 0, 512, 6000, replies=cache, long_mix=LongMix(0.5, 1200, "passage-qa")
    )
    assert [d.ids for d in held] == [d.ids for d in plain_held]
    short = [d for d in mixed if not d.whole]
    assert [d.ids for d in short] == [d.ids for d in plain[: len(short)]]
    long = [d for d in mixed if d.whole]
    assert 3000 <= sum(len(d.ids) for d in long) <= 3000 + 1200 + 6  # the last one may pass it
    assert sum(p.startswith(QA_INSTRUCTION) for p in asked(tmp_path / "replies.jsonl")) >= len(long)


def test_the_replies_stage_writes_every_qa_answer_distill_reads(tmp_path, monkeypatch):
    monkeypatch.setattr("swiftkv.replies.stage.reply_generator", lambda settings, eos: fake_writer([]))
    records = [{"messages": chat(prose(f"r{k}"), question=f"w1 w2 w{k % 90}")} for k in range(1200)]
    data = str(write_jsonl(tmp_path / "chats.jsonl", records))
    settings = RepliesSettings(
        source="unused",
        out=str(tmp_path / "replies.jsonl"),
        data=data,
        tokens=12000,
        heldout_tokens=1600,
        long_share=0.5,
        long_kind="passage-qa",
        long_prompt_tokens=1500,
    )
    tokenizer = tiny_tokenizer()
    assert write_replies(settings, tokenizer).generated > 0
    reader = reply_cache(settings, tokenizer, may_generate=False)  # refuses any reply the stage did not write
    train, _ = load_blocks(
        data, tokenizer, 1600, 12000, 1600, seed=0, replies=reader, long_mix=settings.long_mix()
    )
    qa = [p for p in asked(tmp_path / "replies.jsonl") if p.startswith(QA_INSTRUCTION)]
    shortest = min(len(prompt_ids(tokenizer, [{"role": "user", "content": p}])) for p in qa)
    assert shortest > 900 and bool((train.position_ids >= shortest).any())  # QA prompts, each in one piece


def test_distill_asks_the_replies_stage_for_its_kind_of_long_prompts():
    replies = settings_for("tiny", long_share=0.25, long_kind="passage-qa", seq_len=2048).replies_settings()
    assert replies.long_mix() == LongMix(0.25, 2048 - 64 - 1, "passage-qa")
    assert settings_for("tiny", long_share=0.25, seq_len=2048).replies_settings().long_mix().kind == "chat"


@pytest.mark.parametrize(
    ("given", "message", "replies_too"),
    [
        ({"long_kind": "passage-qa"}, "expected --long-share S too", True),
        ({"long_kind": "rag", "long_share": 0.3}, r"expected one of \['chat', 'passage-qa'\]", True),
        (
            {"long_kind": "passage-qa", "long_share": 0.3},
            "expected --seq-len of at least 1193, got 1024",
            False,
        ),
    ],
)
def test_bad_long_kind_is_one_clear_error(given, message, replies_too, tmp_path):
    with pytest.raises(ValueError, match=message):
        settings_for("tiny", **given, **({"seq_len": 2048} if replies_too else {})).check_written_replies()
    if replies_too:  # the replies stage refuses it too, before it loads anything
        with pytest.raises(ValueError, match=message):
            write_replies(RepliesSettings(source="unused", data=str(tmp_path / "none.jsonl"), **given))
