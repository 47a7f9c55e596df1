"""A run's summary (`results.DistillSummary`, the output folder's distill.json): its settings, tokens, time, held-out
measures and memory, and its speed against the step's compute bound."""

from __future__ import annotations

from ...dtypes import dtype_name, resolve_dtype
from ...files import portable_path
from ..core.checkpoint import RunState
from ..parallel.world import World
from ..settings import DistillSettings
from .bound import bound_line, devices_bound


def recorded_settings(settings: DistillSettings) -> dict:
    """The settings as a record holds them: a path (--out, --init-from, a data file, a model folder) in the
    form that names the same place on another machine (`portable_path`), never one machine's folders."""

    def recorded(value):
        if isinstance(value, str):
            return portable_path(value)
        return [recorded(v) for v in value] if isinstance(value, list) else value

    return {name: recorded(value) for name, value in settings.as_json().items()}


def run_summary(settings: DistillSettings, state: RunState, world: World) -> dict:
    evals = [h for h in state.history if "kl" in h]
    losses = [h["loss"] for h in state.history if "loss" in h]
    tokens = state.step * settings.optim.batch_size * settings.data.seq_len
    tokens_per_second = round(tokens / state.elapsed, 1) if state.elapsed else None
    dtype = resolve_dtype(settings.parallel.dtype, world.device)
    return {
        "settings": recorded_settings(settings),
        # What `--dtype auto` chose on this machine: the settings keep only "auto".
        "compute_dtype": dtype_name(dtype),
        "steps": state.step,
        "micro_batch": state.micro_batch,
        "train_tokens": tokens,
        # --continue-from: the data's tokens trained before this run, by the runs it continues
        "continued_tokens": state.continued_steps * settings.optim.batch_size * settings.data.seq_len,
        "train_seconds": round(state.elapsed, 1),
        "tokens_per_second": tokens_per_second,
        # against the peak of every rank's device (a GPU each; CPU ranks a share of the cores, setup.py),
        # measured after the steps on the same devices: each rank steps its share of the blocks
        "compute_bound": devices_bound(
            state.flops_per_token, tokens_per_second, dtype, world.device, devices=world.size
        )
        if state.flops_per_token
        else None,
        "heldout_before": evals[0] if evals else None,
        "heldout_after": evals[-1] if evals else None,
        "final_loss": losses[-1] if losses else None,
        "step_memory_mib": state.step_memory_mib,
        "step_tensor_mib": state.step_tensor_mib,
        "history": state.history,
    }


def speed_line(summary: dict) -> str:
    """The run's tokens/s against its compute bound, as the run's log ends: the fraction of the measured
    peak and the MFU against the nominal one."""
    bound = summary["compute_bound"]
    return (
        f"{summary['tokens_per_second']:,.1f} tok/s {summary['compute_dtype']} = {bound_line(bound)}; "
        f"a matmul-bound step would reach {bound['bound_tokens_per_s']:,.0f} tok/s"
    )
