"""`swiftkv convert`: a checkpoint of a supported family (`swiftkv.model.families`: Llama, Mistral, Qwen2,
Qwen3, the MoE families, DeepSeek-V2/V3) -> a SwiftKV checkpoint (Snowflake's format).

The orchestration only: model surgery (`swiftkv.model.surgery`) derives the reference inits and writes
the folder, calibration (`convert/calibration.py`) fits lstsq and measures each init against the teacher on
held-out tokens, and the result is written atomically as an HF folder: the source's tensors copied one
at a time (`swiftkv.tensorfiles`) plus the new ones. Peak host memory is about the model once in its
stored dtype plus the calibration's activations (lstsq), or a few tensors (copy/mean without it).
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import AutoConfig

from ..data.mixture import check_data
from ..dtypes import DTYPE_CHOICES, autocast, compute_device, parse_dtype, resolve_dtype
from ..files import check_new_output
from ..model.config import num_key_value_layers_for
from ..model.families import family_of
from ..model.surgery import (
    copy_init_params,
    copy_init_tensors,
    load_trained,
    swiftkv_config,
    write_converted_folder,
)
from ..settings import setting
from ..sources import (
    Source,
    check_supported,
    check_weights_present,
    has_tokenizer,
    load_folder_as_swiftkv,
    open_source,
)
from ..tensorfiles import FolderTensors
from . import calibration

INITS = ("copy", "mean", "lstsq")


@dataclass
class ConvertSettings:
    """What to convert and how: the source, the SwiftKV geometry, the init and its calibration, the output."""

    source: str | Source = setting(
        None, "the model converted (HF folder, .gguf file, alias or Hub repo id)", cli=False
    )
    revision: str | None = setting(None, "SRC's revision (branch, tag or commit) when it is a Hub repo id")
    out: str | os.PathLike | None = setting(
        None, "the SwiftKV folder written (must not exist unless --force)", cli=False
    )
    num_key_value_layers: int | None = setting(
        None, "N: layers >= N become SwiftKV layers (prompt tokens skip them)", flag="--num-key-value-layers"
    )
    swiftkv_fraction: float | None = setting(
        None, "or F: the fraction of layers that become SwiftKV layers, e.g. 0.5 (N = L - round(F * L))"
    )
    key_value_group_size: int = setting(1, "G: AcrossKV, later layers share one KV cache in groups of G")
    init: str = setting(
        "lstsq",
        "init of the new projections: copy/mean as the reference, lstsq = ridge fit to the "
        "teacher's K/V (latent attention: its latent) on calibration tokens",
        choices=INITS,
    )
    calib_data: str = setting(
        "sharegpt",
        "calibration data (the --data grammar: 'sharegpt', a .jsonl/.json file, a text file or folder)",
    )
    calib_tokens: int = setting(8192, "tokens to fit lstsq on")
    eval_tokens: int = setting(2048, "held-out calibration tokens the inits are measured on")
    ridge: float = setting(1e-3, "ridge strength of the lstsq fit, relative to the input scale")
    # (--no-measure: the help text describes the switch, which turns the setting off)
    measure: bool = setting(
        True,
        "skip the calibration (the lstsq fit and the measurement of the inits): copy/mean "
        "then need no tokenizer or calibration data",
    )
    trim: bool = setting(
        False,
        "drop the later layers' original q/k/v (smaller). STUDENT-ONLY: no teacher path. "
        "swiftkv refuses to run one, but ArcticTraining's llama_swiftkv (transformers 4.x) fills the "
        "missing weights randomly and only warns, so its teacher (and distillation or eval against "
        "it) is silently wrong. See the README.md written into the folder; convert without --trim "
        "for a teacher",
    )
    dtype: str | None = setting(
        None,
        "weights dtype of the output (float32, bfloat16, ...; default: the source's, e.g. bf16 stays bf16 "
        "and a GGUF, dequantized to fp32, stays fp32)",
    )
    compute_dtype: str = setting(
        "auto",
        "matmul dtype of the calibration passes (auto: bf16 autocast where bf16 is native, else fp32; "
        "the weights stay in the source's dtype, so a bf16 source computes in bf16; the fit is float64)",
        choices=DTYPE_CHOICES,
    )
    force: bool = setting(False, "overwrite DST")


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
    unmeasured: str = ""  # why the calibration was skipped (copy/mean only), "" when it ran
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [
            f"SwiftKV conversion of {self.source}: N={self.num_key_value_layers}, "
            f"G={self.key_value_group_size}, init={self.init} ({self.seconds:.1f} s)"
        ]
        for init, errors in self.kv_relative_error.items():
            k, v = (sum(errors[x]) / len(errors[x]) for x in ("k", "v"))
            lines.append(
                f"  {init:>5}: K/V relative error (mean over later layers) k={k:.3f} v={v:.3f}; "
                f"top-1 agreement {self.top1_agreement[init]:.3f}; KL {self.mean_kl[init]:.3f}"
            )
        return "\n".join(lines)


def resolve_num_key_value_layers(
    num_layers: int, num_key_value_layers: int | None, swiftkv_fraction: float | None
) -> int:
    """N from either N itself or the fraction F of layers that become SwiftKV (later) layers."""
    if swiftkv_fraction is not None:
        return num_key_value_layers_for(num_layers, swiftkv_fraction)
    return num_key_value_layers


def convert(settings: ConvertSettings) -> ConversionReport:
    """Convert `settings.source` (HF folder, .gguf, alias) into a SwiftKV folder at `settings.out`, written
    atomically. Bad input fails before the weights are loaded.

    The folder is the source's tensors, copied one at a time in their stored dtype (or --dtype), plus
    the new SwiftKV tensors. copy/mean read only the few tensors they derive from; the calibration
    (lstsq, the measurement) loads the model once, in its stored dtype, and frees it before the copy."""
    out_dtype = check_settings(settings)
    check_new_output(settings.out, settings.force)
    started = time.time()
    source = open_source(settings.source, settings.revision)
    folder = source.folder
    n = checked_geometry(folder, settings)
    unmeasured = why_unmeasured(folder, settings)
    stored = FolderTensors(folder)
    config = swiftkv_config(AutoConfig.from_pretrained(folder), n, settings.key_value_group_size)
    out_dtype = out_dtype or stored.main_dtype()
    tokenizer = source.load_tokenizer() if has_tokenizer(folder) else None
    report = ConversionReport(
        source.name, settings.init, n, settings.key_value_group_size, unmeasured=unmeasured
    )
    if unmeasured:
        print(f"note: {unmeasured}; writing the {settings.init} init without calibration", flush=True)
        new = copy_init_tensors(config, stored, average_group=settings.init == "mean")
    else:
        model = load_folder_as_swiftkv(folder, config, stored.main_dtype())
        new = fit_and_measure(model, tokenizer, report, settings)[settings.init]
        del model  # the copy below reads the source again, tensor by tensor
        gc.collect()
    report.seconds = time.time() - started
    extra_files = {"swiftkv_conversion.json": json.dumps(asdict(report), indent=2)}
    if settings.trim:
        config.swiftkv_trimmed = True
        extra_files["README.md"] = TRIMMED_README.format(
            source=source.name, n=n, g=settings.key_value_group_size, init=settings.init
        )
    info = {
        "source": source.name,
        "init": settings.init,
        "trimmed": settings.trim,
        "top1_agreement": report.top1_agreement,
    }
    new = {name: tensor.to(out_dtype) for name, tensor in new.items()}
    write_converted_folder(
        stored, config, new, tokenizer, settings.out, info, out_dtype, settings.force, extra_files
    )
    return report


def check_settings(settings: ConvertSettings) -> torch.dtype | None:
    """The settings that need no model, checked first; returns the output dtype (None: the source's)."""
    if settings.source is None or settings.out is None:
        raise ValueError("convert needs a source and an output folder (ConvertSettings.source and .out)")
    if settings.init not in INITS:
        raise ValueError(f"--init {settings.init!r} is unknown; expected one of {list(INITS)}")
    if (settings.num_key_value_layers is None) == (settings.swiftkv_fraction is None):
        raise ValueError("give exactly one of --num-key-value-layers N or --swiftkv-fraction F")
    resolve_dtype(settings.compute_dtype, option="--compute-dtype")
    return parse_dtype(settings.dtype) if settings.dtype is not None else None


def checked_geometry(folder, settings: ConvertSettings) -> int:
    """N, checked with G against the source's config; the source is a supported model with weights
    (not loaded yet: that may take minutes)."""
    check_supported(folder)
    check_weights_present(folder)
    config = AutoConfig.from_pretrained(folder)
    n = resolve_num_key_value_layers(
        config.num_hidden_layers, settings.num_key_value_layers, settings.swiftkv_fraction
    )
    swiftkv_config(config, n, settings.key_value_group_size)  # raises on a bad N or G
    return n


def why_unmeasured(folder, settings: ConvertSettings) -> str:
    """Why the calibration (lstsq fit, measurement of the inits) cannot run, "" when it can. copy
    and mean come from the weights alone and go without it; lstsq cannot, so it fails here."""
    reason = ""
    if not settings.measure:
        reason = "--no-measure was given"
    elif not has_tokenizer(folder):
        reason = f"the source {folder} has no tokenizer"
    elif settings.init == "lstsq":
        check_data(settings.calib_data, "--calib-data")  # its own error names the option and what it expects
    else:
        try:
            check_data(settings.calib_data, "--calib-data")
        except FileNotFoundError as error:
            reason = str(error)
    if reason and settings.init == "lstsq":
        raise ValueError(
            f"--init lstsq is fitted on calibration tokens, but {reason}; use --init copy or mean "
            "to convert without calibration"
        )
    return reason


# Written into a --trim folder, where users of other tools will see it.
TRIMMED_README = """# Student-only SwiftKV checkpoint (converted with `--trim`)

This folder was written by `swiftkv convert {source} ... --num-key-value-layers {n} --key-value-group-size {g}
--trim`. The original q/k/v projections of layers >= {n} were removed; config.json marks this with
`"swiftkv_trimmed": true`.

- **Student path (SwiftKV on): complete.** swiftkv (transformers or vLLM) runs and serves it.
- **Teacher path (SwiftKV off): impossible.** swiftkv refuses to run it (distill, eval's teacher,
  `set_swiftkv(False)`). Other readers do NOT refuse: ArcticTraining's `llama_swiftkv` model code
  (transformers 4.x) fills the missing q/k/v with random weights and only logs a warning, so its
  teacher path, and any distillation or evaluation that uses it, is silently wrong.
- **Need the teacher?** Convert again without `--trim`:
  `swiftkv convert {source} DST --num-key-value-layers {n} --key-value-group-size {g} --init {init}`,
  or use the source model `{source}` itself as the teacher.
"""


def fit_and_measure(
    model, tokenizer, report: ConversionReport, settings: ConvertSettings
) -> dict[str, dict[str, torch.Tensor]]:
    """The SwiftKV parameters of each init worth comparing (the chosen one and lstsq, or copy and
    lstsq), each measured on held-out calibration tokens into `report`. The forward passes run in
    the compute dtype; each in its own autocast region, because autocast caches the cast weights
    for a region and the candidates are swapped in between."""
    device = compute_device()  # a GPU where there is one; the folder is copied from the source's files
    compute = resolve_dtype(settings.compute_dtype, device)
    fit_blocks, eval_blocks = calibration.token_blocks(
        tokenizer, settings.calib_data, settings.calib_tokens, settings.eval_tokens
    )
    model.to(device)
    candidates = measured_candidates(model, fit_blocks, eval_blocks, compute, report, settings)
    return {
        name: {key: tensor.cpu() for key, tensor in params.items()} for name, params in candidates.items()
    }


def measured_candidates(
    model, fit_blocks, eval_blocks, compute, report: ConversionReport, settings: ConvertSettings
) -> dict[str, dict[str, torch.Tensor]]:
    # lstsq is compared with the init it replaces tensors of (calibration's docstring).
    lstsq_reference = family_of(model.config.model_type).lstsq_reference
    reference = settings.init if settings.init != "lstsq" else lstsq_reference
    candidates = {reference: copy_init_params(model, average_group=reference == "mean")}
    load_trained(model, candidates[reference])  # norm_swiftkv of the reference init: lstsq fits through it
    with autocast(compute, model.device):
        fit_stats = calibration.teacher_stats(model, fit_blocks, desc="calibration (fit)")
        eval_stats = calibration.teacher_stats(model, eval_blocks, desc="calibration (held-out)")
    candidates["lstsq"] = calibration.lstsq_params(model, fit_stats, settings.ridge)
    for name, params in candidates.items():
        load_trained(model, params)
        with autocast(compute, model.device):
            report.kv_relative_error[name] = calibration.kv_relative_error(model, eval_stats)
            report.top1_agreement[name], report.mean_kl[name] = calibration.agreement(model, eval_blocks)
    return candidates
