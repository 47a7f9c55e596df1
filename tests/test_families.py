"""The family registry and the newer families' formats: Qwen3 in the layout of ArcticTraining's qwen3
branch (loads with no missing or unexpected keys), the fork layout refused, Mistral converted into the
Llama family with its own head_dim, sliding windows refused; every hand-written family list reads the
registry."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, MistralConfig, Qwen2Config

import swiftkv
from swiftkv.model.config import SwiftKVConfigError
from swiftkv.model.families import FAMILIES, SOURCE_FAMILIES, family_of
from swiftkv.model.surgery import auto_shim_source, build_swiftkv_model, swiftkv_config
from tests.tiny import byte_tokenizer, random_teacher, tiny_base_kwargs, write_tiny_gguf

LAYERS, N = 6, 2


def branch_layout_names(n: int, g: int, layers: int = LAYERS) -> set[str]:
    """The SwiftKV tensor names of ArcticTraining's qwen3 branch, written out by hand: q_proj_swiftkv
    and q_norm_swiftkv on every later layer, k/v_proj_swiftkv and k_norm_swiftkv on group owners only."""
    names = {"model.norm_swiftkv.weight"}
    for i in range(n, layers):
        names |= {
            f"model.layers.{i}.self_attn.q_proj_swiftkv.weight",
            f"model.layers.{i}.self_attn.q_norm_swiftkv.weight",
        }
        if (i - n) % g == 0:
            names |= {
                f"model.layers.{i}.self_attn.{m}.weight"
                for m in ("k_proj_swiftkv", "k_norm_swiftkv", "v_proj_swiftkv")
            }
    return names


def write_qwen3_swiftkv_folder(folder, g: int, extra_config: dict | None = None):
    """A qwen3_swiftkv folder written by hand (config.json + safetensors), not by our model class."""
    teacher = random_teacher("qwen3")
    config = {
        **teacher.config.to_dict(),
        "model_type": "qwen3_swiftkv",
        "architectures": ["Qwen3SwiftKVForCausalLM"],
        "swiftkv": True,
        "num_key_value_layers": N,
        "key_value_group_size": g,
        **(extra_config or {}),
    }
    tensors = {k: v.contiguous() for k, v in teacher.state_dict().items()}
    hidden, head_dim, heads, kv_heads = 64, 24, 4, 2
    shapes = {
        "q_proj_swiftkv": (heads * head_dim, hidden),
        "k_proj_swiftkv": (kv_heads * head_dim, hidden),
        "v_proj_swiftkv": (kv_heads * head_dim, hidden),
        "q_norm_swiftkv": (head_dim,),
        "k_norm_swiftkv": (head_dim,),
        "norm_swiftkv": (hidden,),
    }
    for name in branch_layout_names(N, g):
        tensors[name] = torch.randn(shapes[name.split(".")[-2]])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.mark.parametrize("g", [1, 2])
def test_qwen3_branch_layout_loads_with_no_missing_or_unexpected_keys(tmp_path, g):
    tensors = write_qwen3_swiftkv_folder(tmp_path / "m", g)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "m", output_loading_info=True)
    assert type(model).__name__ == "Qwen3SwiftKVForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    state = model.state_dict()
    assert {k for k in state if "swiftkv" in k} == branch_layout_names(N, g)
    for name in branch_layout_names(N, g):
        assert torch.equal(state[name], tensors[name])


def test_qwen3_fork_layout_is_refused(tmp_path):
    write_qwen3_swiftkv_folder(tmp_path / "fork", 1, {"kv_sharing_map": {"3": 2, "4": 2, "5": 2}})
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(SwiftKVConfigError, match="kv_sharing_map.*fork of ArcticTraining"):
            load(tmp_path / "fork")


def test_mistral_converts_into_the_llama_family_with_its_head_dim():
    teacher = random_teacher("mistral")
    model = build_swiftkv_model(teacher, N, 2)
    assert model.config.model_type == "llama_swiftkv" and model.config.head_dim == 24
    assert model.model.layers[N].self_attn.k_proj_swiftkv.out_features == 2 * 24
    assert "sliding_window" not in model.config.to_dict()
    assert family_of("mistral") is FAMILIES["llama"]


@pytest.mark.parametrize(
    "config",
    [
        MistralConfig(**tiny_base_kwargs(), head_dim=24, sliding_window=64),  # window < context (512)
        Qwen2Config(**tiny_base_kwargs(), use_sliding_window=True, sliding_window=64, max_window_layers=0),
    ],
    ids=["mistral", "qwen2"],
)
def test_sliding_window_sources_are_refused(config):
    with pytest.raises(ValueError, match="sliding-window attention.*sliding_window=64"):
        swiftkv_config(config, N, 1)


def test_a_window_as_long_as_the_context_converts():
    config = MistralConfig(**tiny_base_kwargs(), head_dim=24, sliding_window=512)
    assert swiftkv_config(config, N, 1).model_type == "llama_swiftkv"


def test_every_family_is_exported_registered_and_in_the_shim():
    shim = auto_shim_source()
    for family in FAMILIES.values():
        for cls in (family.config_class, family.model_class):
            assert getattr(swiftkv, cls.__name__) is cls and cls.__name__ in swiftkv.__all__
            assert cls.__name__ in shim
        assert AutoConfig.for_model(family.swiftkv_type).__class__ is family.config_class
        assert family.swiftkv_type in shim
    assert set(SOURCE_FAMILIES) == {
        *(
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "qwen3_moe",
            "qwen2_moe",
            "mixtral",
            "deepseek_v2",
            "deepseek_v3",
        )
    }


def test_unsupported_model_type_names_the_families():
    with pytest.raises(ValueError, match=r"Llama, Mistral, Mixtral, Qwen2, Qwen2Moe, Qwen3, Qwen3Moe"):
        family_of("gemma")


@pytest.mark.parametrize(
    "arch, name, family, shape",
    [
        # transformers' GGUF loader gives Qwen3 its config default head_dim (128): the file must agree
        ("qwen3", "tiny-qwen3", "qwen3", {"head_dim": 128}),
        # llama.cpp writes Mistral as architecture `llama`: it loads as Llama, with the file's head_dim (24)
        ("mistral", "Mistral-tiny-v0.3", "llama", {}),
    ],
    ids=["qwen3", "mistral"],
)
def test_gguf_sources_load_exactly_and_convert(tmp_path, arch, name, family, shape):
    from swiftkv.sources import load_model, load_tokenizer, resolve_source

    tokenizer = byte_tokenizer()
    teacher = random_teacher(arch, vocab_size=len(tokenizer), **shape)
    folder = resolve_source(write_tiny_gguf(tmp_path / f"{name}.gguf", teacher, tokenizer, name))
    loaded = load_model(folder)
    assert loaded.config.model_type == family and loaded.config.head_dim == teacher.config.head_dim
    x = torch.randint(3, 200, (2, 11))
    with torch.no_grad():
        assert float((loaded(x).logits - teacher(x).logits).abs().max()) <= 1e-5
    assert load_tokenizer(folder)("hello world").input_ids == tokenizer("hello world").input_ids
    assert build_swiftkv_model(loaded, N, 2).config.model_type == f"{family}_swiftkv"


def test_gguf_whose_head_dim_transformers_would_miss_is_refused(tmp_path):
    from swiftkv.sources import resolve_source

    tokenizer = byte_tokenizer()
    teacher = random_teacher("qwen3", vocab_size=len(tokenizer))  # head_dim 24, not Qwen3Config's 128
    path = write_tiny_gguf(tmp_path / "q.gguf", teacher, tokenizer, "tiny-qwen3")
    with pytest.raises(ValueError, match="key_length=24.*head_dim=128"):
        resolve_source(path)


def test_qwen3_trained_tensor_files_rebuild_the_student(tmp_path):
    """The trained-tensor files of a Qwen3 student (its SwiftKV projections and norms only) plus the
    base folder they name rebuild a folder whose student equals the original."""
    from swiftkv.model.modeling import swiftkv_parameters
    from swiftkv.model.surgery import read_trained, save_swiftkv_params
    from swiftkv.sources import load_model, resolve_source
    from tests.tiny import random_student, save_tiny_folder, tiny_tokenizer

    teacher, student = random_student("qwen3", N, 2, swiftkv_std=0.1)
    save_tiny_folder(tmp_path / "base", teacher, tiny_tokenizer())
    save_swiftkv_params(student, tmp_path / "trained", base=str(tmp_path / "base"), dtype=torch.float32)
    _, tensors = read_trained(tmp_path / "trained")
    assert set(tensors) == set(swiftkv_parameters(student)) == branch_layout_names(N, 2)
    rebuilt = load_model(resolve_source(tmp_path / "trained"))
    x = torch.randint(3, 100, (1, 13))
    with torch.no_grad():
        assert float((rebuilt(x).logits - student(x).logits).abs().max()) <= 1e-5


def test_a_mistral_config_read_from_a_gguf_keeps_no_sliding_window():
    """llama.cpp runs a Mistral GGUF with full attention and records no window; the 4096 that transformers'
    MistralConfig fills in is its default, so the Llama family's GGUF rule clears it (other families keep
    their config as read)."""
    from transformers import MistralConfig, Qwen2Config

    mistral = MistralConfig(sliding_window=4096)
    family_of("mistral").gguf_config(mistral)
    assert mistral.sliding_window is None
    qwen2 = Qwen2Config()
    read = qwen2.to_dict()
    family_of("qwen2").gguf_config(qwen2)
    assert qwen2.to_dict() == read
