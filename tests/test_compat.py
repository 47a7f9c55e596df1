"""What other SwiftKV readers see in our folders: transformers 4.x (ArcticTraining's model code,
older vLLM) reads RoPE from the top-level `rope_theta` / `rope_scaling` keys alone."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import swiftkv  # noqa: F401 - registers the Auto classes
from swiftkv.convert import ConvertSettings, convert
from swiftkv.model.config import add_legacy_rope_keys
from tests.tiny import WORDS, random_student, save_tiny_teacher

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


def legacy_inv_freq(config: dict) -> torch.Tensor:
    """transformers 4.x's default RoPE frequencies, from the config file's keys alone (its fallback
    for a missing `rope_theta` is 10000)."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    theta = config.get("rope_theta", 10000.0)
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def test_converted_folder_carries_the_rope_base_for_legacy_readers(tmp_path):
    teacher = save_tiny_teacher(
        tmp_path / "teacher", "llama", rope_parameters={"rope_type": "default", "rope_theta": 100000.0}
    )
    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(3000)))
    convert(
        ConvertSettings(
            source=str(teacher),
            out=tmp_path / "skv",
            num_key_value_layers=3,
            key_value_group_size=1,
            init="copy",
            calib_data=str(calib),
            calib_tokens=512,
            eval_tokens=256,
        )
    )
    config = json.loads((tmp_path / "skv" / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert "rope_scaling" not in config or config["rope_scaling"] is None
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "skv")
    v5_inv_freq = model.model.rotary_emb.inv_freq.double()
    assert torch.allclose(legacy_inv_freq(config), v5_inv_freq, rtol=1e-6)


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, {"rope_type": "default", "rope_theta": 250000.0}])
def test_saved_swiftkv_config_and_base_folders_write_consistent_legacy_keys(tmp_path, rope):
    _, student = random_student("llama", 3, rope_parameters=dict(rope), max_position_embeddings=512)
    student.save_pretrained(tmp_path / "student")  # what distillation writes
    teacher = save_tiny_teacher(tmp_path / "teacher", "llama", rope_parameters=dict(rope))
    add_legacy_rope_keys(teacher)  # what the GGUF export and the plain teacher get
    for folder in (tmp_path / "student", teacher):
        config = json.loads((folder / "config.json").read_text())
        assert config["rope_theta"] == rope["rope_theta"]
        if rope["rope_type"] == "default":
            assert config.get("rope_scaling") is None
        else:
            assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
        # transformers 5 still reads rope_parameters (and takes it over the legacy keys)
        reloaded = AutoModelForCausalLM.from_pretrained(folder).config
        assert reloaded.rope_parameters["rope_theta"] == rope["rope_theta"]
