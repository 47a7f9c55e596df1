"""Tiny, fast stand-ins for the distillation tests: a word-level chat tokenizer (ChatML-like template,
offsets supported) and a tiny random SwiftKV Llama saved as an HF folder. No tests live here."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
WORDS = [f"w{i}" for i in range(100)] + ["user", "assistant", "system"]


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(num_key_value_layers: int = 3, seed: int = 0):
    import swiftkv  # noqa: F401
    from swiftkv import LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM

    torch.manual_seed(seed)
    config = LlamaSwiftKVConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                num_key_value_layers=num_key_value_layers, key_value_group_size=1,
                                tie_word_embeddings=True)
    model = LlamaSwiftKVForCausalLM(config).eval()
    with torch.no_grad():  # random swiftkv projections make the student differ visibly from the teacher
        for name, parameter in model.named_parameters():
            if "swiftkv" in name and parameter.dim() == 2:
                parameter.normal_(0, 0.2)
    return model


def random_chats(count: int, seed: int = 0, turns: int = 2, words: int = 12) -> list[dict]:
    rng = torch.Generator().manual_seed(seed)

    def text() -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(0, 100, (words,), generator=rng))

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


def save_tiny_folder(folder: Path, model=None) -> Path:
    (model or tiny_model()).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder
