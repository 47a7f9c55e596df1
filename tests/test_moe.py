"""The Mixture-of-Experts families (Qwen3-MoE, Qwen2-MoE, Mixtral): teacher == transformers' own model,
student == the reference math (routers and experts included), experts in the source's checkpoint layout,
convert with every init, distill with routers and experts frozen, eval and generate, and the refusals
(unsupported MoE types, quantized experts, sliding windows), and the vLLM plugin taking them
(tests/test_vllm_moe.py serves them)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from swiftkv.cli import main
from swiftkv.model.families import FAMILIES, SOURCE_FAMILIES, UNSUPPORTED_MOE, check_vllm_serves, vllm_refusal
from tests import reference
from tests.tiny import (
    ARCHS,
    MOE_ARCHS,
    WORDS,
    random_chats,
    random_student,
    save_tiny_folder,
    save_tiny_teacher,
    tiny_tokenizer,
    write_jsonl,
)

LAYERS, N = 6, 2
# The expert tensors of one layer as the published checkpoints (and so our folders) name them.
EXPERT_NAMES = {
    "qwen3_moe": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
    "qwen2_moe": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
    "mixtral": "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def ids(batch: int = 2, seq: int = 17) -> torch.Tensor:
    return torch.randint(3, 120, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))


def cli(*args) -> int:
    return main([str(a) for a in args])


# -- the HF model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", MOE_ARCHS)
@torch.no_grad()
def test_teacher_path_equals_transformers(arch):
    teacher, student = random_student(arch, N)
    x = ids()
    mask = torch.ones_like(x)
    mask[0, :5] = 0  # left padding
    assert max_diff(student(x, swiftkv=False).logits, teacher(x).logits) <= 1e-5  # measured: 0.0
    padded = student(x, attention_mask=mask, swiftkv=False).logits
    assert max_diff(padded[1], teacher(x, attention_mask=mask).logits[1]) <= 1e-5


@pytest.mark.parametrize("arch", MOE_ARCHS)
@pytest.mark.parametrize("g", [1, 2])
@torch.no_grad()
def test_student_follows_the_reference_math(arch, g):
    teacher, student = random_student(arch, N, g, swiftkv_std=0.05)
    x = ids(1)
    h_n = teacher(x, output_hidden_states=True).hidden_states[N][0]
    expected = reference.student_logits(student, x[0], h_n)
    got = student(x).logits[0]
    assert max_diff(got, expected) <= 1e-5
    assert max_diff(got, teacher(x).logits[0]) > 1e-2  # the student is another model: the check can fail


@pytest.mark.parametrize("arch", MOE_ARCHS)
@torch.no_grad()
def test_reference_moe_block_is_transformers_moe_block(arch):
    """The reference's routing and experts equal transformers' block on its own: the reference is right."""
    teacher, _ = random_student(arch, N)
    x = torch.randn(9, teacher.config.hidden_size)
    block = teacher.model.layers[N].mlp
    assert max_diff(reference.moe_mlp(teacher.config, block, x), block(x[None])[0]) <= 1e-5


@pytest.mark.parametrize("arch", MOE_ARCHS)
@torch.no_grad()
def test_prefill_skip_and_decoding_equal_the_full_student(arch):
    _, student = random_student(arch, N, 2, swiftkv_std=0.05)
    x = ids(2, 21)
    full = student(x).logits
    assert max_diff(student(x, logits_to_keep=1).logits, full[:, -1:]) <= 1e-4
    rows = torch.tensor([0, 7, 20])
    assert max_diff(student(x, logits_to_keep=rows).logits, full[:, rows]) <= 1e-4
    cache = student(x[:, :15], use_cache=True, logits_to_keep=1).past_key_values
    steps = []
    for t in range(15, 21):
        out = student(x[:, t : t + 1], past_key_values=cache, use_cache=True)
        steps.append(out.logits)
    assert max_diff(torch.cat(steps, 1), full[:, 15:]) <= 1e-4


@pytest.mark.parametrize("arch", MOE_ARCHS)
@torch.no_grad()
def test_generate_equals_greedy_full_forwards(arch):
    _, student = random_student(arch, N, 2, swiftkv_std=0.05)
    x = ids(1, 8)
    generated = student.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False, pad_token_id=0
    )
    expected = x
    for _ in range(8):  # no cache, no skip: the slow reference loop
        expected = torch.cat([expected, student(expected).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, expected)


def test_folders_keep_the_sources_expert_layout_and_reload_with_and_without_import(tmp_path):
    """A saved SwiftKV MoE folder names its experts as the source checkpoint does (per expert, Mixtral's
    block_sparse_moe.w1/w2/w3), and reloads with equal logits after `import swiftkv` and, in a process
    that never imported it, through the folder's auto_map (trust_remote_code)."""
    from swiftkv.model.surgery import write_swiftkv_folder

    x = ids(1, 11)
    expected = {}
    for arch in MOE_ARCHS:
        teacher, student = random_student(arch, N, 2, swiftkv_std=0.05)
        teacher.save_pretrained(tmp_path / f"{arch}-source")
        write_swiftkv_folder(student, None, tmp_path / arch, {"source": "tiny"})
        source_keys = set(load_file(tmp_path / f"{arch}-source" / "model.safetensors"))
        ours = set(load_file(tmp_path / arch / "model.safetensors"))
        assert EXPERT_NAMES[arch].format(i=N, e=3) in source_keys
        assert {k for k in ours if "swiftkv" not in k} == source_keys
        reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / arch, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        with torch.no_grad():
            expected[arch] = student(x).logits
            assert max_diff(reloaded(x).logits, expected[arch]) == 0.0
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        # this process's threads: on some CPUs another count sums the experts' products in another order
        f"torch.set_num_threads({torch.get_num_threads()})\n"
        f"x = torch.tensor({x.tolist()})\n"
        "assert 'swiftkv' not in sys.modules\n"
        f"for arch in {list(MOE_ARCHS)}:\n"
        f"    model = AutoModelForCausalLM.from_pretrained('{tmp_path}/' + arch, trust_remote_code=True)\n"
        "    with torch.no_grad():\n"
        f"        torch.save(model(x).logits, '{tmp_path}/' + arch + '.pt')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for arch in MOE_ARCHS:
        assert max_diff(torch.load(tmp_path / f"{arch}.pt"), expected[arch]) == 0.0


