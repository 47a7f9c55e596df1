"""What a token costs, counted as the matmuls that run: a prefill of the teacher or the student (bench's
compute bound, eval's trade-off sweep) and one distillation step (distill's MFU and plan)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model.config import head_dim_of, is_sparse_layer, is_swiftkv, routed_experts
from .model.families import family_of


def gated_mlp_flops(hidden: int, width: int) -> int:
    """FLOPs per token of one gated MLP (gate, up and down projections) of inner width `width`."""
    return 2 * 3 * hidden * width


def mlp_flops(config, layer: int) -> int:
    """FLOPs per token of decoder layer `layer`'s MLP as it runs, the one definition every count uses. A dense
    MLP: its three projections at `intermediate_size`. An MoE block (`is_sparse_layer`): its router (hidden x
    experts), the `num_experts_per_tok` experts each token is routed to and a shared expert where the config has
    one (`mlp_token_width`), and Qwen2-MoE's one-output gate on its shared expert. The experts a token is not
    routed to run nothing for it, whatever the kernel (transformers' grouped or per-expert loop, vLLM's fused MoE)."""
    hidden = config.hidden_size
    flops = gated_mlp_flops(hidden, mlp_token_width(config, layer))
    if not is_sparse_layer(config, layer):
        return flops
    router = 2 * hidden * routed_experts(config)
    shared_gate = 2 * hidden if has_shared_expert_gate(config) else 0
    return flops + router + shared_gate


def mlp_token_width(config, layer: int) -> int:
    """The inner width one token's pass through layer `layer`'s MLP spans: `intermediate_size` for a dense MLP;
    for an MoE block the `num_experts_per_tok` routed experts' widths (`moe_intermediate_size`, Mixtral's
    `intermediate_size`) plus its shared expert's (Qwen2-MoE's `shared_expert_intermediate_size`, DeepSeek's
    `n_shared_experts` experts as one MLP). What its gated projections compute (`mlp_flops`) and what their
    activations hold (`distill.plan`) scale with it."""
    if not is_sparse_layer(config, layer):
        return config.intermediate_size
    return config.num_experts_per_tok * expert_width(config) + shared_expert_width(config)


def expert_width(config) -> int:
    """One routed expert's inner width: `moe_intermediate_size`, Mixtral's `intermediate_size`."""
    return getattr(config, "moe_intermediate_size", None) or config.intermediate_size


def shared_expert_width(config) -> int:
    """The inner width of an MoE block's shared expert: Qwen2-MoE's `shared_expert_intermediate_size`, DeepSeek's
    `n_shared_experts` experts run as one MLP; 0 where there is none."""
    sized = getattr(config, "shared_expert_intermediate_size", None)
    return sized or (getattr(config, "n_shared_experts", None) or 0) * expert_width(config)


def has_shared_expert_gate(config) -> bool:
    """Whether the shared expert's output passes a one-output gate (Qwen2-MoE); DeepSeek's is added ungated."""
    return getattr(config, "shared_expert_intermediate_size", None) is not None


def layer_linear_flops(config, layer: int) -> dict[str, int]:
    """Multiply-accumulates x 2 per token of decoder layer `layer`'s projections: the query, the K/V (for every
    token: the teacher's own, or an AcrossKV group's from s), o_proj (the family's kind of attention:
    `Family.attention`), and the MLP (`mlp_flops`)."""
    return {**attention_counts(config).projection_flops(config), "mlp": mlp_flops(config, layer)}


def attention_counts(config):
    """What the config's kind of attention computes and keeps per token (its family's `AttentionCounts`)."""
    return family_of(config.model_type).attention


def attention_flops(config, keys: float) -> float:
    """QK^T and AV FLOPs of one query token over `keys` keys, one layer."""
    return attention_counts(config).score_flops(config, keys)


def prefill_layers_flops(config, keys: float) -> float:
    """FLOPs per prompt token of a prefill whose queries attend over `keys` keys on average. A plain model runs
    every layer; a SwiftKV model (its student, which serving runs) runs layers < N and, from
    s = norm_swiftkv(h_N), each AcrossKV group owner's k/v_proj_swiftkv: a prompt token that needs no logits
    skips the later layers (the one row per prompt that does is left out, as the lm_head is)."""
    student = is_swiftkv(config)
    layers = range(config.num_key_value_layers if student else config.num_hidden_layers)
    flops = sum(sum(layer_linear_flops(config, i).values()) + attention_flops(config, keys) for i in layers)
    return flops + (config.num_kv_groups * layer_linear_flops(config, 0)["kv"] if student else 0)


def prefill_flops_per_token(config, prompt_len: int) -> float:
    """Prefill FLOPs per prompt token of the model `config` describes (`prefill_layers_flops`: a SwiftKV
    config counts its student): the projections plus causal attention over (prompt_len + 1) / 2 keys on
    average. The lm_head is excluded: a prefill with max_tokens=1 applies it to one row per prompt."""
    return prefill_layers_flops(config, (prompt_len + 1) / 2)


def prefill_compute_saving(config) -> float | None:
    """Fraction of a prompt token's linear-layer FLOPs a SwiftKV student skips: layers >= N run only
    their group owners' k/v_proj_swiftkv. Attention-score FLOPs (length dependent) are not counted."""
    if not is_swiftkv(config):
        return None
    teacher = sum(sum(layer_linear_flops(config, i).values()) for i in range(config.num_hidden_layers))
    return 1 - prefill_layers_flops(config, 0) / teacher


# What one distillation step executes (`distill/core/trainer.py`, `model/modeling.py`, `distill/core/loss.py`), counted
# as the matmuls that run. Attention is counted over every key of the block (causal masking not taken off), and
# its backward as twice its forward: the convention of torchtitan's and nanoGPT's MFU (`6N + 12 L H Q T`); the
# kernels that recompute the scores in their backward execute half an attention forward more.
LATE_COPIES = ("late", "late-norms")  # trainable sets whose later o_proj / MLP get weight gradients


@dataclass(frozen=True)
class StepPaths:
    """What a run's settings make a step run besides the SwiftKV projections."""

    trainable: str = "swiftkv"  # `--trainable`: lora adds adapters, late / late-norms trained copies
    lora_rank: int = 16
    naive: bool = False  # layers < N run a second time, for the student (no gradient reaches them)
    probe: bool = False  # the MSE's probe: the student's later layers run on every position
    recompute: bool = False  # activation checkpointing: the student's later layers run forward again


@dataclass(frozen=True)
class MicroBatch:
    """One forward + backward of the trainer: `blocks` blocks of `seq_len` tokens, the student's later layers
    run on `positions` sequence positions of every block (the union of the trained ones,
    `modeling.student_selection`; all with the probe), and `rows` trained rows reach the vocabulary (at
    least 1: a micro-batch with none runs one stand-in row, `trainer.on_device`)."""

    blocks: int
    seq_len: int
    positions: int
    rows: int


def lora_flops(config, rank: int) -> int:
    """Forward FLOPs per token of one later layer's adapters (o_proj and the three MLP projections)."""
    q = config.num_attention_heads * head_dim_of(config)
    hidden, inner = config.hidden_size, config.intermediate_size
    return 2 * rank * ((q + hidden) + 3 * (hidden + inner))


def micro_batch_flops(config, micro: MicroBatch, paths: StepPaths) -> float:
    """FLOPs of one micro-batch's forward and backward. Forward: layers < N once for both models (twice with
    `naive`), the teacher's later layers, each AcrossKV group's K/V from s, the student's later layers on
    their positions (`student_layer_flops`), the lm_head on the trained rows for both. Backward: the lm_head's
    input gradient; q_proj_swiftkv's input gradient above layer N (layer N's input is h_N, which needs none,
    unless its input norm is a trained copy); each group's K/V weight and input gradients (s = norm_swiftkv(h_N)
    carries norm_swiftkv's)."""
    n, layers = config.num_key_value_layers, config.num_hidden_layers
    tokens, queries = micro.blocks * micro.seq_len, micro.blocks * micro.positions
    attention = attention_flops(config, micro.seq_len)
    full = [sum(layer_linear_flops(config, i).values()) + attention for i in range(layers)]
    shared = layer_linear_flops(config, 0)  # q, kv and o are alike in every layer
    prefix = sum(full[:n]) * tokens * (1 + paths.naive)
    teacher_later = sum(full[n:]) * tokens
    student = sum(student_layer_flops(config, i, attention, paths) for i in range(n, layers)) * queries
    q_input_grads = layers - n - 1 + (paths.trainable == "late-norms")
    # a low-rank query (MLA's q_a -> q_b) passes its gradient to q_a's output at layer N too, where q_a is trained
    layer_n_q_grad = (
        0 if q_input_grads == layers - n else attention_counts(config).query_second_factor_flops(config)
    )
    student += (q_input_grads * shared["q"] + layer_n_q_grad) * queries
    student += 3 * config.num_kv_groups * shared["kv"] * tokens
    head = 3 * 2 * config.hidden_size * config.vocab_size * micro.rows
    return prefix + teacher_later + student + head


def student_layer_flops(config, layer: int, attention: float, paths: StepPaths) -> float:
    """FLOPs per trained position of the student's later layer `layer`, forward and backward. Forward: q,
    attention over every key, o, MLP, adapters (recomputed once more under activation checkpointing). Backward
    (frozen weights take input gradients only, which cost what their forward does): the MLP's and o_proj's,
    attention twice, adapters twice, q_proj_swiftkv's weight gradient; the trained copies' weight gradients."""
    flops = layer_linear_flops(config, layer)
    lora = lora_flops(config, paths.lora_rank) if paths.trainable == "lora" else 0
    forward = flops["q"] + flops["o"] + flops["mlp"] + attention + lora
    backward = flops["o"] + flops["mlp"] + 2 * attention + 2 * lora + flops["q"]
    if paths.trainable in LATE_COPIES:
        backward += flops["o"] + flops["mlp"]
    return forward + (forward - last_matmul_flops(config, layer, paths) if paths.recompute else 0) + backward


def last_matmul_flops(config, layer: int, paths: StepPaths) -> float:
    """FLOPs of layer `layer`'s last matmul, which torch's checkpoint does not run again: it stops recomputing
    once the last tensor the backward reads is back. A dense MLP's down_proj (or with adapters the down
    adapter's second factor). In an MoE block the routing weights' (and Qwen2-MoE's shared gate's) product keeps
    the experts' output for the router's gradient, so they are recomputed; DeepSeek's shared experts, ungated,
    run last, and their down projection's output is only added."""
    if paths.trainable == "lora":
        return 2 * paths.lora_rank * config.hidden_size
    if not is_sparse_layer(config, layer):
        return gated_mlp_flops(config.hidden_size, config.intermediate_size) / 3
    if has_shared_expert_gate(config):
        return 0
    return gated_mlp_flops(config.hidden_size, shared_expert_width(config)) / 3


def distill_flops_per_token(config, micro_batches: Iterable[MicroBatch], paths: StepPaths) -> float:
    """FLOPs per train token of the steps made of `micro_batches` (`micro_batch_flops` over their tokens):
    the numerator of a step's compute bound and of its MFU."""
    micro_batches = list(micro_batches)
    tokens = sum(m.blocks * m.seq_len for m in micro_batches)
    return sum(micro_batch_flops(config, m, paths) for m in micro_batches) / tokens
