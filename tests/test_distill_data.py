"""Distillation data: assistant mask, shifted alignment, packing without cross-document attention."""

import json

import pytest
import torch

from swiftkv.data.chat import read_source
from swiftkv.data.packing import load_blocks, pack
from swiftkv.data.sharegpt import iter_json_array
from swiftkv.data.tokens import Document, tokenize
from tests.tiny import random_chats, tiny_student, tiny_tokenizer, write_jsonl


def test_assistant_mask_is_shifted_onto_the_predicting_positions():
    tokenizer = tiny_tokenizer()
    messages = [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3 w4"}]
    document = tokenize(tokenizer, messages)
    words = tokenizer.convert_ids_to_tokens(document.ids)
    assert words == [
        "<|im_start|>",
        "user",
        "w1",
        "w2",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
        "w3",
        "w4",
        "<|im_end|>",
    ]
    # The assistant's content and its end-of-turn token are targets; the role header is not.
    assert document.is_target == [False] * 7 + [True] * 3
    blocks = pack([document], seq_len=10)
    # Position t predicts token t+1: positions 6 ("assistant"), 7 ("w3"), 8 ("w4") are trained.
    assert blocks.loss_mask[0].tolist() == [False] * 6 + [True] * 3 + [False]
    assert blocks.position_ids[0].tolist() == list(range(10))


def test_only_assistant_turns_are_targets_in_a_multi_turn_chat():
    tokenizer = tiny_tokenizer()
    messages = [
        {"role": "system", "content": "w9"},
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": "w2"},
        {"role": "user", "content": "w3"},
        {"role": "assistant", "content": "w4 w5"},
    ]
    document = tokenize(tokenizer, messages)
    targets = [
        t
        for t, flag in zip(tokenizer.convert_ids_to_tokens(document.ids), document.is_target, strict=True)
        if flag
    ]
    assert targets == ["w2", "<|im_end|>", "w4", "w5", "<|im_end|>"]


def test_packing_restarts_positions_and_masks_document_boundaries():
    a = Document([10, 11, 12], [True, True, True])
    b = Document([20, 21, 22, 23, 24], [False, True, True, True, True])
    blocks = pack([a, b], seq_len=4)  # 8 tokens -> 2 blocks; b is cut by the block boundary
    assert blocks.input_ids.tolist() == [[10, 11, 12, 20], [21, 22, 23, 24]]
    assert blocks.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 2, 3]]
    # Position 2 (last of a) must not be trained on b's first token; last position of a block has no target.
    assert blocks.loss_mask.tolist() == [[True, True, False, False], [True, True, True, False]]


def test_packed_block_logits_equal_each_document_alone():
    model = tiny_student()
    model.set_swiftkv(True)
    a, b = torch.randint(0, 128, (1, 7)), torch.randint(0, 128, (1, 9))
    blocks = pack([Document(a[0].tolist(), [True] * 7), Document(b[0].tolist(), [True] * 9)], seq_len=16)
    with torch.no_grad():
        packed = model(input_ids=blocks.input_ids, position_ids=blocks.position_ids, use_cache=False).logits[
            0
        ]
        alone = torch.cat([model(input_ids=a).logits[0], model(input_ids=b).logits[0]])
    assert (packed - alone).abs().max().item() < 1e-5


def test_split_is_deterministic_and_disjoint(tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(40))
    tokenizer = tiny_tokenizer()
    first = load_blocks(str(data), tokenizer, seq_len=32, train_tokens=640, heldout_tokens=128, seed=3)
    again = load_blocks(str(data), tokenizer, seq_len=32, train_tokens=640, heldout_tokens=128, seed=3)
    other = load_blocks(str(data), tokenizer, seq_len=32, train_tokens=640, heldout_tokens=128, seed=4)
    assert torch.equal(first[0].input_ids, again[0].input_ids) and torch.equal(
        first[1].input_ids, again[1].input_ids
    )
    assert not torch.equal(first[0].input_ids, other[0].input_ids)
    train_rows = {tuple(r) for r in first[0].input_ids.tolist()}
    assert not train_rows & {tuple(r) for r in first[1].input_ids.tolist()}
    assert len(first[0]) == 20 and len(first[1]) == 4


def test_passes_repeat_the_train_blocks_each_in_a_new_order(tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(40))
    tokenizer = tiny_tokenizer()
    once, held = load_blocks(str(data), tokenizer, seq_len=32, train_tokens=640, heldout_tokens=128, seed=3)
    twice, held2 = load_blocks(
        str(data), tokenizer, seq_len=32, train_tokens=640, heldout_tokens=128, seed=3, passes=2
    )
    assert len(twice) == 2 * len(once) == 40 and torch.equal(held.input_ids, held2.input_ids)
    first, second = twice.input_ids[:20], twice.input_ids[20:]
    assert torch.equal(first, once.input_ids)  # pass 0 is the one-pass run's order
    assert sorted(map(tuple, second.tolist())) == sorted(map(tuple, first.tolist()))  # the same blocks
    assert not torch.equal(first, second)  # in another order


def test_truncated_json_array_yields_the_complete_records(tmp_path):
    records = [
        {"conversations": [{"from": "human", "value": f"w{i}"}, {"from": "gpt", "value": "w5"}]}
        for i in range(3)
    ]
    text = json.dumps(records)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex("{") + 10])  # the last record is cut mid-way
    assert len(list(iter_json_array(path))) == 2
    assert next(read_source(str(path)))[1] == {"role": "assistant", "content": "w5"}


def test_text_folder_and_saved_dataset_are_read(tmp_path):
    import datasets

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("w1 w2 w3")
    assert list(read_source(str(tmp_path / "docs"))) == ["w1 w2 w3"]
    datasets.Dataset.from_list(random_chats(2)).save_to_disk(str(tmp_path / "ds"))
    examples = list(read_source(str(tmp_path / "ds")))
    assert len(examples) == 2 and examples[0][1]["role"] == "assistant"


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no usable examples"),
        (json.dumps({"messages": [{"role": "user", "content": "w1"}]}) + "\n", "no usable examples"),
        ("not json\n", "not a JSON line"),
    ],
)
def test_bad_data_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_blocks(str(path), tiny_tokenizer(), seq_len=8, train_tokens=64, heldout_tokens=8, seed=0)


def test_missing_data_names_the_path():
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        list(read_source("/nowhere.jsonl"))


LATIN1 = b'{"text": "caf\xe9"}'  # é in Latin-1: not UTF-8


@pytest.mark.parametrize(
    "name, data",
    [
        ("bad.jsonl", json.dumps(random_chats(1)[0]).encode() + b"\n" + LATIN1 + b"\n"),
        ("bad.json", b"[" + json.dumps(random_chats(1)[0]).encode() + b",\n" + LATIN1 + b"]"),
    ],
)
def test_invalid_utf8_names_file_line_and_byte(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    offset = data.index(b"\xe9")
    expected = f"{path}:2: invalid UTF-8 (byte 0xe9 at byte offset {offset}); expected UTF-8 encoded JSON"
    with pytest.raises(ValueError) as error:
        list(read_source(str(path)))
    assert str(error.value) == expected
