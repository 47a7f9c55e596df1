"""Turn a Llama/Qwen2 checkpoint into a SwiftKV checkpoint (Snowflake format).

Initialisations of the new parameters (norm_swiftkv <- input_layernorm of layer N in all cases):
  copy   q/k/v_proj_swiftkv <- the layer's own q/k/v_proj (k/v from the group owner)
  mean   like copy, but k/v_proj_swiftkv <- mean of the group's k/v_proj (the reference init)
  lstsq  ours: k/v_proj_swiftkv <- ridge least-squares map from s = norm_swiftkv(h_N) to the teacher's
         pre-RoPE K/V of the group's layers, fitted on calibration tokens. The student then starts
         with K/V close to the teacher's, which distillation would otherwise have to learn.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import calibration
from .configuration import LlamaSwiftKVConfig, Qwen2SwiftKVConfig
from .modeling import LlamaSwiftKVForCausalLM, Qwen2SwiftKVForCausalLM, swiftkv_parameters
from .sources import atomic_output_dir, load_model, load_tokenizer

INITS = ("copy", "mean", "lstsq")
# Written beside the weights and named in config.json's auto_map, so plain transformers code (e.g. a
# stock lm-eval `hf` model) opens the folder with trust_remote_code=True even without `import swiftkv`.
AUTO_SHIM = "swiftkv_auto"
AUTO_SHIM_SOURCE = '''"""This folder is a SwiftKV checkpoint (https://arxiv.org/abs/2410.03960): its classes live in the
swiftkv package. Load it after `import swiftkv`, or with trust_remote_code=True."""
try:
    from swiftkv import (LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM,  # noqa: F401
                         Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM)
except ImportError as error:
    raise ImportError("this is a SwiftKV checkpoint (model_type llama_swiftkv / qwen2_swiftkv): "
                      "install the swiftkv package to load it") from error
'''
SWIFTKV_CLASSES = {
    "llama": (LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
    "qwen2": (Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM),
}


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


# --------------------------------------------------------------------------------------------------
# Building the SwiftKV model
# --------------------------------------------------------------------------------------------------


def resolve_num_key_value_layers(num_layers: int, num_key_value_layers: int | None,
                                 swiftkv_fraction: float | None) -> int:
    """N from either N itself or the fraction F of layers that become SwiftKV (later) layers."""
    if (num_key_value_layers is None) == (swiftkv_fraction is None):
        raise ValueError("give exactly one of --num-key-value-layers N or --swiftkv-fraction F")
    if swiftkv_fraction is not None:
        if not 0.0 < swiftkv_fraction < 1.0:
            raise ValueError(f"--swiftkv-fraction {swiftkv_fraction} is out of range; expected 0 < F < 1")
        return num_layers - round(swiftkv_fraction * num_layers)
    return num_key_value_layers


def swiftkv_config(base_config, num_key_value_layers: int, key_value_group_size: int):
    """The SwiftKV config of a plain Llama/Qwen2 config; raises SwiftKVConfigError on bad N/G."""
    base_type = base_config.model_type
    if base_type not in SWIFTKV_CLASSES:
        raise ValueError(f"cannot convert model_type {base_type!r}: already SwiftKV or unsupported; "
                         f"expected one of {list(SWIFTKV_CLASSES)}")
    config_class, _ = SWIFTKV_CLASSES[base_type]
    values = {k: v for k, v in base_config.to_dict().items() if k not in ("model_type", "architectures")}
    values.pop("transformers_version", None)
    return config_class(**values, swiftkv=True, num_key_value_layers=num_key_value_layers,
                        key_value_group_size=key_value_group_size)


def build_swiftkv_model(teacher, num_key_value_layers: int, key_value_group_size: int):
    """A SwiftKV model holding the teacher's weights; the new parameters still need an init. It is
    never trimmed here: measuring an init runs its teacher path (`trimmed_copy` trims at write time)."""
    config = swiftkv_config(teacher.config, num_key_value_layers, key_value_group_size)
    _, model_class = SWIFTKV_CLASSES[teacher.config.model_type]
    model = model_class(config).to(teacher.dtype).eval()
    weights = {k: v for k, v in teacher.state_dict().items() if k in model.state_dict()}
    missing, _ = model.load_state_dict(weights, strict=False)
    not_swiftkv = [k for k in missing if "swiftkv" not in k and k != "lm_head.weight"]
    if not_swiftkv:
        raise ValueError(f"the source checkpoint lacks weights the model needs: {not_swiftkv[:5]}")
    model.tie_weights()
    return model


# --------------------------------------------------------------------------------------------------
# Initialisation
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def init_copy(model, teacher, average_group: bool = False) -> None:
    """norm_swiftkv <- input_layernorm(N); q <- own q_proj; k/v <- owner's (or group mean) k/v_proj."""
    config = model.config
    n, g = config.num_key_value_layers, config.key_value_group_size
    model.model.norm_swiftkv.weight.copy_(teacher.model.layers[n].input_layernorm.weight)
    for i in config.later_layers:
        source, target = teacher.model.layers[i].self_attn, model.model.layers[i].self_attn
        copy_linear(target.q_proj_swiftkv, [source.q_proj])
        if config.is_kv_owner(i):
            members = range(i, i + g) if average_group else range(i, i + 1)
            for name in ("k_proj", "v_proj"):
                sources = [getattr(teacher.model.layers[j].self_attn, name) for j in members]
                copy_linear(getattr(target, f"{name}_swiftkv"), sources)


def copy_linear(target: torch.nn.Linear, sources: list[torch.nn.Linear]) -> None:
    target.weight.copy_(torch.stack([s.weight for s in sources]).mean(0))
    if target.bias is not None:
        target.bias.copy_(torch.stack([s.bias for s in sources]).mean(0))


@torch.no_grad()
def init_lstsq(model, stats: calibration.TeacherStats, ridge: float) -> None:
    """Each group owner's k/v_proj_swiftkv <- ridge fit from s to the group's teacher K/V."""
    config = model.config
    s = model.model.norm_swiftkv(stats.h_n.to(model.dtype)).float()
    for owner in range(config.num_key_value_layers, config.num_hidden_layers, config.key_value_group_size):
        members = range(owner, owner + config.key_value_group_size)
        attention = model.model.layers[owner].self_attn
        for name, targets in (("k", stats.keys), ("v", stats.values)):
            linear = getattr(attention, f"{name}_proj_swiftkv")
            weight, bias = ridge_fit(s, torch.stack([targets[j] for j in members]).mean(0), ridge,
                                     with_bias=linear.bias is not None)
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)


