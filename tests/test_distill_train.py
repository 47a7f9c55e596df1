"""Distillation loss and trainer on tiny random models: chunking, shared prefix, frozen teacher, resume."""

import pytest
import torch

from swiftkv.data.packing import pack
from swiftkv.data.tokens import Document
from swiftkv.distill.core.loss import LossTerms, backward_logit_loss, logit_loss_sum
from swiftkv.distill.core.trainer import (
    BatchSizes,
    SharedPrefixDistiller,
    accumulate_gradients,
    evaluate,
    freeze_all_but_swiftkv,
    lr_at,
    swiftkv_parameters,
    train_step,
)
from swiftkv.distill.parallel.world import World
from swiftkv.distill.run import distill
from swiftkv.distill.settings import DistillSettings
from swiftkv.model.surgery import save_swiftkv_params
from tests.tiny import random_chats, tiny_student, tiny_tokenizer, write_jsonl


@pytest.mark.parametrize("top1_weight", [0.0, 0.5])
def test_chunked_loss_and_gradients_equal_unchunked(top1_weight):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)
    projection = torch.nn.Linear(16, 16)
    inputs, teacher = torch.randn(37, 16), torch.randn(37, 16)
    gradients = []
    for chunked in (False, True):
        projection.zero_grad()
        student = projection(inputs)
        if chunked:
            value = backward_logit_loss(
                student, teacher, head, LossTerms(2.0, chunk_rows=8, top1_weight=top1_weight), scale=0.1
            )
        else:
            loss = logit_loss_sum(student, teacher, head, LossTerms(2.0, top1_weight=top1_weight))
            (loss * 0.1).backward()
            value = float(loss.detach())
        gradients.append((value, projection.weight.grad.clone()))
    (plain, plain_grad), (chunked, chunked_grad) = gradients
    assert abs(plain - chunked) / plain < 1e-6
    assert (plain_grad - chunked_grad).abs().max().item() < 1e-6
    assert plain_grad.abs().max().item() > 1e-4  # the check compares real gradients


def test_kl_is_zero_for_identical_rows_and_scaled_by_t_squared():
    head = torch.nn.Linear(8, 20)
    rows = torch.randn(5, 8)
    assert float(logit_loss_sum(rows, rows, head, LossTerms(2.0))) == pytest.approx(0.0, abs=1e-6)
    other = torch.randn(5, 8)
    with torch.no_grad():
        p, q = torch.log_softmax(head(rows) / 3, -1), torch.log_softmax(head(other) / 3, -1)
        expected = float((p.exp() * (p - q)).sum() * 9)
    assert float(logit_loss_sum(other, rows, head, LossTerms(3.0))) == pytest.approx(expected, rel=1e-5)


def test_top1_term_is_the_cross_entropy_of_the_teachers_argmax():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20)
    student, teacher = torch.randn(6, 8), torch.randn(6, 8)
    with torch.no_grad():
        argmax = head(teacher).argmax(-1)
        nll = -torch.log_softmax(head(student), -1)[torch.arange(6), argmax].sum()
        kl = logit_loss_sum(student, teacher, head, LossTerms(1.0))
    assert float(logit_loss_sum(student, teacher, head, LossTerms(1.0, top1_weight=0.5))) == pytest.approx(
        float(kl + 0.5 * nll), rel=1e-5
    )
    # where the student already puts (almost) all its mass on the teacher's argmax, the term vanishes
    sharp = torch.nn.Linear(8, 20)
    with torch.no_grad():
        sharp.weight.copy_(head.weight * 1000)
        sharp.bias.copy_(head.bias * 1000)
    assert float(logit_loss_sum(teacher, teacher, sharp, LossTerms(1.0, top1_weight=1.0))) == pytest.approx(
        0.0, abs=1e-3
    )


def blocks_for(model, seq_len=24, count=2):
    docs = [Document(torch.randint(3, 128, (n,)).tolist(), [True] * n) for n in (11, 20, 9, 8)]
    return pack(docs, seq_len, max_blocks=count)


def loss_and_grads(model, blocks, naive: bool):
    parameters = freeze_all_but_swiftkv(model)
    for p in parameters:
        p.grad = None
    rows = blocks.loss_mask.reshape(-1).nonzero().squeeze(1)
    pair = SharedPrefixDistiller(model, naive=naive)(blocks.input_ids, blocks.position_ids, rows)
    value = backward_logit_loss(pair.student, pair.teacher, model.lm_head, LossTerms(2.0, chunk_rows=16))
    return value, [p.grad.clone() for p in parameters]


def test_shared_prefix_gives_the_naive_loss_and_gradients():
    torch.manual_seed(1)
    model = tiny_student()
    blocks = blocks_for(model)
    shared, shared_grads = loss_and_grads(model, blocks, naive=False)
    naive, naive_grads = loss_and_grads(model, blocks, naive=True)
    assert shared > 1e-3 and abs(shared - naive) / shared < 1e-6
    assert max((a - b).abs().max().item() for a, b in zip(shared_grads, naive_grads, strict=True)) < 1e-6


def test_teacher_rows_equal_the_plain_teacher_forward_per_document():
    """Packed teacher rows = each document run alone through the unmodified teacher path."""
    torch.manual_seed(2)
    model = tiny_student()
    a, b = torch.randint(3, 128, (1, 10)), torch.randint(3, 128, (1, 14))
    blocks = pack([Document(a[0].tolist(), [True] * 10), Document(b[0].tolist(), [True] * 14)], seq_len=24)
    rows = torch.arange(24)
    with torch.no_grad():
        pair = SharedPrefixDistiller(model)(blocks.input_ids, blocks.position_ids, rows)
        model.set_swiftkv(False)
        alone = torch.cat([model.model(input_ids=x, use_cache=False).last_hidden_state[0] for x in (a, b)])
    assert (pair.teacher - alone).abs().max().item() < 1e-5
    assert (pair.student - pair.teacher).abs().max().item() > 1e-2  # the random student really differs


def test_one_step_changes_only_the_swiftkv_parameters():
    torch.manual_seed(3)
    model = tiny_student()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settings = DistillSettings.of(source="tiny", batch_size=2, micro_batch=1, lr=1e-2, dtype="float32")
    parameters = freeze_all_but_swiftkv(model)
    optimizer = torch.optim.AdamW(parameters, lr=1e-2)
    blocks = blocks_for(model)
    train_step(
        SharedPrefixDistiller(model),
        model,
        optimizer,
        blocks,
        BatchSizes.of(blocks),
        settings.step_settings(),
        World(),
    )
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == set(swiftkv_parameters(model))
    assert len(changed) == 3 * 3 + 1  # q/k/v_proj_swiftkv of layers 3..5 and norm_swiftkv


def test_lr_schedule_warms_up_then_decays_to_zero():
    rates = [lr_at(s, 20, 1.0, 0.1) for s in range(20)]
    assert rates[0] == 0.5 and rates[1] == 1.0
    assert all(a >= b for a, b in zip(rates[1:], rates[2:], strict=False)) and rates[-1] == pytest.approx(
        1 / 18
    )


def run_settings(tmp_path, **overrides) -> DistillSettings:
    data = tmp_path / "chats.jsonl"
    if not data.exists():
        write_jsonl(data, random_chats(60, seed=5))
    values = dict(
        source="tiny",
        data=str(data),
        init="keep",
        targets="human",
        tokens=32 * 4 * 4,
        heldout_tokens=64,
        seq_len=32,
        batch_size=4,
        micro_batch=2,
        lr=5e-3,
        eval_every=2,
        checkpoint_every=1,
        checkpoint_dir=str(tmp_path / "ckpt"),
        dtype="float32",
    )
    return DistillSettings.of(**{**values, **overrides})


def test_resume_equals_an_uninterrupted_run(tmp_path):
    tokenizer = tiny_tokenizer()
    whole = tiny_student()
    whole_state = distill(run_settings(tmp_path, checkpoint_dir=str(tmp_path / "whole")), whole, tokenizer)
    first = tiny_student()
    distill(run_settings(tmp_path, stop_after=2), first, tokenizer)
    resumed = tiny_student()  # a fresh process: weights come from the checkpoint only
    state = distill(run_settings(tmp_path, resume=True), resumed, tokenizer)
    assert state.step == whole_state.step == 4
    for name, parameter in swiftkv_parameters(whole).items():
        assert torch.equal(parameter, swiftkv_parameters(resumed)[name]), name
    assert [h for h in state.history if "loss" in h] == [h for h in whole_state.history if "loss" in h]
    initial = swiftkv_parameters(tiny_student())
    assert any(not torch.equal(p, initial[n]) for n, p in swiftkv_parameters(whole).items())


