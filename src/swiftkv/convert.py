"""`swiftkv convert`: a Llama/Qwen2 checkpoint -> a SwiftKV checkpoint (Snowflake's format).

The orchestration only: model surgery (`swiftkv.model.surgery`) builds the SwiftKV model and the
reference inits, calibration (`swiftkv.calibration`) fits lstsq and measures each init against the
teacher on held-out tokens, and the result is written atomically as an HF folder.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from . import calibration
from .dtypes import parse_dtype
from .files import check_new_output
from .model.config import num_key_value_layers_for
from .model.surgery import (
    build_swiftkv_model,
    copy_init_params,
    load_trained,
    trimmed_copy,
    write_swiftkv_folder,
)
from .sources import load_model, load_tokenizer

INITS = ("copy", "mean", "lstsq")


@dataclass
class ConversionReport:
    """What a conversion did and how close the new K/V are to the teacher's."""

    source: str
    init: str
    num_key_value_layers: int
    key_value_group_size: int
    kv_relative_error: dict = field(default_factory=dict)  # init -> {"k": [per later layer], "v": [...]}
    top1_agreement: dict = field(default_factory=dict)  # init -> teacher-forced top-1 agreement
    mean_kl: dict = field(default_factory=dict)  # init -> mean KL(teacher || student) per token
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"SwiftKV conversion of {self.source}: N={self.num_key_value_layers}, "
                 f"G={self.key_value_group_size}, init={self.init} ({self.seconds:.1f} s)"]
        for init, errors in self.kv_relative_error.items():
            k, v = (sum(errors[x]) / len(errors[x]) for x in ("k", "v"))
            lines.append(f"  {init:>5}: K/V relative error (mean over later layers) k={k:.3f} v={v:.3f}; "
                         f"top-1 agreement {self.top1_agreement[init]:.3f}; KL {self.mean_kl[init]:.3f}")
        return "\n".join(lines)


def resolve_num_key_value_layers(num_layers: int, num_key_value_layers: int | None,
                                 swiftkv_fraction: float | None) -> int:
    """N from either N itself or the fraction F of layers that become SwiftKV (later) layers."""
    if (num_key_value_layers is None) == (swiftkv_fraction is None):
        raise ValueError("give exactly one of --num-key-value-layers N or --swiftkv-fraction F")
    if swiftkv_fraction is not None:
        return num_key_value_layers_for(num_layers, swiftkv_fraction)
    return num_key_value_layers


def convert(src: str, dst: str | os.PathLike, num_key_value_layers: int | None = None,
            swiftkv_fraction: float | None = None, key_value_group_size: int = 1, init: str = "lstsq",
            trim: bool = False, dtype: str | None = None, force: bool = False, calib_data: str = "sharegpt",
            calib_tokens: int = 8192, eval_tokens: int = 2048, ridge: float = 1e-3) -> ConversionReport:
    """Convert `src` (HF folder, .gguf, alias) into a SwiftKV folder at `dst`, written atomically."""
    if init not in INITS:
        raise ValueError(f"--init {init!r} is unknown; expected one of {list(INITS)}")
    check_new_output(dst, force)
    out_dtype = parse_dtype(dtype) if dtype is not None else None
    started = time.time()
    teacher = load_model(src, dtype=torch.float32)  # resolves and checks the source first
    n = resolve_num_key_value_layers(teacher.config.num_hidden_layers, num_key_value_layers, swiftkv_fraction)
    model = build_swiftkv_model(teacher, n, key_value_group_size)
    tokenizer = load_tokenizer(src)
    report = ConversionReport(str(src), init, n, key_value_group_size)
    candidates = fit_and_measure(model, tokenizer, report, init, calib_data, calib_tokens, eval_tokens, ridge)
    load_trained(model, candidates[init])
    report.seconds = time.time() - started
    if trim:
        model = trimmed_copy(model)
    if out_dtype is not None:
        model = model.to(out_dtype)
    info = {"source": str(src), "init": init, "trimmed": trim, "top1_agreement": report.top1_agreement}
    write_swiftkv_folder(model, tokenizer, dst, info, force=force,
                         extra_files={"swiftkv_conversion.json": json.dumps(asdict(report), indent=2)})
    return report


def fit_and_measure(model, tokenizer, report: ConversionReport, init: str, calib_data: str, calib_tokens: int,
                    eval_tokens: int, ridge: float) -> dict[str, dict[str, torch.Tensor]]:
    """The SwiftKV parameters of each init worth comparing (the chosen one and lstsq, or copy and
    lstsq), each measured on held-out calibration tokens into `report`."""
    fit_blocks, eval_blocks = calibration.token_blocks(tokenizer, calib_data, calib_tokens, eval_tokens)
    reference = "copy" if init in ("copy", "lstsq") else init
    candidates = {reference: copy_init_params(model, average_group=reference == "mean")}
    load_trained(model, candidates[reference])  # norm_swiftkv of the reference init: lstsq fits through it
    fit_stats = calibration.teacher_stats(model, fit_blocks, desc="calibration (fit)")
    candidates["lstsq"] = calibration.lstsq_params(model, fit_stats, ridge)
    eval_stats = calibration.teacher_stats(model, eval_blocks, desc="calibration (held-out)")
    for name, params in candidates.items():
        load_trained(model, params)
        report.kv_relative_error[name] = calibration.kv_relative_error(model, eval_stats)
        report.top1_agreement[name], report.mean_kl[name] = calibration.agreement(model, eval_blocks)
    return candidates
