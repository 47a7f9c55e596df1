"""Distillation recipes: the presets, the reference loss (T^2 KL over all positions + MSE of
hidden_states[-2]), teacher-written targets (cache, resume) and bad chat records."""

import json
import re

import pytest
import torch
from transformers import LlamaConfig

from swiftkv.cli import main
from swiftkv.data.chat import read_source
from swiftkv.data.packing import pack
from swiftkv.data.split import split_documents
from swiftkv.data.tokens import (
    Document,
    first_prompt,
    prompt_ids,
    prompt_ids_of,
    teacher_documents,
    turn_prompts,
)
from swiftkv.distill.core.trainer import (
    BatchSizes,
    SharedPrefixDistiller,
    freeze_all_but_swiftkv,
    probe_layer_of,
    train_step,
)
from swiftkv.distill.measure.plan import model_parameters
from swiftkv.distill.parallel.world import World
from swiftkv.distill.settings import DistillSettings, default_recipe, settings_for
from swiftkv.metrics import kl_sum
from swiftkv.replies import ReplyCache, read_replies
from tests.tiny import (
    random_chats,
    save_tiny_folder,
    save_tiny_teacher,
    tiny_student,
    tiny_tokenizer,
    write_jsonl,
)


def test_recipes_are_presets_that_explicit_options_override():
    reference = settings_for("m", "reference")
    assert (
        reference.model.init,
        reference.data.targets,
        reference.loss.temperature,
        reference.loss.kl_mean_over,
    ) == (
        "mean",
        "human",
        2.0,
        "positions",
    )
    assert (
        reference.loss.mse_weight,
        reference.loss.mse_hidden_index,
        reference.optim.lr,
        reference.optim.warmup,
    ) == (
        1.0,
        -2,
        2e-4,
        0.05,
    )
    assert settings_for("m", "reference", lr=1e-3, init=None).optim.lr == 1e-3  # None = not given
    ours = settings_for("m")  # the default: R13 of the study, lstsq init, teacher replies cut at 64 tokens
    assert ours.model.recipe == "swiftkv" and ours == DistillSettings.of(
        source="m"
    )  # the field defaults are the recipe
    assert (
        ours.model.init,
        ours.data.targets,
        ours.replies.reply_tokens,
        ours.optim.lr,
        ours.optim.batch_size,
    ) == (
        "lstsq",
        "teacher",
        64,
        2e-3,
        2,
    )
    assert settings_for("m", reply_tokens=512).replies.reply_tokens == 512
    assert (
        settings_for("m", "reference").replies.reply_tokens == 512
    )  # the reference's cap, unused by human targets
    lora = settings_for("m", "swiftkv-lora")  # R13 plus the capacity study's rank-64 adapters
    assert (
        lora.model.init,
        lora.data.targets,
        lora.optim.lr,
        lora.model.trainable,
        lora.model.lora_rank,
        lora.optim.late_lr,
    ) == (
        "lstsq",
        "teacher",
        2e-3,
        "lora",
        64,
        1e-3,
    )
    with pytest.raises(
        ValueError,
        match=r"--recipe 'nope' is unknown; expected one of \['reference', 'reference-large', 'swiftkv', 'swiftkv-lora'\]",
    ):
        settings_for("m", "nope")


