"""The shipped distilled models: `swiftkv export <alias>` = the wheel's SmolLM2 + the committed
SwiftKV tensors (+ the student's rank-r change of its later layers, for a `--trainable lora` student),
loadable with AutoModelForCausalLM, and it answers the Paris question."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import swiftkv  # noqa: F401 - registers the Auto classes
from swiftkv.model.surgery import split_student_deltas
from swiftkv.sources import WEIGHTS_DIR, export, load_model, load_tokenizer

pytestmark = pytest.mark.slow
ALIASES = {"smollm2-135m-instruct-swiftkv50": 15, "smollm2-135m-instruct-swiftkv25": 22}


@pytest.fixture(scope="module")
def base_state():
    return load_model("smollm2-135m-instruct").state_dict()


def greedy_answer(model, tokenizer, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_exported_alias_is_the_base_model_plus_the_committed_tensors(tmp_path, base_state, alias):
    spec = json.loads((WEIGHTS_DIR / alias / "swiftkv.json").read_text())
    trained = spec.pop("student_trained", [])
    rank = spec.pop("student_rank", None)
    assert spec == {
        "base": "smollm2-135m-instruct",
        "num_key_value_layers": ALIASES[alias],
        "key_value_group_size": 1,
    }
    assert trained in ([], ["self_attn.o_proj", "mlp"]) and (rank is None) == (not trained)
    export(alias, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert model.config.swiftkv is True and model.config.num_key_value_layers == ALIASES[alias]
    committed, deltas = split_student_deltas(load_file(WEIGHTS_DIR / alias / "swiftkv.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor.float()) for name, tensor in committed.items())
    # The student's own change: weight = base + delta_b @ delta_a, only on the later layers' trained modules.
    changed = {key.removesuffix(".delta_b") for key in deltas if key.endswith(".delta_b")}
    assert bool(changed) == bool(trained)
    for name in changed:
        assert int(name.split(".")[2]) >= ALIASES[alias] and any(f".{m}." in name for m in trained), name
        delta = deltas[name + ".delta_b"].float() @ deltas[name + ".delta_a"].float()
        assert delta.shape == base_state[name].shape and torch.linalg.matrix_rank(delta) <= rank
        assert torch.equal(state[name], base_state[name] + delta)
    shared = [name for name in base_state if name in state]
    assert len(shared) == len(base_state)
    assert all(torch.equal(state[n], base_state[n]) for n in shared if n not in changed)
    answer = greedy_answer(model, load_tokenizer(tmp_path / "out"), "What is the capital of France?")
    assert answer.startswith("The capital of France is Paris"), answer  # in English, as the teacher


@pytest.mark.parametrize("alias", ALIASES)
def test_a_shipped_student_is_a_starting_point_for_its_own_recipe(alias):
    """`distill --init-from ALIAS`: each shipped student names a folder whose tensors map one to one
    onto a run of its recipe at the folder's rank (SwiftKV parameters, adapters' factors) over a
    conversion of its base with its N; a run of another N or rank is refused, naming what differs."""
    from swiftkv.distill.settings import settings_for
    from swiftkv.distill.start.decide import check_weights_student
    from swiftkv.distill.start.from_weights import weights_folder, weights_trained

    folder = weights_folder(alias)
    assert folder == WEIGHTS_DIR / alias
    converted = {
        "swiftkv_conversion": {"source": "smollm2-135m-instruct"},
        "num_key_value_layers": ALIASES[alias],
    }
    rank = json.loads((folder / "swiftkv.json").read_text())["student_rank"]
    settings = settings_for("n", "swiftkv-lora", init_from=alias, lora_rank=rank)
    check_weights_student(folder, settings.model, converted)
    with pytest.raises(ValueError, match=f"student_rank: folder {rank} vs this run {rank // 2}"):
        other_rank = settings_for("n", "swiftkv-lora", init_from=alias, lora_rank=rank // 2)
        check_weights_student(folder, other_rank.model, converted)
    with pytest.raises(ValueError, match="num_key_value_layers: folder .* vs this run 7"):
        check_weights_student(folder, settings.model, {**converted, "num_key_value_layers": 7})
    trained = weights_trained(folder)
    assert sum(name.endswith(".lora_b") for name in trained) == 4 * (30 - ALIASES[alias])
    assert all(t.dtype == torch.float32 for t in trained.values())


@pytest.mark.parametrize("alias", ALIASES)
def test_a_run_on_from_a_shipped_student_takes_its_rank_unless_one_is_given(alias):
    """`distill --recipe swiftkv-lora --init-from ALIAS` without --lora-rank trains at the folder's rank
    (the shipped soups' 128, not the recipe's 64); a --lora-rank given stays, to be refused if it differs;
    a run of another trainable set, or from no folder, keeps its settings."""
    from swiftkv.distill.settings import settings_for
    from swiftkv.distill.start.from_weights import with_folder_rank

    rank = json.loads((WEIGHTS_DIR / alias / "swiftkv.json").read_text())["student_rank"]
    assert rank != 64  # the recipe's, so the test tells them apart
    taken = with_folder_rank(settings_for("n", "swiftkv-lora", init_from=alias), rank_given=False)
    assert taken.model.lora_rank == rank
    given = settings_for("n", "swiftkv-lora", init_from=alias, lora_rank=64)
    assert with_folder_rank(given, rank_given=True) == given
    plain = settings_for("n", "swiftkv", init_from=alias)
    assert with_folder_rank(plain, rank_given=False) == plain
    fresh = settings_for("n", "swiftkv-lora")
    assert with_folder_rank(fresh, rank_given=False) == fresh
