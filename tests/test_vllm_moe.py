"""The Mixture-of-Experts SwiftKV families on vLLM's CPU engine (Qwen3-MoE, Qwen2-MoE with its shared expert
and gate, Mixtral): tiny random teachers converted by `swiftkv convert` (copy init), served with the later
layers' MoE blocks through vLLM's fused MoE. Greedy ids equal the HF SwiftKV model's (fp32 on both sides),
and vLLM allocates KV caches for the N early layers and one holder per AcrossKV group only. Qwen3-MoE has a
dense early layer (mlp_only_layers) and Qwen2-MoE a dense later layer, so both MLP kinds run on each side."""

from __future__ import annotations

import pytest
import torch

from tests.tiny import save_tiny_teacher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

LAYERS, N = 6, 2
KV_BYTES = 16 * 2**20
NEW_TOKENS = 12
# (family, G, tensor-parallel size); at tp = 2 the 2 KV heads, every expert and Qwen2-MoE's shared expert are
# split over the ranks.
ENGINES = [("qwen3_moe", 2, 1), ("qwen2_moe", 1, 1), ("qwen2_moe", 2, 2), ("mixtral", 2, 2)]


def converted_folder(tmp_path, arch: str, group_size: int):
    """A tiny random MoE teacher (4 experts, 2 per token) converted to SwiftKV (N = 2 of 6, copy init)."""
    from swiftkv.convert import ConvertSettings, convert

    teacher = save_tiny_teacher(tmp_path / "teacher", arch, num_hidden_layers=LAYERS)
    out = tmp_path / "swiftkv"
    settings = ConvertSettings(
        source=str(teacher),
        out=out,
        num_key_value_layers=N,
        key_value_group_size=group_size,
        init="copy",
        measure=False,
    )
    convert(settings)
    return out


def start_engine(folder, tp: int):
    from vllm import LLM

    from swiftkv.vllm.engine import engine_kwargs

    settings = dict(
        max_model_len=256,
        kv_cache_memory_bytes=KV_BYTES,
        max_num_batched_tokens=64,  # the 100-token prompt is prefilled in two chunks
        max_num_seqs=4,
        enforce_eager=True,
    )
    if tp > 1:
        settings.update(tensor_parallel_size=tp, distributed_executor_backend="mp")
    return LLM(**engine_kwargs(str(folder), dtype="float32"), **settings)


@pytest.fixture(scope="module", params=ENGINES, ids=[f"{a}-G{g}-tp{t}" for a, g, t in ENGINES])
def served(request, tmp_path_factory):
    """(vLLM engine, HF SwiftKV model, G) for one converted folder."""
    from transformers import AutoModelForCausalLM

    from swiftkv.vllm.env import configure_cpu_env, engine_core_in_process

    arch, group_size, tp = request.param
    folder = converted_folder(tmp_path_factory.mktemp(f"{arch}_g{group_size}"), arch, group_size)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # run every step, as vLLM with ignore_eos
    from vllm.envs import disable_envs_cache

    # An in-process engine freezes vLLM's environment reads (its envs cache) at the values of its start:
    # unfreeze them, so each engine here sees its own settings (in-process or not, thread binding).
    disable_envs_cache()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        configure_cpu_env(ranks=tp)
        if tp == 1:
            with engine_core_in_process():
                llm = start_engine(folder, tp)
        else:
            llm = start_engine(folder, tp)
        yield llm, model, group_size
        if tp > 1:
            llm.llm_engine.engine_core.shutdown()
        del llm


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 120, (length,), generator=generator).tolist() for length in (5, 100, 23)]


def chosen_logprobs(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1)[torch.arange(len(tokens)), tokens]