def test_cli_names_the_valid_recipes(tmp_path, capsys):
    folder = save_tiny_folder(tmp_path / "m")
    assert main(["distill", str(folder), "--recipe", "fast", "--out", str(tmp_path / "o")]) == 2
    assert (
        "expected one of ['reference', 'reference-large', 'swiftkv', 'swiftkv-lora']"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()


def test_reference_large_is_snowflakes_8b_recipe_at_its_scale():
    """ArcticTraining's Llama-3.1-8B config: the reference loss (T^2 KL at T = 2 over all positions, MSE of
    hidden_states[-2]), mean init, lr 2e-4 with 5% warmup and linear decay, 8 GPUs x micro-batch 1 of 8,192
    tokens, one epoch."""
    large = settings_for("m", "reference-large")
    loss = (
        large.loss.temperature,
        large.loss.kl_mean_over,
        large.loss.mse_weight,
        large.loss.mse_hidden_index,
        large.model.init,
    )
    assert loss == (2.0, "positions", 1.0, -2, "mean")
    assert (
        large.optim.lr,
        large.optim.warmup,
        large.optim.batch_size,
        large.parallel.micro_batch,
        large.data.seq_len,
    ) == (
        2e-4,
        0.05,
        8,
        1,
        8192,
    )
    assert (large.data.tokens, large.data.passes, large.data.targets, large.model.trainable) == (
        500_000_000,
        1,
        "human",
        "swiftkv",
    )
    assert large.train_tokens == 500_039_680  # rounded up to whole steps of 8 x 8192 tokens: 7,630 steps
    assert large.train_tokens // (8 * 8192) == 7630


@pytest.mark.parametrize(
    ("parameters", "recipe"), [(134_515_008, "swiftkv"), (999_999_999, "swiftkv"), (10**9, "reference-large")]
)
def test_without_a_recipe_the_model_size_picks_it(parameters, recipe):
    assert default_recipe(parameters)[0] == recipe


def test_an_8b_config_takes_the_large_recipe_and_the_first_line_says_why(tmp_path, capsys):
    """Llama-3.1-8B's shape, from its config alone (no weights): 8.03B parameters plus SwiftKV's q/k/v
    projections for layers 16-31 (16 x 25.2M = 0.40B) and norm_swiftkv, so
    `distill` without --recipe trains at Snowflake's 8B recipe; a tiny model keeps ours."""
    llama_8b = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    llama_8b.save_pretrained(tmp_path / "8b")
    assert (
        model_parameters(tmp_path / "8b") == 8_030_261_248 + 16 * (4096 * 4096 + 2 * 4096 * 1024) + 4096
    )  # + norm_swiftkv
    plan = ["--plan", "--plan-steps", "0", "--seq-len", "64", "--micro-batch", "1"]
    assert main(["distill", str(tmp_path / "8b"), *plan]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert re.fullmatch(
        r"swiftkv distill: recipe reference-large \(the model has 8\.\d\dB parameters, at least 1B; "
        r"--recipe NAME picks another\)",
        first,
    )
    tiny = save_tiny_folder(tmp_path / "tiny")
    assert main(["distill", str(tiny), *plan]) == 0
    assert "recipe swiftkv (the model has " in capsys.readouterr().err
    assert main(["distill", str(tiny), *plan, "--recipe", "reference"]) == 0
    assert "swiftkv distill: recipe" not in capsys.readouterr().err  # a recipe given is not announced


@pytest.mark.parametrize(("batch", "lr"), [(8, 2e-4), (32, 4e-4), (2, 1e-4), (64, 2e-4 * 8**0.5)])
def test_the_large_recipes_lr_follows_the_global_batch_by_its_square_root(batch, lr):
    assert settings_for("m", "reference-large", batch_size=batch).optim.lr == pytest.approx(lr, rel=1e-12)
    assert (
        settings_for("m", "reference-large", batch_size=batch, lr=3e-4).optim.lr == 3e-4
    )  # a given lr is kept
    for fixed in ("swiftkv", "reference", "swiftkv-lora"):  # tuned at their own step: never rescaled
        assert settings_for("m", fixed, batch_size=batch).optim.lr == settings_for("m", fixed).optim.lr


def test_the_help_states_the_lr_rule(capsys):
    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "under --recipe reference-large a --batch-size B without --lr trains at 2e-4 x sqrt(B / 8)"
        in help_text
    )


def test_probe_is_transformers_hidden_states_minus_two():
    """The MSE compares `hidden_states[-2]` as transformers returns it (the input of the last layer)."""
    torch.manual_seed(0)
    model = tiny_student()
    ids = torch.randint(3, 128, (2, 10))
    positions = torch.arange(10).expand(2, 10)
    settings = settings_for("tiny", "reference")
    layer = probe_layer_of(settings.step_settings().loss, model.config)
    assert layer == model.config.num_hidden_layers - 1
    with torch.no_grad():
        pair = model.model.forward_pair(ids, positions, None, probe_layer=layer)
        model.set_swiftkv(False)
        teacher = model(ids, output_hidden_states=True).hidden_states[-2]
        model.set_swiftkv(True)
        student = model(ids, output_hidden_states=True).hidden_states[-2]
    assert (pair.teacher_probe - teacher.reshape(-1, teacher.shape[-1])).abs().max().item() < 1e-5
    assert (pair.student_probe - student.reshape(-1, student.shape[-1])).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="expected the input of a later layer"):
        probe_layer_of(
            settings_for("tiny", "reference", mse_hidden_index=2).step_settings().loss, model.config
        )


