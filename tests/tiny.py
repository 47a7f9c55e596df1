"""The one kit of tiny stand-ins for fast tests of real code paths: tiny configs and random models
(plain and SwiftKV: Llama, Qwen2, Qwen3, Mistral converted into the Llama family, the
Mixture-of-Experts Qwen3-MoE, Qwen2-MoE and Mixtral, and DeepSeek-V2/V3 with latent attention), two tiny tokenizers with a ChatML template, random
chats and HF folder writers. Nothing here reads a real model or data set. No tests live here."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from swiftkv import (
    DeepseekV2SwiftKVConfig,
    DeepseekV2SwiftKVForCausalLM,
    DeepseekV3SwiftKVConfig,
    DeepseekV3SwiftKVForCausalLM,
    LlamaSwiftKVConfig,
    LlamaSwiftKVForCausalLM,
    MixtralSwiftKVConfig,
    MixtralSwiftKVForCausalLM,
    Qwen2MoeSwiftKVConfig,
    Qwen2MoeSwiftKVForCausalLM,
    Qwen2SwiftKVConfig,
    Qwen2SwiftKVForCausalLM,
    Qwen3MoeSwiftKVConfig,
    Qwen3MoeSwiftKVForCausalLM,
    Qwen3SwiftKVConfig,
    Qwen3SwiftKVForCausalLM,
)

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Ids 0-2 in both tokenizers, as in SmolLM2's: unknown/end-of-text, then the ChatML markers (bos, eos = pad).
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
WORDS = [f"w{i}" for i in range(100)]  # the word-level tokenizer's words
ROLES = ["user", "assistant", "system"]
# AutoTokenizer loads the tokenizer of a Qwen2 folder as Qwen2Tokenizer: a BPE over the same vocabulary
# without merges, so it needs the single characters of WORDS to encode text (character by character).
CHARACTERS = sorted(set("".join(WORDS)))

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, Qwen3SwiftKVConfig, Qwen3SwiftKVForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM, LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeSwiftKVConfig, Qwen3MoeSwiftKVForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen2MoeSwiftKVConfig, Qwen2MoeSwiftKVForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM, MixtralSwiftKVConfig, MixtralSwiftKVForCausalLM),
    "deepseek_v2": (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        DeepseekV2SwiftKVConfig,
        DeepseekV2SwiftKVForCausalLM,
    ),
    "deepseek_v3": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        DeepseekV3SwiftKVConfig,
        DeepseekV3SwiftKVForCausalLM,
    ),
}
MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral")
# The MoE shapes, sized for vLLM's CPU build (hidden and expert sizes divisible by 32, head_dim >= 32):
# 4 experts, 2 per token. Qwen3-MoE: head_dim 64 != hidden / heads (32), top-k renormalised, layer 1 a
# dense MLP (mlp_only_layers); Qwen2-MoE: a shared expert and its gate, later layer 4 dense; Mixtral: the
# experts' width is intermediate_size.
MOE_KWARGS = {
    "qwen3_moe": dict(
        hidden_size=128,
        head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    "qwen2_moe": dict(
        hidden_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=96,
        mlp_only_layers=[4],
    ),
    "mixtral": dict(
        hidden_size=128, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=None
    ),
}
# DeepSeek (multi-head latent attention): as many K/V heads as query heads (as published: MLA decompresses
# a K/V per head), a latent of 32 + a RoPE key of 8, q/k heads of 16 + 8, V heads of 16, 4 routed experts (2
# per token) in 2 groups (1 kept), a shared expert, layer 0 dense (first_k_dense_replace). DeepSeek-V2: the
# V2-Lite layout (q_proj; tests set q_lora_rank for the other), group-limited greedy routing scaled by 1.5.
# DeepSeek-V3: q_a/q_b (q_lora_rank), sigmoid routing with the correction bias, renormalised and scaled by
# 2.5. Both with YaRN RoPE whose attention factor and softmax scale differ from 1 (mscale != mscale_all_dim).
MLA_ARCHS = ("deepseek_v2", "deepseek_v3")
MLA_SHAPE = dict(
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=2,
    topk_group=1,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
MLA_KWARGS = {
    "deepseek_v2": dict(
        MLA_SHAPE,
        q_lora_rank=None,
        topk_method="group_limited_greedy",
        routed_scaling_factor=1.5,
        rope_parameters=YARN,
    ),
    "deepseek_v3": dict(
        MLA_SHAPE, q_lora_rank=24, norm_topk_prob=True, routed_scaling_factor=2.5, rope_parameters=YARN
    ),
}
# The newer families' tiny shapes: head_dim != hidden / heads (24 vs 16), so code that derives it
# cannot pass; Mistral without a sliding window (the only kind that converts). Their norm weights are
# randomised away from 1 (`random_teacher`), so using the wrong norm cannot pass either.
ARCH_KWARGS = {
    "qwen3": {"head_dim": 24},
    "mistral": {"head_dim": 24, "sliding_window": None},
    **MOE_KWARGS,
    **MLA_KWARGS,
}
SWIFTKV_KWARGS = {"qwen3": {"head_dim": 24}, "mistral": {"head_dim": 24}, **MOE_KWARGS, **MLA_KWARGS}
RANDOM_NORMS = ("qwen3", "mistral", *MOE_ARCHS, *MLA_ARCHS)
EXPERT_ARCHS = (*MOE_ARCHS, *MLA_ARCHS)


# -- configs and random models --------------------------------------------------------------------


def tiny_base_kwargs(vocab_size: int = 128, layers: int = 6) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
    )


def tiny_config(arch: str = "llama", **overrides):
    """A tiny plain config of `arch`: `tiny_base_kwargs()` (+ ARCH_KWARGS) with `overrides`."""
    return ARCHS[arch][0](**{**tiny_base_kwargs(), **ARCH_KWARGS.get(arch, {}), **overrides})


def tiny_swiftkv_config(arch: str = "llama", **overrides):
    """The SwiftKV config of the same tiny shape; the SwiftKV keys (num_key_value_layers,
    key_value_group_size, swiftkv) come in `overrides`, so a bad geometry raises here."""
    return ARCHS[arch][2](**{**tiny_base_kwargs(), **SWIFTKV_KWARGS.get(arch, {}), **overrides})


def random_teacher(arch: str, seed: int = 0, **overrides):
    """A plain transformers model with random weights (biases randomised too, so Qwen2's count; for
    RANDOM_NORMS families every RMSNorm weight too, uniform in [0.5, 1.5]; for EXPERT_ARCHS the MLPs,
    experts and routers with std 0.1, so routing and experts move the logits visibly, and DeepSeek-V3's
    routing correction bias)."""
    model_class = ARCHS[arch][1]
    torch.manual_seed(seed)
    model = model_class(tiny_config(arch, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif arch in RANDOM_NORMS and "norm" in name:
                p.uniform_(0.5, 1.5)
            elif arch in EXPERT_ARCHS and ".mlp." in name:  # experts and routers that matter (init std 0.02)
                p.normal_(0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3 (zero at init): choice != weight
                buffer.normal_(0, 0.1)
    return model


def random_student(
    arch: str, n: int, g: int = 1, seed: int = 0, swiftkv_std: float | None = None, **overrides
):
    """A SwiftKV model holding `random_teacher`'s weights plus random SwiftKV projections
    (`swiftkv_std`: redraw their weight matrices with this std, so the student differs visibly)."""
    model_class = ARCHS[arch][3]
    teacher = random_teacher(arch, seed, **overrides)
    config = tiny_swiftkv_config(
        arch, **overrides, num_key_value_layers=n, key_value_group_size=g, swiftkv=True
    )
    torch.manual_seed(seed + 1)
    student = model_class(config).eval()
    missing, unexpected = student.load_state_dict(teacher.state_dict(), strict=False)
    assert not unexpected and all("swiftkv" in k for k in missing)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "swiftkv" in name and name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "swiftkv" in name and p.dim() == 2 and swiftkv_std is not None:
                p.normal_(0, swiftkv_std)
            elif "norm" in name and "swiftkv" in name and arch in RANDOM_NORMS:
                p.uniform_(0.5, 1.5)
    return teacher, student


def tiny_student(num_key_value_layers: int = 3, seed: int = 0, arch: str = "llama", g: int = 1):
    """The distillation tests' student: a SwiftKV model (default Llama; N of 6 layers, G=1, tied
    embeddings, 256 positions) sized for `tiny_tokenizer()`, whose SwiftKV projections differ visibly
    from its teacher path."""
    _, student = random_student(
        arch,
        num_key_value_layers,
        g,
        seed=seed,
        swiftkv_std=0.2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return student


# -- tokenizers ----------------------------------------------------------------------------------


def chat_tokenizer(backend) -> PreTrainedTokenizerFast:
    """`backend` (a `tokenizers.Tokenizer` whose ids 0-2 are SPECIALS) as an HF tokenizer with ChatML."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=SPECIALS[0],
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHATML
    return fast


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word level: one token per whitespace-separated word of WORDS and ROLES (else <unk>), with
    offsets, so tests can name the exact tokens of a chat. 117 tokens: a vocabulary of 128 fits."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *WORDS, *ROLES, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return chat_tokenizer(backend)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte level (GPT-2 style like SmolLM2's, with no merges): any text encodes, one token per byte,
    and decodes back exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return chat_tokenizer(backend)