def ridge_fit(x: torch.Tensor, y: torch.Tensor, ridge: float, with_bias: bool):
    """argmin_W ||x W^T + b - y||^2 + lambda ||W||^2 in float64, lambda relative to x's scale."""
    x, y = x.double(), y.double()
    if with_bias:
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    gram = x.T @ x
    lam = ridge * gram.diagonal().mean()
    solution = torch.linalg.solve(gram + lam * torch.eye(len(gram), dtype=x.dtype), x.T @ y).T.float()
    return (solution[:, :-1], solution[:, -1]) if with_bias else (solution, None)


# --------------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------------


def convert(src: str, dst: str | os.PathLike, num_key_value_layers: int | None = None,
            swiftkv_fraction: float | None = None, key_value_group_size: int = 1, init: str = "lstsq",
            trim: bool = False, dtype: str | None = None, force: bool = False, calib_data: str = "sharegpt",
            calib_tokens: int = 8192, eval_tokens: int = 2048, ridge: float = 1e-3,
            overrides: dict | None = None, provenance: dict | None = None) -> ConversionReport:
    """Convert `src` (HF folder, .gguf, alias) into a SwiftKV folder at `dst`, written atomically."""
    if init not in INITS:
        raise ValueError(f"--init {init!r} is unknown; expected one of {list(INITS)}")
    if Path(dst).exists() and not force:
        raise FileExistsError(f"output folder {dst} already exists; pass --force to overwrite it")
    started = time.time()
    teacher = load_model(src, dtype=torch.float32)  # resolves and checks the source first
    n = resolve_num_key_value_layers(teacher.config.num_hidden_layers, num_key_value_layers, swiftkv_fraction)
    model = build_swiftkv_model(teacher, n, key_value_group_size)
    report = ConversionReport(str(src), init, n, key_value_group_size)
    init_copy(model, teacher, average_group=(init == "mean"))
    if init == "lstsq" or overrides is None:
        measure_and_fit(model, teacher, src, report, init, calib_data, calib_tokens, eval_tokens, ridge)
    if overrides is not None:
        load_overrides(model, overrides)
    report.seconds = time.time() - started
    write_checkpoint(model, src, dst, report, trim, dtype, force, provenance)
    return report