def test_reference_loss_is_kl_over_all_positions_plus_mse():
    """train_step's reported loss = T^2 * sum(KL on targets) / all positions + mean squared error."""
    torch.manual_seed(1)
    model = tiny_student()
    docs = [
        Document(torch.randint(3, 128, (n,)).tolist(), [i % 3 != 0 for i in range(n)]) for n in (13, 20, 15)
    ]
    blocks = pack(docs, 24, max_blocks=2)
    settings = settings_for(
        "tiny", "reference", init="keep", batch_size=2, micro_batch=1, lr=0.0, dtype="float32"
    )
    layer = probe_layer_of(settings.step_settings().loss, model.config)
    with torch.no_grad():
        rows = blocks.loss_mask.reshape(-1).nonzero().squeeze(1)
        pair = model.model.forward_pair(blocks.input_ids, blocks.position_ids, rows, probe_layer=layer)
        kl = kl_sum(model.lm_head(pair.student), model.lm_head(pair.teacher), 2.0)
        mse = (pair.student_probe - pair.teacher_probe).pow(2).mean()
    expected = float(kl) / blocks.loss_mask.numel() + float(mse)
    optimizer = torch.optim.AdamW(freeze_all_but_swiftkv(model), lr=0.0)
    distiller = SharedPrefixDistiller(model, probe_layer=layer)
    loss = train_step(
        distiller, model, optimizer, blocks, BatchSizes.of(blocks), settings.step_settings(), World()
    )
    assert loss == pytest.approx(expected, rel=1e-5)
    assert float(mse) > 1e-4  # the MSE term is really there


def test_top1_term_joins_the_kl_divided_by_the_trained_positions():
    """train_step with --top1-weight w reports (T^2 * KL + w * CE on the teacher's argmax) / targets."""
    torch.manual_seed(2)
    model = tiny_student()
    docs = [
        Document(torch.randint(3, 128, (n,)).tolist(), [i % 3 != 0 for i in range(n)]) for n in (13, 20, 15)
    ]
    blocks = pack(docs, 24, max_blocks=2)
    settings = settings_for(
        "tiny", "swiftkv", init="keep", top1_weight=0.5, batch_size=2, micro_batch=1, lr=0.0, dtype="float32"
    )
    with torch.no_grad():
        rows = blocks.loss_mask.reshape(-1).nonzero().squeeze(1)
        pair = model.model.forward_pair(blocks.input_ids, blocks.position_ids, rows)
        student, teacher = model.lm_head(pair.student), model.lm_head(pair.teacher)
        ce = torch.nn.functional.cross_entropy(student, teacher.argmax(-1), reduction="sum")
        expected = (float(kl_sum(student, teacher, 2.0)) + 0.5 * float(ce)) / len(rows)
    optimizer = torch.optim.AdamW(freeze_all_but_swiftkv(model), lr=0.0)
    loss = train_step(
        SharedPrefixDistiller(model),
        model,
        optimizer,
        blocks,
        BatchSizes.of(blocks),
        settings.step_settings(),
        World(),
    )
    assert loss == pytest.approx(expected, rel=1e-5)
    assert float(ce) > float(kl_sum(student, teacher, 2.0))  # the term is really there, and not small


def fake_teacher(calls: list):
    """A deterministic stand-in generator for the cache logic (real generation: the vllm-marked test)."""
    from swiftkv.data.tokens import Reply

    def generate(prompts):
        calls.append(len(prompts))
        return [Reply([3 + (sum(p) + k) % 50 for k in range(5)] + [2], True) for p in prompts]

    return generate


