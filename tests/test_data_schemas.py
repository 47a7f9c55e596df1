"""`--data`: every record layout of `swiftkv.data.schemas` read from JSONL and from a `save_to_disk` folder,
exact seeded sample counts (`SOURCE:COUNT`), repeated `--data` mixed by count, and the bad inputs (a record
of no layout, a count over the source, a dataset name that cannot be loaded offline)."""

import json

import datasets
import pytest

from swiftkv.cli.__main__ import main
from swiftkv.data.mixture import Part, check_data, parse_part, read_data
from swiftkv.data.schemas import LAYOUTS
from tests.tiny import random_chats, save_tiny_folder, write_jsonl

ASK, SAY = "What is 2 + 2?", "4."
CHAT = [{"role": "user", "content": ASK}, {"role": "assistant", "content": SAY}]

# One record of each layout and the messages it must read as.
LAYOUT_CASES = {
    "messages": ({"messages": CHAT}, CHAT),
    "acemath": ({"messages": CHAT[:1], "answer": SAY}, CHAT),
    "sharegpt from/value": (
        {"conversations": [{"from": "human", "value": ASK}, {"from": "gpt", "value": SAY}]},
        CHAT,
    ),
    "sharegpt role/content": ({"conversations": CHAT}, CHAT),
    "lmsys conversation": ({"conversation": CHAT, "model": "x"}, CHAT),
    "openorca": (
        {"id": "o1", "system_prompt": "Be brief.", "question": ASK, "response": SAY},
        [{"role": "system", "content": "Be brief."}, *CHAT],
    ),
    "openorca no system": ({"system_prompt": "", "question": ASK, "response": SAY}, CHAT),
    "alpaca": (
        {"instruction": "Add.", "input": "2 + 2", "output": SAY},
        [{"role": "user", "content": "Add.\n\n2 + 2"}, CHAT[1]],
    ),
    "alpaca no input": ({"instruction": ASK, "input": "", "output": SAY}, CHAT),
    "dolly": (
        {"instruction": ASK, "context": "Arithmetic.", "response": SAY, "category": "qa"},
        [{"role": "user", "content": f"{ASK}\n\nArithmetic."}, CHAT[1]],
    ),
    "prompt/response": ({"prompt": ASK, "response": SAY}, CHAT),
    "prompt/completion": ({"prompt": ASK, "completion": SAY}, CHAT),
    "text": ({"text": "plain words"}, "plain words"),
}


def saved_dataset(folder, records):
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    return folder


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_each_layout_reads_from_jsonl_and_from_a_saved_dataset(tmp_path, case):
    record, expected = LAYOUT_CASES[case]
    jsonl = write_jsonl(tmp_path / "data.jsonl", [record, record])
    folder = saved_dataset(tmp_path / "saved", [record, record])
    assert list(read_data(str(jsonl))) == [expected, expected]
    assert list(read_data(str(folder))) == [expected, expected]
    assert list(read_data(f"{folder}:1", seed=3)) == [expected]


def test_every_layout_of_the_table_is_tested():
    tested = {tuple(sorted(k for k, v in r.items() if v is not None)) for r, _ in LAYOUT_CASES.values()}
    for layout in LAYOUTS:
        assert any(set(layout.columns) <= set(columns) for columns in tested), layout.name


def test_a_record_of_no_layout_names_its_columns_and_the_layouts_that_fit(tmp_path):
    data = write_jsonl(tmp_path / "odd.jsonl", [{"question": ASK, "answer": SAY}])
    with pytest.raises(ValueError) as error:
        list(read_data(str(data)))
    message = str(error.value)
    assert f"{data}:1" in message and "['answer', 'question']" in message
    assert "system_prompt/question/response (OpenOrca)" in message and "prompt/completion" in message


def tagged(count):
    return [{"prompt": f"q{i}", "response": "a"} for i in range(count)]


def tags(examples):
    return [example[0]["content"] for example in examples]