# -- convert --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calib_text(tmp_path_factory):
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(len(WORDS), (4000,), generator=generator).tolist()
    path = tmp_path_factory.mktemp("calib") / "text.txt"
    path.write_text(" ".join(WORDS[i] for i in picks))
    return path


@pytest.fixture(scope="module", params=MOE_ARCHS)
def moe_teacher(request, tmp_path_factory):
    return request.param, save_tiny_teacher(
        tmp_path_factory.mktemp(f"teacher-{request.param}"), request.param
    )


def test_convert_with_every_init(moe_teacher, tmp_path, calib_text):
    """copy and mean are the reference inits tensor by tensor; lstsq (fitted after Qwen3-MoE's k_norm)
    reconstructs the teacher's K/V better than either; the experts and routers are the source's."""
    from swiftkv.convert import ConvertSettings, convert

    arch, folder = moe_teacher
    source = load_file(folder / "model.safetensors")
    options = dict(num_key_value_layers=N, key_value_group_size=2, calib_data=str(calib_text))
    for init in ("copy", "mean"):
        convert(ConvertSettings(source=str(folder), out=tmp_path / init, init=init, measure=False, **options))
    report = convert(
        ConvertSettings(
            source=str(folder),
            out=tmp_path / "lstsq",
            init="lstsq",
            calib_tokens=1024,
            eval_tokens=512,
            **options,
        )
    )
    for init in ("copy", "mean", "lstsq"):
        out = load_file(tmp_path / init / "model.safetensors")
        assert all(torch.equal(out[name], tensor) for name, tensor in source.items())  # experts included
        assert torch.equal(
            out["model.norm_swiftkv.weight"], source[f"model.layers.{N}.input_layernorm.weight"]
        )
    for init in ("copy", "mean"):
        out = load_file(tmp_path / init / "model.safetensors")
        for owner in range(N, LAYERS, 2):
            attention = f"model.layers.{owner}.self_attn"
            assert torch.equal(
                out[f"{attention}.q_proj_swiftkv.weight"], source[f"{attention}.q_proj.weight"]
            )
            group = [source[f"model.layers.{j}.self_attn.k_proj.weight"] for j in (owner, owner + 1)]
            expected = group[0] if init == "copy" else torch.stack(group).mean(0)
            assert torch.allclose(out[f"{attention}.k_proj_swiftkv.weight"], expected)
            if arch == "qwen3_moe":  # q_norm copied, k_norm the group's mean
                norms = [source[f"model.layers.{j}.self_attn.k_norm.weight"] for j in (owner, owner + 1)]
                assert torch.allclose(out[f"{attention}.k_norm_swiftkv.weight"], torch.stack(norms).mean(0))
    # --trim drops the later layers' q/k/v (and Qwen3-MoE's q/k norms) and leaves the student as it was;
    # plain_teacher recovers transformers' own MoE model from an untrimmed folder.
    from swiftkv.model.surgery import plain_teacher

    convert(
        ConvertSettings(
            source=str(folder), out=tmp_path / "trim", init="copy", measure=False, trim=True, **options
        )
    )
    trimmed_keys = set(load_file(tmp_path / "trim" / "model.safetensors"))
    assert f"model.layers.{N}.self_attn.q_proj.weight" not in trimmed_keys
    assert f"model.layers.{N - 1}.self_attn.q_proj.weight" in trimmed_keys
    x = ids(1, 12)
    full, trimmed = (AutoModelForCausalLM.from_pretrained(tmp_path / name) for name in ("copy", "trim"))
    teacher = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        assert max_diff(full(x).logits, trimmed(x).logits) <= 1e-6
        assert type(plain_teacher(full)) is ARCHS[arch][1]
        assert max_diff(plain_teacher(full)(x).logits, teacher(x).logits) <= 1e-5
    errors = report.kv_relative_error
    for name in ("k", "v"):
        assert sum(errors["lstsq"][name]) < sum(errors["copy"][name])
    assert report.top1_agreement["lstsq"] >= report.top1_agreement["copy"] - 0.05


