"""Teacher-written targets from the real vLLM engine: greedy replies equal transformers' greedy
generation of the same plain teacher, and end with the end-of-turn token when the teacher stops."""

import pytest
import torch

from swiftkv.replies.vllm_engines import EngineSpec, EngineWriter
from tests.tiny import save_tiny_teacher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


def test_vllm_replies_equal_hf_greedy(tmp_path):
    from transformers import AutoModelForCausalLM

    from swiftkv.vllm.engine import in_process_engine

    # head_dim 64: vLLM's CPU attention kernels have no head_dim-16 variant (the kit's default)
    folder = save_tiny_teacher(
        tmp_path / "teacher", "llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [[5, 9, 14, 3, 7], [11, 4, 4, 20]]
    eos = model.config.eos_token_id
    with in_process_engine():
        generate = EngineWriter(EngineSpec(str(folder), 8, "float32", eos, enforce_eager=True))
        replies = generate(prompts)
        generate.close()
    for prompt, reply in zip(prompts, replies, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            expected = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )[0, len(prompt) :].tolist()
        assert reply.ids == expected
        assert reply.finished == (expected[-1] == eos)