def test_teacher_documents_train_only_on_the_reply_and_resume_without_duplicates(tmp_path):
    tokenizer = tiny_tokenizer()
    chats = [c["messages"] for c in random_chats(30, seed=3)]
    path = tmp_path / "replies.jsonl"
    calls = []
    first = teacher_documents(iter(chats), tokenizer, 200, ReplyCache(path, fake_teacher(calls)), batch=4)
    assert sum(calls) == len(read_replies(path)) >= len(first) > 0
    prompt = prompt_ids_of(tokenizer, chats[0])
    assert first[0].ids[: len(prompt)] == prompt and not any(first[0].is_target[: len(prompt)])
    assert all(first[0].is_target[len(prompt) :]) and first[0].ids[-1] == tokenizer.eos_token_id
    # A kill mid-write leaves a torn last line: it is cut off, the rest reused, nothing duplicated.
    with path.open("a") as handle:
        handle.write('{"key": "abc", "reply_ids": [4, 5')
    done = len(read_replies(path))
    assert path.read_text().endswith("\n")
    calls.clear()
    again = teacher_documents(iter(chats), tokenizer, 400, ReplyCache(path, fake_teacher(calls)), batch=4)
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == done + sum(calls)
    assert [d.ids for d in again[: len(first)]] == [d.ids for d in first]


def test_skip_tokens_trains_on_the_documents_right_after_an_earlier_stages(tmp_path):
    """A later stage (`--skip-tokens S`) starts at the document after the last one a run of `--tokens S`
    took, in the same chunk of prompts or not, and its split walks the same prompts its replies stage
    wrote (the distill side reads them back without writing)."""
    tokenizer = tiny_tokenizer()
    chats = [c["messages"] for c in random_chats(60, seed=7)]
    cache = ReplyCache(tmp_path / "replies.jsonl", fake_teacher([]))
    every = teacher_documents(iter(chats), tokenizer, 10**6, cache, batch=4, every_turn=True)
    for skip in (1, 150, 333):
        earlier = teacher_documents(iter(chats), tokenizer, skip, cache, batch=4, every_turn=True)
        later = teacher_documents(iter(chats), tokenizer, 300, cache, batch=4, every_turn=True, skip=skip)
        assert [d.ids for d in earlier + later] == [d.ids for d in every[: len(earlier) + len(later)]]
        assert sum(len(d.ids) for d in later[:-1]) < 300 <= sum(len(d.ids) for d in later)
    _, human = split_documents(chats, tokenizer, 0, 64, 400)
    _, next_human = split_documents(chats, tokenizer, 0, 64, 400, skip_tokens=200)
    first_next = [d.ids for d in human].index(next_human[0].ids)
    assert (
        sum(len(d.ids) for d in human[:first_next]) >= 200 > sum(len(d.ids) for d in human[: first_next - 1])
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"skip_tokens": -1}, "--skip-tokens -1: expected a count of tokens, 0 or more"),
        ({"skip_tokens": 10, "targets": "mixed"}, "--skip-tokens with --targets mixed"),
        ({"skip_tokens": 10, "long_share": 0.2}, "--skip-tokens with --long-share"),
    ],
)
def test_skip_tokens_refuses_what_it_cannot_pass_over(given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        settings_for("m", **given).check_skip()


def test_every_turn_prompts_are_each_user_turn_with_its_context():
    tokenizer = tiny_tokenizer()
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one two"},
        {"role": "assistant", "content": "three"},
        {"role": "user", "content": "four"},
        {"role": "assistant", "content": "five six"},
        {"role": "user", "content": " "},
        {"role": "assistant", "content": "seven"},
    ]
    every = turn_prompts(tokenizer, chat, every_turn=True)
    assert [messages for messages, _ in every] == [chat[:2], chat[:4]]  # an empty user turn is no prompt
    assert every[0] == first_prompt(tokenizer, chat) and turn_prompts(tokenizer, chat) == every[:1]
    assert every[1][1] == prompt_ids(tokenizer, chat[:4])
    assert turn_prompts(tokenizer, chat, every_turn=True, max_tokens=len(every[0][1])) == every[:1]
    assert turn_prompts(tokenizer, "plain text", every_turn=True) == []