@pytest.mark.parametrize(
    "model_type, blocked",
    [
        ("gpt_oss", "attention sinks and alternates sliding-window"),
        ("olmoe", "whole projection"),
        ("dbrx", "fuses q/k/v in one clipped projection"),
        ("qwen3_next", "linear attention"),
    ],
)
def test_unsupported_moe_types_name_what_blocks_them(tmp_path, capsys, model_type, blocked):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert cli("convert", folder, tmp_path / "out", "--num-key-value-layers", N, "--init", "copy") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"model_type {model_type!r} is not supported: " in err and blocked in err
    assert "qwen3_moe" in err and not (tmp_path / "out").exists()


def test_no_unsupported_moe_type_has_a_family():
    assert not set(UNSUPPORTED_MOE) & set(SOURCE_FAMILIES)


def test_quantized_experts_and_sliding_windows_are_refused_before_loading(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr("swiftkv.sources.load_folder_model", refuse)
    cases = {
        "qwen3_moe": ({"quantization_config": {"quant_method": "fp8"}}, "quant_method='fp8'"),
        "mixtral": ({"sliding_window": 64}, "sliding-window attention (sliding_window=64"),
    }
    for arch, (change, message) in cases.items():
        folder = save_tiny_teacher(tmp_path / arch, arch)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        capsys.readouterr()
        assert (
            cli("convert", folder, tmp_path / f"{arch}-out", "--num-key-value-layers", N, "--init", "copy")
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert (
            err.count("\n") == 0
            and f"cannot convert this {arch} model to SwiftKV: " in err
            and message in err
        )


# -- vLLM ------------------------------------------------------------------------------------------


def test_the_vllm_plugin_serves_every_family_and_refuses_one_without_a_vllm_layer(monkeypatch):
    for family in FAMILIES.values():
        if family.latent_attention:  # DeepSeek: refused, tests/test_deepseek.py
            continue
        assert family.vllm_layer is not None and vllm_refusal(family) is None
        check_vllm_serves(family.config_class())
    assert [f.base_type for f in FAMILIES.values() if f.vllm_moe is not None] == list(MOE_ARCHS)
    # A family entry without a vLLM decoder layer is refused, with its name, before any engine starts.
    monkeypatch.setitem(FAMILIES, "mixtral", dataclasses.replace(FAMILIES["mixtral"], vllm_layer=None))
    with pytest.raises(
        ValueError, match=r"MixtralSwiftKVForCausalLM \(mixtral_swiftkv\) cannot be served on vLLM"
    ):
        check_vllm_serves({"model_type": "mixtral_swiftkv"})


@pytest.mark.vllm
def test_vllm_engine_config_of_a_moe_swiftkv_folder_switches_on_fast_prefill(tmp_path):
    """What `vllm.LLM(model=FOLDER)` and `swiftkv serve FOLDER` build first: the plugin's config hook takes
    the MoE family (no refusal) and switches on kv_sharing_fast_prefill."""
    from vllm.engine.arg_utils import EngineArgs

    _, student = random_student("qwen3_moe", N, 2)
    folder = save_tiny_folder(tmp_path / "student", student, tiny_tokenizer())
    config = EngineArgs(model=str(folder), max_model_len=256).create_engine_config()
    assert config.model_config.architecture == "Qwen3MoeSwiftKVForCausalLM"
    assert config.cache_config.kv_sharing_fast_prefill is True


# -- distill, eval, generate ------------------------------------------------------------------------


def moe_student_folder(tmp_path, arch: str):
    _, student = random_student(
        arch, 3, 1, swiftkv_std=0.2, max_position_embeddings=256, tie_word_embeddings=True
    )
    return save_tiny_folder(tmp_path / f"{arch}-student", student, tiny_tokenizer())


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_distill_trains_the_swiftkv_tensors_and_freezes_routers_and_experts(tmp_path, arch):
    from tests.test_distill_cli import distill_args

    folder = moe_student_folder(tmp_path, arch)
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(40, seed=7))
    assert main(distill_args(folder, data, tmp_path / "out", "--tokens", "1536")) == 0  # 12 steps
    before, after = load_file(folder / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("swiftkv" in name for name in changed)
    frozen = [name for name in before if ".experts." in name or ".gate." in name or "shared_expert" in name]
    assert len(frozen) >= 3 * 4 * (LAYERS - 3) and not set(frozen) & changed  # bit-identical
    summary = json.loads((tmp_path / "out" / "distill.json").read_text())
    assert summary["heldout_after"]["kl"] < summary["heldout_before"]["kl"]


def test_distill_refuses_training_the_moe_blocks(tmp_path, capsys):
    from tests.test_distill_cli import distill_args

    folder = moe_student_folder(tmp_path, "mixtral")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(10, seed=7))
    capsys.readouterr()
    assert main(distill_args(folder, data, tmp_path / "out", "--trainable", "lora", "--lora-rank", "4")) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "routers and experts stay frozen; use --trainable swiftkv" in err
    assert not (tmp_path / "out").exists()


def test_trained_tensor_files_rebuild_the_student(tmp_path):
    from swiftkv.model.surgery import save_swiftkv_params
    from swiftkv.sources import load_model, resolve_source

    teacher, student = random_student("qwen2_moe", N, 2, swiftkv_std=0.1)
    save_tiny_folder(tmp_path / "base", teacher, tiny_tokenizer())
    save_swiftkv_params(student, tmp_path / "trained", base=str(tmp_path / "base"), dtype=torch.float32)
    rebuilt = load_model(resolve_source(tmp_path / "trained"))
    x = ids(1, 13)
    with torch.no_grad():
        assert max_diff(rebuilt(x).logits, student(x).logits) == 0.0


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_eval_chat_agreement_and_generate_command(tmp_path, arch, capsys):
    """Teacher-forced agreement against transformers' own MoE teacher equals one naive forward per role;
    `swiftkv generate` streams the student's greedy answer."""
    from swiftkv.data.tokens import tokenize_chat
    from swiftkv.evaluate.chat import generation_agreement, teacher_forced_agreement
    from swiftkv.evaluate.pair import load_pair
    from swiftkv.evaluate.store import ResultStore
    from swiftkv.generation import chat_input_ids, generate_text
    from swiftkv.metrics import kl_per_row
    from swiftkv.sources import load_model, load_tokenizer

    tokenizer = tiny_tokenizer()
    teacher, student = random_student(arch, 3, 1, swiftkv_std=0.05, tie_word_embeddings=True)
    teacher.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    student_folder = save_tiny_folder(tmp_path / "student", student, tokenizer)
    pair = load_pair(str(student_folder), str(tmp_path / "teacher"), dtype=torch.float32)
    assert pair.mode == "shared"  # the student's teacher path is the teacher: layers < N shared
    chats = [record["messages"] for record in random_chats(3, seed=3, turns=1)]
    stats = teacher_forced_agreement(pair, ResultStore(tmp_path / "c.sqlite"), chats, progress=False)
    tokens, same, kl = 0, 0, 0.0
    for chat in chats:
        encoded = tokenize_chat(tokenizer, chat)
        rows = [t for t in range(len(encoded.ids) - 1) if encoded.is_target[t + 1]]
        x = torch.tensor([encoded.ids])
        with torch.no_grad():
            t_logits, s_logits = teacher(x).logits[0, rows], student(x).logits[0, rows]
        tokens += len(rows)
        same += int((t_logits.argmax(-1) == s_logits.argmax(-1)).sum())
        kl += float(kl_per_row(s_logits, t_logits).sum())
    assert stats["tokens"] == tokens > 0
    assert stats["top1_agreement"] == pytest.approx(same / tokens)
    assert stats["kl_mean"] == pytest.approx(kl / tokens, rel=1e-4) and stats["kl_mean"] > 0
    greedy = generation_agreement(pair, ResultStore(tmp_path / "c.sqlite"), [c[:1] for c in chats], 6)
    naive = []
    for chat in chats:
        prompt = chat_input_ids(tokenizer, chat[0]["content"])
        answers = []
        for model, path in ((teacher, {}), (student, {"swiftkv": True})):
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=2, **path)
            answer = out[0, prompt.shape[1] :].tolist()
            answers.append(answer + [tokenizer.eos_token_id] * (6 - len(answer)))
        naive.append(next((t for t in range(6) if answers[0][t] != answers[1][t]), 6))
    assert greedy["prompts"] == 3 and greedy["first_divergences"] == naive
    capsys.readouterr()
    assert cli("generate", student_folder, "w1 w2 w3", "--max-new-tokens", "6", "--dtype", "float32") == 0
    streamed = capsys.readouterr().out
    tokenizer = load_tokenizer(student_folder)
    expected = generate_text(load_model(student_folder), tokenizer, chat_input_ids(tokenizer, "w1 w2 w3"), 6)
    assert streamed.strip() == expected.strip()