def test_resume_refuses_another_configuration_and_a_missing_checkpoint(tmp_path):
    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path, stop_after=1), tiny_student(), tokenizer)
    with pytest.raises(ValueError, match="lr: checkpoint 0.005 vs now 0.001"):
        distill(run_settings(tmp_path, resume=True, lr=1e-3), tiny_student(), tokenizer)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        distill(
            run_settings(tmp_path, resume=True, checkpoint_dir=str(tmp_path / "none")),
            tiny_student(),
            tokenizer,
        )


def record_trained_blocks(monkeypatch) -> list[torch.Tensor]:
    """The input ids of every step's blocks, as the trainer takes them."""
    from swiftkv.distill.core import loop

    taken, take = [], loop.rank_blocks

    def recorded(train, step, batch_size, world):
        blocks = take(train, step, batch_size, world)
        taken.append(blocks.input_ids.clone())
        return blocks

    monkeypatch.setattr(loop, "rank_blocks", recorded)
    return taken


def test_a_continued_run_starts_from_the_earlier_tensors_and_trains_the_steps_after_it(tmp_path, monkeypatch):
    """--continue-from: the earlier run's trained tensors (its held-out score is where this run starts),
    then the next pass's blocks (pass 1 of --passes 2), a fresh schedule over the 4 steps it adds."""
    from swiftkv.data.packing import load_blocks

    tokenizer = tiny_tokenizer()
    earlier = tiny_student()
    first = distill(run_settings(tmp_path), earlier, tokenizer)
    taken = record_trained_blocks(monkeypatch)
    more = run_settings(
        tmp_path,
        tokens=2 * 32 * 4 * 4,
        passes=2,
        continue_from=str(tmp_path / "ckpt"),
        checkpoint_dir=str(tmp_path / "more"),
    )
    continued = tiny_student()  # a fresh process: the tensors come from the earlier checkpoint only
    state = distill(more, continued, tokenizer)
    assert (state.continued_steps, state.step, state.total_steps) == (4, 4, 4)
    evals = [h for h in state.history if "kl" in h]
    assert evals[0]["kl"] == [h for h in first.history if "kl" in h][-1]["kl"]
    assert [h["lr"] for h in state.history if "lr" in h][
        0
    ] == more.optim.lr  # warmup again: 5% of 4 steps is 1
    stream, _ = load_blocks(more.data.spec, tokenizer, 32, 512, 64, 0, passes=2)
    assert torch.equal(torch.cat(taken[-4:]), stream.input_ids[16:])  # (the first: the micro-batch probe's)
    changed = [
        n
        for n, p in swiftkv_parameters(continued).items()
        if not torch.equal(p, swiftkv_parameters(earlier)[n])
    ]
    assert changed


def test_a_continued_run_resumes_exactly(tmp_path):
    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path), tiny_student(), tokenizer)
    more = dict(tokens=2 * 32 * 4 * 4, passes=2, continue_from=str(tmp_path / "ckpt" / "checkpoint.pt"))
    whole = tiny_student()
    distill(run_settings(tmp_path, checkpoint_dir=str(tmp_path / "whole"), **more), whole, tokenizer)
    distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "cut"), stop_after=2, **more),
        tiny_student(),
        tokenizer,
    )
    resumed = tiny_student()
    state = distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "cut"), resume=True, **more), resumed, tokenizer
    )
    assert (state.continued_steps, state.step) == (4, 4)
    for name, parameter in swiftkv_parameters(whole).items():
        assert torch.equal(parameter, swiftkv_parameters(resumed)[name]), name


def test_a_continuation_resumed_after_its_earlier_run_moved_on_is_refused(tmp_path):
    """The earlier run trained on (resumed) after the continuation started from it: resuming the
    continuation would take the data after another step, so it is refused before any work."""
    from swiftkv.distill.start.decide import decide_start

    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path, stop_after=2), tiny_student(), tokenizer)
    more = dict(tokens=2 * 32 * 4 * 4, passes=2, continue_from=str(tmp_path / "ckpt"))
    distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "cut"), stop_after=1, **more),
        tiny_student(),
        tokenizer,
    )
    distill(run_settings(tmp_path, resume=True), tiny_student(), tokenizer)  # the earlier run: 2 -> 4 steps
    with pytest.raises(
        ValueError, match="continued .* after 2 steps of the data, and that checkpoint now ends after 4"
    ):
        decide_start(
            run_settings(tmp_path, checkpoint_dir=str(tmp_path / "cut"), resume=True, **more),
            writes_output=False,
        )


