"""`--data A,B:2,C`: sources interleaved by weight (`swiftkv.data.chat`), as Snowflake's recipes mix their
chat sets: the exact order, sources that run out, any single source kind inside a mix, and bad parts."""

import pytest

from swiftkv.data.chat import interleave, mix_parts, read_source
from tests.tiny import write_jsonl


def chats(tag: str, count: int) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": f"{tag}{i}"}, {"role": "assistant", "content": "ok"}]}
        for i in range(count)
    ]


def tags(examples) -> list[str]:
    return [example[0]["content"] for example in examples]


def test_parts_and_weights():
    assert mix_parts("a.jsonl,b.jsonl:2,c") == [("a.jsonl", 1.0), ("b.jsonl", 2.0), ("c", 1.0)]
    assert mix_parts("sharegpt:0.5, d/") == [("sharegpt", 0.5), ("d/", 1.0)]
    assert mix_parts("one.jsonl") == [("one.jsonl", 1.0)]
    assert mix_parts("sharegpt", single=("sharegpt",)) == [("sharegpt", 1.0)]
    for bad, why in [
        ("a.jsonl:0,b", "positive weight"),
        ("a,,b", "empty source"),
        (":2,b", "needs a source"),
    ]:
        with pytest.raises(ValueError, match=why):
            mix_parts(bad)


def test_a_path_that_exists_is_one_source_whatever_its_name(tmp_path):
    odd = write_jsonl(tmp_path / "a,b:2.jsonl", chats("x", 2))
    assert mix_parts(str(odd)) == [(str(odd), 1.0)]
    assert tags(read_source(str(odd))) == ["x0", "x1"]


def test_interleaving_is_smooth_and_keeps_every_item():
    mixed = list(interleave([iter("aaaa"), iter("bbbbbbbbbb"), iter("cc")], [1, 2, 1]))
    # b twice for each a and each c, spread out (abcb); after c and then a run out, the rest of b
    assert "".join(mixed) == "abcbabcbabbabbbb"
    assert "".join(interleave([iter("aaa"), iter("bbbbbb")], [1, 2])) == "abbabbabb"
    assert sorted(mixed) == sorted("aaaa" + "b" * 10 + "cc")


def test_read_source_mixes_files_and_a_datasets_folder(tmp_path):
    import datasets

    a = write_jsonl(tmp_path / "a.jsonl", chats("a", 3))
    folder = tmp_path / "b"
    datasets.Dataset.from_list(chats("b", 5)).save_to_disk(str(folder))
    mixed = tags(read_source(f"{a},{folder}:2"))
    assert mixed == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "b4"]
    assert tags(read_source(f"{a}:3")) == ["a0", "a1", "a2"]  # one source: a weight alone changes nothing


def test_a_missing_part_is_named_before_anything_is_read(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", chats("a", 1))
    with pytest.raises(FileNotFoundError, match=r"--data '.*missing\.jsonl': no such file"):
        next(read_source(f"{a},{tmp_path / 'missing.jsonl'}:2"))