def test_every_turn_documents_answer_the_later_turns_too(tmp_path):
    tokenizer = tiny_tokenizer()
    chats = [c["messages"] for c in random_chats(12, seed=5)]
    calls = []
    first = teacher_documents(
        iter(chats), tokenizer, 10**6, ReplyCache(tmp_path / "a.jsonl", fake_teacher(calls))
    )
    every = teacher_documents(
        iter(chats), tokenizer, 10**6, ReplyCache(tmp_path / "b.jsonl", fake_teacher(calls)), every_turn=True
    )
    turns = sum(len(turn_prompts(tokenizer, c, every_turn=True)) for c in chats)
    assert len(first) == len(chats) < len(every) == turns
    assert {tuple(d.ids) for d in first} <= {tuple(d.ids) for d in every}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "hi"}, "messages[1] has role None; expected one of ['system', 'user', 'assistant']"),
        (
            {"role": "assistant", "content": None},
            "messages[1] (assistant) has content None; expected a string",
        ),
    ],
)
def test_bad_chat_record_names_file_and_line(tmp_path, message, expected):
    path = write_jsonl(
        tmp_path / "chats.jsonl",
        [random_chats(1)[0], {"messages": [{"role": "user", "content": "a"}, message]}],
    )
    with pytest.raises(ValueError, match=rf"chats.jsonl:2: {re.escape(expected)}"):
        list(read_source(str(path)))


def test_hf_replies_batched_equal_greedy_one_by_one(tmp_path):
    """The transformers reply writer (where vLLM is not installed): left-padded, length-sorted batches
    give each prompt the same greedy reply as generating it alone, and mark where the teacher stopped."""
    from transformers import AutoModelForCausalLM

    from swiftkv.replies import hf_generator

    folder = save_tiny_teacher(tmp_path / "teacher", "llama")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    prompts = [[5, 9, 14, 3, 7], [11, 4], [7, 7, 7, 30, 31, 2, 8, 9], [40]]
    replies = hf_generator(folder, 12, torch.float32, eos, device="cpu")(prompts)
    for prompt, reply in zip(prompts, replies, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            alone = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )[0, len(prompt) :].tolist()
        stop = alone.index(eos) + 1 if eos in alone else len(alone)
        assert reply.ids == alone[:stop]
        assert reply.finished == (eos in alone)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_static_engine_replies_equal_generates(tmp_path, arch):
    """The static engine (a batched greedy loop over a static KV cache) writes the replies transformers'
    `generate` writes, token for token in fp32: left padding, per-row positions, early stops, and batches
    decoded over one shared cache with more slots than they need (as on CUDA), a short batch filled up."""
    from transformers import AutoModelForCausalLM

    from swiftkv.replies import greedy_batch
    from swiftkv.replies.static_greedy import SharedCache, static_generator, static_greedy_batch

    folder = save_tiny_teacher(tmp_path / "teacher", arch)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [[5, 9, 14, 3, 7], [11, 4], [7, 7, 7, 30, 31, 2, 8, 9], [40], [3] * 17]
    # an end-of-turn id the random model does emit, so some replies stop early
    eos = greedy_batch(model, [prompts[0]], 3, eos_token_id=0)[0].ids[1]
    expected = greedy_batch(model, prompts, 12, eos)
    assert any(r.finished for r in expected) and not all(r.finished for r in expected)
    assert static_greedy_batch(model, prompts, 12, eos) == expected
    shared = SharedCache.for_model(model, rows=5, slots=64)
    assert static_greedy_batch(model, prompts, 12, eos, shared=shared) == expected
    others = [[9, 9, 2], [30], [4, 5, 6, 7], [8, 8], [1, 2, 3, 4, 5, 6]]
    assert static_greedy_batch(model, others, 12, eos, shared=shared) == greedy_batch(model, others, 12, eos)
    with pytest.raises(ValueError, match="does not fit the shared cache"):
        static_greedy_batch(model, others[:4], 12, eos, shared=shared)
    assert static_generator(folder, 12, torch.float32, eos, rows=2, device="cpu")(prompts) == expected
    assert static_generator(folder, 12, torch.float32, eos, 2, "cpu", share_cache=True)(prompts) == expected