def test_continue_from_refuses_another_run_other_data_and_no_steps_left(tmp_path):
    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path), tiny_student(), tokenizer)
    ckpt = str(tmp_path / "ckpt")

    def continuing(**overrides):
        values = dict(
            tokens=2 * 32 * 4 * 4, passes=2, continue_from=ckpt, checkpoint_dir=str(tmp_path / "more")
        )
        distill(run_settings(tmp_path, **{**values, **overrides}), tiny_student(), tokenizer)

    with pytest.raises(ValueError, match="another student or data .*seed: checkpoint 0 vs now 1"):
        continuing(seed=1)
    with pytest.raises(
        ValueError, match="held 512 train tokens and this run's holds 1,024 .* --tokens 1,024 with --passes 2"
    ):
        continuing(passes=1)
    with pytest.raises(
        ValueError, match="it has trained 512 tokens .* asks for 512 in all; ask for more --tokens"
    ):
        continuing(tokens=32 * 4 * 4, passes=1)
    with pytest.raises(FileNotFoundError, match="--continue-from .*none: no checkpoint there"):
        continuing(continue_from=str(tmp_path / "none"))
    short = dict(tokens=10**6, passes=2, checkpoint_dir=str(tmp_path / "short"))  # more than the data holds
    state = distill(run_settings(tmp_path, **short), tiny_student(), tokenizer)
    with pytest.raises(
        ValueError, match=f"data gives {state.step} steps and .* trained {state.step} of them"
    ):
        continuing(
            **{**short, "continue_from": str(tmp_path / "short"), "checkpoint_dir": str(tmp_path / "after")}
        )
    with pytest.raises(ValueError, match="--passes 0: expected a whole number"):
        from swiftkv.distill.start.decide import decide_start

        decide_start(run_settings(tmp_path, passes=0), writes_output=False)


def test_init_from_starts_from_the_earlier_tensors_on_a_run_of_its_own(tmp_path):
    """--init-from: the earlier run's trained tensors (its held-out score is where this run starts), then
    this run's own data, step and schedule from step 0; and longer blocks than the earlier run's train."""
    tokenizer = tiny_tokenizer()
    earlier = tiny_student()
    first = distill(run_settings(tmp_path), earlier, tokenizer)
    own = dict(init_from=str(tmp_path / "ckpt"), tokens=32 * 2 * 3, batch_size=2, lr=1e-3, warmup=0.0)
    state = distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "own"), **own), tiny_student(), tokenizer
    )
    assert (state.continued_steps, state.step) == (0, 3)
    assert [h for h in state.history if "kl" in h][0]["kl"] == [h for h in first.history if "kl" in h][-1][
        "kl"
    ]
    longer = tiny_student()
    distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "long"), seq_len=64, **own), longer, tokenizer
    )
    changed = [
        n for n, p in swiftkv_parameters(longer).items() if not torch.equal(p, swiftkv_parameters(earlier)[n])
    ]
    assert changed
    # that run continued (--continue-from, a second pass): its own tensors, not --init-from's again
    more = dict(own, tokens=2 * 32 * 2 * 3, passes=2, continue_from=str(tmp_path / "own"))
    state = distill(
        run_settings(tmp_path, checkpoint_dir=str(tmp_path / "more"), **more), tiny_student(), tokenizer
    )
    assert (state.continued_steps, state.step) == (3, 3)


def test_init_from_refuses_another_student_and_no_checkpoint(tmp_path):
    from swiftkv.distill.start.decide import decide_start

    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path, stop_after=1), tiny_student(), tokenizer)
    ckpt = str(tmp_path / "ckpt")
    other = dict(checkpoint_dir=str(tmp_path / "other"), init_from=ckpt)
    with pytest.raises(ValueError, match="another student .*trainable: checkpoint 'swiftkv' vs now 'lora'"):
        decide_start(run_settings(tmp_path, trainable="lora", lora_rank=4, **other), writes_output=False)
    with pytest.raises(FileNotFoundError, match="--init-from .*none: no checkpoint there"):
        decide_start(
            run_settings(tmp_path, **{**other, "init_from": str(tmp_path / "none")}), writes_output=False
        )


def test_tokens_round_up_to_whole_steps_so_at_least_that_many_train(tmp_path):
    # 1M at steps of 2 x 1024 is 488.3 steps: 489 train (1,001,472 tokens), not 488 (999,424).
    assert DistillSettings.of(tokens=1_000_000, batch_size=2, seq_len=1024).train_tokens == 489 * 2048
    assert DistillSettings.of(tokens=4 * 2048, batch_size=2, seq_len=1024).train_tokens == 4 * 2048
    state = distill(run_settings(tmp_path, tokens=32 * 4 * 3 + 1), tiny_student(), tiny_tokenizer())
    assert state.step == state.total_steps == 4


