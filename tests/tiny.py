"""Tiny random models and a tiny trained tokenizer, for fast tests of real code paths."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from swiftkv import LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM, Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ("the a of to and in is it that for on with as was by this be are from or an at which not "
         "model cache layer token key value prompt answer fast paris france capital city query").split()

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM),
}


def tiny_base_kwargs(vocab_size: int = 128, layers: int = 6) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0, eos_token_id=2, bos_token_id=1)


def random_teacher(arch: str, seed: int = 0, **overrides):
    """A plain transformers model with random weights (biases randomised too, so Qwen2's count)."""
    config_class, model_class, _, _ = ARCHS[arch]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**tiny_base_kwargs(), **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def random_student(arch: str, n: int, g: int = 1, seed: int = 0, **overrides):
    """A SwiftKV model holding `random_teacher`'s weights plus random SwiftKV projections."""
    _, _, config_class, model_class = ARCHS[arch]
    teacher = random_teacher(arch, seed, **overrides)
    config = config_class(**{**tiny_base_kwargs(), **overrides}, num_key_value_layers=n, key_value_group_size=g,
                          swiftkv=True)
    torch.manual_seed(seed + 1)
    student = model_class(config).eval()
    missing, unexpected = student.load_state_dict(teacher.state_dict(), strict=False)
    assert not unexpected and all("swiftkv" in k for k in missing)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "swiftkv" in name and name.endswith("bias"):
                p.normal_(0, 0.1)
    return teacher, student


def tiny_tokenizer_dir(folder: Path) -> Path:
    """Train a word-level tokenizer on a fixed word list and save it as an HF tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS + ["user", "assistant", "system"])}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789.,?!:'\"-":
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", bos_token="<|im_start|>")
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return folder


def save_tiny_teacher(folder: Path, tokenizer_dir: Path, arch: str = "llama", **overrides) -> Path:
    """A tiny plain Llama/Qwen2 HF folder whose vocabulary matches the tiny tokenizer."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    vocab = max(128, len(tokenizer))
    model = random_teacher(arch, vocab_size=vocab, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, **overrides)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