def test_greedy_ids_equal_the_hf_swiftkv_model(served):
    """One batch: a short prompt decodes while the long one is still prefilled in chunks. The chosen tokens'
    log-probabilities match the HF SwiftKV model's to 1e-3; its teacher path's differ by more than 1e-2
    somewhere, so the comparison tells the SwiftKV model from its teacher."""
    from vllm import SamplingParams

    llm, model, _ = served
    assert type(model).__name__.endswith("SwiftKVForCausalLM") and model.config.swiftkv
    batch = prompts()
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    served_gap, teacher_gap = 0.0, 0.0
    for prompt, output in zip(batch, outputs, strict=True):
        with torch.no_grad():
            hf = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
            expected = hf.sequences[0, len(prompt) :].tolist()
            teacher = model(hf.sequences, swiftkv=False).logits[0, len(prompt) - 1 : -1]
        assert list(output.outputs[0].token_ids) == expected
        student = chosen_logprobs(torch.cat(hf.scores), expected)
        got = torch.tensor(
            [step[t].logprob for step, t in zip(output.outputs[0].logprobs, expected, strict=True)]
        )
        served_gap = max(served_gap, float((got - student).abs().max()))
        teacher_gap = max(teacher_gap, float((chosen_logprobs(teacher, expected) - student).abs().max()))
    print(
        f"max |logprob diff| vLLM vs HF SwiftKV {served_gap:.1e}, teacher path vs SwiftKV {teacher_gap:.1e}"
    )
    assert served_gap < 1e-3 and teacher_gap > 1e-2


def test_later_layers_run_the_familys_vllm_moe_block(served):
    """Each sparse later layer holds vLLM's own MoE block of the family (its experts a fused-MoE module),
    under the checkpoint's name; a dense later layer (Qwen2-MoE's layer 4) holds LlamaMLP."""
    from swiftkv.model.config import is_sparse_layer
    from swiftkv.model.families import family_of

    llm, model, _ = served
    if llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size > 1:
        pytest.skip("the model lives in the worker processes")
    family = family_of(model.config.model_type)
    block_name = family.vllm_moe.split(":")[1]

    def describe(vllm_model):
        config = vllm_model.config
        kinds = []
        for i, layer in zip(config.later_layers, vllm_model.model.late.layers, strict=True):
            mlp = getattr(layer, layer.mlp_attribute)
            kinds.append(
                (layer.mlp_attribute, type(mlp).__name__, type(getattr(mlp, "experts", None)).__name__)
            )
            assert is_sparse_layer(config, i) == (type(mlp).__name__ == block_name)
        return kinds

    kinds = llm.apply_model(describe)[0]
    expected_sparse = (family.moe_attribute, block_name, "MoERunner")
    assert expected_sparse in kinds
    if model.config.model_type == "qwen2_moe_swiftkv":
        assert kinds[4 - N] == ("mlp", "LlamaMLP", "NoneType")


def test_kv_caches_are_the_early_layers_and_one_holder_per_group(served):
    """Capacity = KV bytes / (bytes per token of N + (L - N) / G caches) on each rank."""
    from swiftkv.model.config import head_dim_of
    from swiftkv.vllm.engine import kv_cache_tokens

    llm, model, group_size = served
    config = model.config
    tp = llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size
    caches = N + (LAYERS - N) // group_size
    assert caches == N + config.num_kv_groups
    kv_heads = max(1, config.num_key_value_heads // tp)
    bytes_per_token = caches * 2 * kv_heads * head_dim_of(config) * 4  # K and V, fp32
    block = llm.llm_engine.vllm_config.cache_config.block_size
    assert kv_cache_tokens(llm) == KV_BYTES // bytes_per_token // block * block


def test_a_hidden_size_the_cpu_fused_moe_cannot_take_is_one_error_before_the_engine(tmp_path):
    """hidden_size 144 (not a multiple of 32): the plugin's config hook names the size while vLLM builds
    the engine config, before any model is built."""
    from vllm.engine.arg_utils import EngineArgs

    from tests.tiny import random_student, save_tiny_folder, tiny_tokenizer

    _, student = random_student("mixtral", N, 1, hidden_size=144)
    folder = save_tiny_folder(tmp_path / "student", student, tiny_tokenizer())
    with pytest.raises(
        ValueError, match=r"hidden_size=144, but vLLM's CPU fused MoE needs .* divisible by 32"
    ):
        EngineArgs(model=str(folder), max_model_len=256).create_engine_config()