def test_counts_are_exact_seeded_and_the_same_from_jsonl_and_saved(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", tagged(100))
    folder = saved_dataset(tmp_path / "a", tagged(100))
    first = tags(read_data(f"{jsonl}:30", seed=1))
    assert len(first) == len(set(first)) == 30
    assert tags(read_data(f"{jsonl}:30", seed=1)) == first  # the seed decides
    assert tags(read_data(f"{jsonl}:30", seed=2)) != first
    assert tags(read_data(f"{folder}:30", seed=1)) == first
    assert tags(read_data(f"{jsonl}:all")) == tags(read_data(str(jsonl))) == [f"q{i}" for i in range(100)]
    assert len(list(read_data("sharegpt:1k", seed=0))) == 1000  # records; a chat with no reply reads as None


def test_repeated_sources_mix_in_proportion_to_their_counts(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "response": "x"} for i in range(50)])
    b = saved_dataset(tmp_path / "b", [{"instruction": f"b{i}", "output": "y"} for i in range(80)])
    mixed = tags(read_data((f"{a}:10", f"{b}:20"), seed=4))
    assert len(mixed) == 30 and sum(t.startswith("a") for t in mixed) == 10
    assert [t[0] for t in mixed[:6]] == ["a", "b", "b", "a", "b", "b"]  # smooth: every stretch in proportion


def test_part_grammar():
    assert parse_part("Open-Orca/OpenOrca:500k") == Part("Open-Orca/OpenOrca", 500_000)
    assert parse_part("x.jsonl:all") == Part("x.jsonl")
    assert parse_part("org/name@test") == Part("org/name@test")
    with pytest.raises(ValueError, match="at least 1 record"):
        parse_part("x.jsonl:0")


def test_a_count_over_the_source_names_both_numbers(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", tagged(12))
    with pytest.raises(ValueError, match=r"asks for 13 records, but the source holds 12.*:all"):
        check_data(f"{jsonl}:13")


def test_bad_data_is_one_error_before_the_model_loads(tmp_path, capsys):
    """The distill and replies commands refuse before loading: the 'model' folder holds no weights at all,
    so any later error would be about the model, not the data."""
    folder = save_tiny_folder(tmp_path / "student")
    chats = write_jsonl(tmp_path / "chats.jsonl", random_chats(5, seed=1))
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    cases = [
        (["--data", "nobody/no-such-dataset:100"], ["nobody/no-such-dataset", "HF_HUB_OFFLINE"]),
        (["--data", str(chats), "--data", f"{chats}:6"], ["asks for 6 records", "holds 5"]),
    ]
    for command in (["distill", str(folder), "--out", str(tmp_path / "o")], ["replies", str(folder)]):
        for data, words in cases:
            assert main([*command, *data]) == 2
            errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
            assert len(errors) == 1 and all(w in errors[0] for w in words), errors


def test_repeated_data_options_become_a_tuple_setting(tmp_path):
    import argparse

    from swiftkv.cli.options import add_dataclass_options, given_values
    from swiftkv.distill.sections import DataSettings
    from swiftkv.distill.settings import DistillSettings

    parser = argparse.ArgumentParser()
    add_dataclass_options(parser, DataSettings)  # the data section's --data, given by its key "data"
    assert given_values(parser.parse_args(["--data", "a:5"]), DataSettings)["data"] == "a:5"
    both = given_values(parser.parse_args(["--data", "a:5", "--data", "b:all"]), DataSettings)
    assert both["data"] == ("a:5", "b:all")
    assert json.loads(json.dumps(DistillSettings.of(source="m", data=both["data"]).as_json()))["data"] == [
        "a:5",
        "b:all",
    ]


def test_the_data_command_writes_the_sample_as_chat_jsonl(tmp_path, capsys):
    source = saved_dataset(
        tmp_path / "orca",
        [LAYOUT_CASES["openorca"][0]] * 9 + [{"system_prompt": "", "question": "q", "response": "r"}],
    )
    out = tmp_path / "openorca.jsonl"
    assert main(["data", "--data", f"{source}:4", "--seed", "2", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["messages"] for r in written] == list(read_data(f"{source}:4", seed=2))
    assert list(read_data(str(out))) == list(read_data(f"{source}:4", seed=2))
    assert main(["data", "--data", f"{source}:11", "--out", str(tmp_path / "no.jsonl")]) == 2
    assert not (tmp_path / "no.jsonl").exists()


def test_a_dataset_name_without_split_reads_data_split(tmp_path, capsys):
    """--data-split reaches datasets.load_dataset: the refusal of a name names the split it asked for."""
    for split in ("train", "test"):
        with pytest.raises(ValueError, match=f"nobody/none@{split}: .*split='{split}'.*HF_HUB_OFFLINE"):
            check_data("nobody/none", split=split)
    with pytest.raises(ValueError, match="nobody/none@dev"):
        check_data("nobody/none@dev", split="test")  # NAME@SPLIT wins