# -- data and folders ----------------------------------------------------------------------------


def random_chats(count: int, seed: int = 0, turns: int = 2, words: int = 12) -> list[dict]:
    """`count` {"messages": [...]} records of `turns` user/assistant exchanges of random WORDS."""
    rng = torch.Generator().manual_seed(seed)

    def text() -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (words,), generator=rng))

    chats = []
    for _ in range(count):
        messages = []
        for _ in range(turns):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        chats.append({"messages": messages})
    return chats


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def save_tiny_folder(folder: Path, model=None, tokenizer=None) -> Path:
    """An HF model folder: `model` (default `tiny_student()`) and `tokenizer` (default `tiny_tokenizer()`)."""
    (model or tiny_student()).save_pretrained(folder)
    (tokenizer or tiny_tokenizer()).save_pretrained(folder)
    return folder


def save_tiny_teacher(folder: Path, arch: str = "llama", **overrides) -> Path:
    """A tiny plain Llama/Qwen2 folder whose vocabulary and special ids match `tiny_tokenizer()`."""
    tokenizer = tiny_tokenizer()
    model = random_teacher(
        arch,
        vocab_size=max(128, len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **overrides,
    )
    return save_tiny_folder(folder, model, tokenizer)


def write_tiny_gguf(path: Path, model, tokenizer, name: str) -> Path:
    """`model` (a plain Llama/Mistral/Qwen2/Qwen3) and `tokenizer` (`byte_tokenizer()`) as an F32 GGUF file,
    named and laid out as llama.cpp writes it: Mistral as architecture `llama` (transformers tells them
    apart by the name), Llama-architecture q/k rows permuted as llama.cpp's converter does."""
    import gguf
    import numpy as np

    config = model.config
    arch = "llama" if config.model_type in ("llama", "mistral") else config.model_type
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads

    def permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:  # llama.cpp's rotary layout
        return (
            weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    vocab = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    writer.add_token_list(vocab)
    writer.add_token_types([3 if token in SPECIALS else 1 for token in vocab])
    writer.add_token_merges([])  # a byte tokenizer without merges, like byte_tokenizer() ...
    writer.add_token_scores([0.0] * len(vocab))  # ... which transformers' reader then wants scores for
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.chat_template:  # as SmolLM2's GGUF carries its ChatML template
        writer.add_chat_template(tokenizer.chat_template)
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for key, tensor in model.state_dict().items():
        tensor = tensor.detach().float()
        if key == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif key == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif key == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        else:
            _, _, layer, rest = key.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{names[module]}.{suffix}"
            if arch == "llama" and module == "self_attn.q_proj":
                tensor = permute(tensor, heads)
            elif arch == "llama" and module == "self_attn.k_proj":
                tensor = permute(tensor, kv_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(tensor.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