def test_distillation_lowers_heldout_kl(tmp_path):
    state = distill(run_settings(tmp_path, tokens=32 * 4 * 10, lr=1e-2), tiny_student(), tiny_tokenizer())
    evals = [h for h in state.history if "kl" in h]
    assert evals[-1]["kl"] < 0.8 * evals[0]["kl"], evals


def test_qwen3_distillation_lowers_heldout_kl_and_trains_only_its_swiftkv_parameters(tmp_path):
    """Qwen3 with AcrossKV: its SwiftKV norms (q_norm_swiftkv per later layer, k_norm_swiftkv per group
    owner) train beside the projections and norm_swiftkv; nothing else moves."""
    model = tiny_student(2, arch="qwen3", g=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = distill(run_settings(tmp_path, tokens=32 * 4 * 10, lr=1e-2), model, tiny_tokenizer())
    evals = [h for h in state.history if "kl" in h]
    assert evals[-1]["kl"] < 0.8 * evals[0]["kl"], evals
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == set(swiftkv_parameters(model))
    # layers 2..5: q_proj + q_norm each; owners 2 and 4: k/v_proj + k_norm each; norm_swiftkv
    assert len(changed) == 4 * 2 + 2 * 3 + 1
    assert {n.split(".")[-2] for n in changed} >= {"q_norm_swiftkv", "k_norm_swiftkv", "norm_swiftkv"}


def test_saved_swiftkv_params_hold_only_the_trained_tensors(tmp_path):
    import json

    from safetensors.torch import load_file

    model = tiny_student()
    save_swiftkv_params(model, tmp_path / "w", base="tiny", dtype=torch.float32)
    tensors = load_file(tmp_path / "w" / "swiftkv.safetensors")
    assert set(tensors) == set(swiftkv_parameters(model))
    for name, parameter in swiftkv_parameters(model).items():
        assert torch.equal(tensors[name], parameter.detach())
    spec = json.loads((tmp_path / "w" / "swiftkv.json").read_text())
    assert spec == {"base": "tiny", "num_key_value_layers": 3, "key_value_group_size": 1}


def test_one_process_trains_on_the_gpu_when_there_is_one(monkeypatch):
    """Without torchrun, a GPU machine still trains on its GPU (it used to fall back to the CPU)."""
    from swiftkv.distill.parallel.world import init_world

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert init_world().device == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert init_world().device == torch.device("cpu")


def test_a_micro_batch_without_trained_positions_adds_nothing_and_the_run_goes_on(tmp_path):
    """A block of user text only (no assistant token) used to crash the student's row selection
    (`cannot reshape tensor of 0 elements` in late_student): it now adds zero loss and zero gradient,
    in training and in the held-out evaluation alike."""
    torch.manual_seed(4)
    model = tiny_student()
    blocks = blocks_for(model)
    blocks.loss_mask[1] = False
    step = DistillSettings.of(source="tiny", micro_batch=1, dtype="float32").step_settings()
    parameters = freeze_all_but_swiftkv(model)

    def loss_and_grads(which):
        for p in parameters:
            p.grad = None
        loss = accumulate_gradients(
            SharedPrefixDistiller(model), model, which, BatchSizes.of(blocks), step, World()
        )
        return loss, [p.grad.clone() for p in parameters]

    (both, both_grads), (first, first_grads) = (
        loss_and_grads(blocks),
        loss_and_grads(blocks.select(slice(0, 1))),
    )
    assert both == first > 0 and all(torch.equal(a, b) for a, b in zip(both_grads, first_grads, strict=True))
    measured, alone = (
        evaluate(model, blocks, step, World()),
        evaluate(model, blocks.select(slice(0, 1)), step, World()),
    )
    assert measured == alone and measured["positions"] == int(blocks.loss_mask[0].sum())
    # End to end, as a new user met it: long user turns, short replies, one block per forward.
    chats = [
        {
            "messages": [
                {"role": "user", "content": " ".join(["word"] * 120)},
                {"role": "assistant", "content": "ok"},
            ]
        }
        for _ in range(40)
    ]
    settings = run_settings(
        tmp_path,
        data=str(write_jsonl(tmp_path / "long-questions.jsonl", chats)),
        targets="human",
        micro_batch=1,
        tokens=32 * 4 * 2,
    )
    state = distill(settings, tiny_student(), tiny_tokenizer())
    assert state.step == 2 and all(h["loss"] >= 0 for h in state.history if "loss" in h)