@pytest.fixture(scope="module", params=MOE_ARCHS)
def one_process_run(request, tmp_path_factory):
    """Each MoE family's student distilled in one process, and how far regrouping its sums alone moves it (the
    yardstick of both sharded runs)."""
    from tests.test_distill_cli import distill_args
    from tests.test_distill_fsdp import regrouping_noise

    tmp_path = tmp_path_factory.mktemp(f"{request.param}-run")
    folder = moe_student_folder(tmp_path, request.param)
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    one = tmp_path / "one"
    assert main(distill_args(folder, data, one, "--json", f"{one}.json")) == 0
    return folder, data, one, regrouping_noise(folder, data, one)


@pytest.mark.slow  # two torchrun processes
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_processes_equal_the_one_process_run(one_process_run, sharding):
    """Two processes under DDP (gloo; each holds the whole model, the gradients averaged) and under --fsdp (the MoE
    decoder layers sharded, fused 3-D experts included, each process reading its own experts from the per-expert
    files: distill/start/sharded.py) follow the one-process run within the rounding that regrouping the sums
    alone causes, and change only SwiftKV tensors (routers, experts and Qwen2-MoE's shared expert stay frozen)."""
    from tests.test_distill_cli import distill_args
    from tests.test_distill_fsdp import assert_same_run, torchrun

    folder, data, one, noise = one_process_run
    two = one.parent / f"two-{sharding}"
    torchrun(
        2,
        distill_args(folder, data, two, *(["--fsdp"] if sharding == "fsdp" else []), "--json", f"{two}.json"),
    )
    assert_same_run(one, two, noise)
    source, written = load_file(folder / "model.safetensors"), load_file(two / "model.safetensors")
    changed = {name for name in written if not torch.equal(written[name], source[name])}
    assert changed and all("swiftkv" in name for name in changed)