def measure_and_fit(model, teacher, src, report, init, calib_data, calib_tokens, eval_tokens, ridge) -> None:
    """Fit lstsq (if asked) and report K/V error and top-1 agreement of copy vs lstsq on held-out text."""
    tokenizer = load_tokenizer(src)
    n = model.config.num_key_value_layers
    fit_blocks, eval_blocks = calibration.token_blocks(tokenizer, calib_data, calib_tokens, eval_tokens)
    fit_stats = calibration.teacher_stats(teacher, fit_blocks, n, desc="calibration (fit)")
    eval_stats = calibration.teacher_stats(teacher, eval_blocks, n, desc="calibration (held-out)")
    candidates = ["copy", "lstsq"] if init in ("copy", "lstsq") else [init, "lstsq"]
    fitted = {}
    for name in candidates:
        if name == "lstsq":
            init_lstsq(model, fit_stats, ridge)
        else:
            init_copy(model, teacher, average_group=(name == "mean"))
        report.kv_relative_error[name] = calibration.kv_relative_error(model, eval_stats)
        report.top1_agreement[name], report.mean_kl[name] = calibration.agreement(model, eval_blocks)
        fitted[name] = {k: p.detach().clone() for k, p in swiftkv_parameters(model).items()}
    load_overrides(model, fitted[init])


@torch.no_grad()
def load_overrides(model, tensors: dict[str, torch.Tensor]) -> None:
    params = swiftkv_parameters(model)
    unknown = sorted(set(tensors) - set(params))
    if unknown:
        raise ValueError(f"SwiftKV weights {unknown[:3]} do not exist in this model "
                         f"(N={model.config.num_key_value_layers}, G={model.config.key_value_group_size})")
    for name, tensor in tensors.items():
        if tensor.shape != params[name].shape:
            raise ValueError(f"SwiftKV weight {name} has shape {tuple(tensor.shape)}; "
                             f"expected {tuple(params[name].shape)}")
        params[name].copy_(tensor)


def write_checkpoint(model, src, dst, report: ConversionReport, trim: bool, dtype: str | None,
                     force: bool, provenance: dict | None) -> None:
    """Save the model (optionally trimmed and cast), tokenizer and chat template into `dst` atomically."""
    if trim:
        model = trimmed_copy(model)
    if dtype is not None:
        model = model.to(parse_dtype(dtype))
    model.config.swiftkv_conversion = {
        "source": str(src), "init": report.init, "trimmed": trim,
        "top1_agreement": report.top1_agreement, "date": time.strftime("%Y-%m-%d"), **(provenance or {}),
    }
    model.config.auto_map = {"AutoConfig": f"{AUTO_SHIM}.{type(model.config).__name__}",
                             "AutoModelForCausalLM": f"{AUTO_SHIM}.{type(model).__name__}"}
    with atomic_output_dir(dst, force=force) as tmp:
        model.save_pretrained(tmp)
        (tmp / f"{AUTO_SHIM}.py").write_text(AUTO_SHIM_SOURCE)
        load_tokenizer(src).save_pretrained(tmp)
        (tmp / "swiftkv_conversion.json").write_text(json.dumps(asdict(report), indent=2))


def trimmed_copy(model):
    """The same model without the later layers' original q/k/v (dead weight for the student)."""
    config = model.config.__class__(**{**model.config.to_dict(), "swiftkv_trimmed": True})
    trimmed = type(model)(config).to(model.dtype).eval()
    weights = {k: v for k, v in model.state_dict().items() if k in trimmed.state_dict()}
    trimmed.load_state_dict(weights, strict=False)
    trimmed.tie_weights()
    return trimmed


def parse_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
              "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"--dtype {name!r} is unknown; expected one of {sorted(dtypes)}")
    return dtypes[name]