def test_static_engine_with_cudas_attention_paths_writes_the_same_replies(tmp_path, monkeypatch):
    """The static writer as it runs on CUDA (one shared cache; decode steps folded over the grouped K/V
    heads, a masked prompt through transformers' sdpa), taken here on a CPU: the replies `generate` writes."""
    from transformers import AutoModelForCausalLM

    from swiftkv.model import attention
    from swiftkv.replies import greedy_batch
    from swiftkv.replies.static_greedy import static_generator

    folder = save_tiny_teacher(tmp_path / "teacher", "llama")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [[5, 9, 14, 3, 7], [11, 4], [7, 7, 7, 30, 31, 2, 8, 9], [40], [3] * 17]
    eos = greedy_batch(model, [prompts[0]], 3, eos_token_id=0)[0].ids[1]
    expected = greedy_batch(model, prompts, 12, eos)
    taken = []
    monkeypatch.setattr(attention, "folded_decode", record(attention.folded_decode, taken, "fold"))
    monkeypatch.setattr(
        attention, "sdpa_attention_forward", record(attention.sdpa_attention_forward, taken, "sdpa")
    )
    monkeypatch.setattr(attention, "fused_kernels", lambda device: True)
    writer = static_generator(folder, 12, torch.float32, eos, rows=3, device="cpu", share_cache=True)
    assert writer(prompts) == expected
    assert {"fold", "sdpa"} <= set(taken)


def record(function, taken: list, name: str):
    def recorded(*args, **kwargs):
        taken.append(name)
        return function(*args, **kwargs)

    return recorded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_decode_equals_attention_over_repeated_heads(dtype):
    """A decode step's query heads folded onto their K/V head give what SDPA gives over the K/V heads
    repeated (as transformers' sdpa repeats them), masked slots included."""
    from torch.nn import functional as F

    from swiftkv.model.attention import folded_decode

    torch.manual_seed(0)
    rows, heads, kv_heads, slots, dim = 3, 6, 2, 11, 8
    query = torch.randn(rows, heads, 1, dim, dtype=dtype)
    key, value = (torch.randn(rows, kv_heads, slots, dim, dtype=dtype) for _ in range(2))
    mask = torch.ones(rows, 1, 1, slots, dtype=torch.bool)
    mask[0, ..., :4] = False
    repeated = F.scaled_dot_product_attention(
        query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    )
    folded = folded_decode(query, key, value, mask, 0.3)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(folded, repeated.transpose(1, 2), atol=tolerance, rtol=tolerance)


def test_static_engine_refuses_a_student_writer():
    settings = settings_for("tiny", reply_writer="student", reply_engine="static", init="keep")
    with pytest.raises(ValueError, match="--reply-engine static writes with a plain model"):
        settings.check_written_replies()


def test_load_blocks_with_teacher_and_mixed_targets(tmp_path):
    """Through the data loader a run uses: teacher targets train on the replies only; mixed takes
    half the train tokens from teacher replies and the rest from the data's own conversations; the
    held-out blocks are the data's own in every case."""
    from swiftkv.data.packing import load_blocks

    tokenizer = tiny_tokenizer()
    data = str(write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=5)))
    cache = ReplyCache(tmp_path / "replies.jsonl", fake_teacher([]))
    human = load_blocks(data, tokenizer, 64, 1024, 256, seed=0)
    taught = load_blocks(data, tokenizer, 64, 1024, 256, seed=0, replies=cache)
    mixed = load_blocks(data, tokenizer, 64, 1024, 256, seed=0, replies=cache, human_share=0.5)
    assert torch.equal(human[1].input_ids, taught[1].input_ids) and torch.equal(
        human[1].input_ids, mixed[1].input_ids
    )
    replies = {tuple(r.ids) for r in read_replies(tmp_path / "replies.jsonl").values()}
    assert len(replies) > 0
    for blocks in (taught, mixed):
        assert blocks[0].loss_mask.any()
    # the mixed run's train tokens are not all teacher-written: some trained positions predict human text
    assert not torch.equal(mixed[0].input_ids.sort().values, taught[0].input_ids.sort().values)


def test_student_written_replies_are_its_own_greedy_answers_and_cached_apart(tmp_path):
    """`--reply-writer student`: the SwiftKV source as converted writes the replies (swiftkv on), the
    teacher path of the same folder writes the default ones, and the two caches never mix."""
    from transformers import AutoModelForCausalLM

    from swiftkv.replies import reply_cache

    folder = save_tiny_folder(tmp_path / "student")
    tokenizer = tiny_tokenizer()
    eos = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [[5, 9, 14, 3, 7], [11, 4], [7, 7, 30, 31, 2, 8]]
    written = {}
    for writer in ("student", "teacher"):
        settings = settings_for(
            str(folder),
            targets="teacher",
            reply_writer=writer,
            reply_engine="hf",
            reply_tokens=6,
            dtype="float32",
        )
        cache = reply_cache(settings.replies_settings(), tokenizer)
        assert cache.path.name.startswith(f"{writer}-replies-")
        written[writer] = [r.ids for r in cache.get(prompts)]
        for prompt, reply in zip(prompts, written[writer], strict=True):
            ids = torch.tensor([prompt])
            with torch.no_grad():
                alone = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=6,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=eos,
                    swiftkv=writer == "student",
                )[0, len(prompt) :].tolist()
            assert reply == (alone[: alone.index(eos) + 1] if eos in alone else alone)
    assert written["student"] != written["teacher"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"targets": "human"}, "--targets human trains on the data's own replies"),
        ({"init": "mean"}, "--init mean replaces them before training"),
    ],
)
def test_student_writer_refuses_runs_it_cannot_serve(tmp_path, given, expected):
    from swiftkv.distill.start.setup import load_student

    settings = settings_for(
        str(tmp_path / "nowhere"), reply_writer="student", out=str(tmp_path / "out"), **given
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_student(settings)


def test_only_vllm_splits_a_writer_over_ranks(tmp_path, capsys):
    from swiftkv.replies import RepliesSettings
    from swiftkv.replies.vllm_engines import available_devices

    for engine in ("hf", "static"):
        for option in ("tensor_parallel_size", "data_parallel_size"):
            with pytest.raises(ValueError, match=f"only the vllm engine .* writes with {engine}"):
                RepliesSettings(source="m", engine=engine, **{option: 2}).check_engine()
    devices, kind = available_devices(torch.cuda.is_available())
    RepliesSettings(source="m", engine="vllm", tensor_parallel_size=devices).check_engine()
    RepliesSettings(source="m", engine="vllm", data_parallel_size=devices).check_engine()
    # More engine ranks than devices: one error with both numbers, before anything starts.
    wanted = f"--data-parallel-size {devices + 1} x --tensor-parallel-size 1 needs {devices + 1} {kind}"
    with pytest.raises(ValueError, match=re.escape(f"{wanted}, one per rank; this machine has {devices}")):
        RepliesSettings(source="m", engine="vllm", data_parallel_size=devices + 1).check_engine()
    with pytest.raises(ValueError, match="--tensor-parallel-size 0: expected 1 or more"):
        RepliesSettings(source="m", engine="vllm", tensor_parallel_size=0).check_engine()
    with pytest.raises(ValueError, match="--data-parallel-size 0: expected 1 or more"):
        RepliesSettings(source="m", engine="vllm", data_parallel_size=0).check_engine()
    folder = save_tiny_teacher(tmp_path / "teacher")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(4))
    out = tmp_path / "replies.jsonl"
    args = ["replies", str(folder), "--data", str(data), "--out", str(out), "--engine", "hf"]
    assert main([*args, "--tensor-parallel-size", "2"]) == 2
    assert "--tensor-parallel-size 2: only the vllm engine" in capsys.readouterr().err
    assert not out.exists()
