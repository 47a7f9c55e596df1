"""Model surgery: build a SwiftKV model from a plain one, initialise its new parameters, trim the
dead weight, move the trained SwiftKV tensors in and out, and recover the plain teacher. Pure
functions on models (no file formats beyond the trained-tensor files, no calibration data), used
by convert, distill, the shipped aliases and the tests.

Initialisations (norm_swiftkv <- input_layernorm of layer N in every case):
  copy  q/k/v_proj_swiftkv <- the layer's own q/k/v_proj (k/v from the group owner)
  mean  like copy, but k/v_proj_swiftkv <- mean of the group's k/v_proj (the reference init)
Qwen3 in both: q_norm_swiftkv <- the layer's q_norm, k_norm_swiftkv <- the group's mean k_norm
(ArcticTraining's qwen3 branch).
(lstsq, fitted on calibration data, lives in `swiftkv.convert.calibration`.)

Trained-tensor files (what the project commits for its distilled aliases):
`<folder>/swiftkv.safetensors` holds `model.layers.{i}.self_attn.{q,k,v}_proj_swiftkv.weight`
(+ bias), Qwen3's `{q,k}_norm_swiftkv.weight` and `model.norm_swiftkv.weight`; `<folder>/swiftkv.json`
names the base model and geometry.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from ..files import atomic_file, atomic_output_dir, write_atomic
from ..tensorfiles import FolderTensors, copy_weights
from .config import is_swiftkv
from .families import FAMILIES, family_of
from .modeling import check_teacher_contained, swiftkv_parameters

# Written beside the weights and named in config.json's auto_map, so plain transformers code (e.g. a
# stock lm-eval `hf` model) opens the folder with trust_remote_code=True even without `import swiftkv`.
AUTO_SHIM = "swiftkv_auto"


def auto_shim_source() -> str:
    """The shim: imports every family's classes (from the registry) out of the swiftkv package."""
    names = ", ".join(cls.__name__ for f in FAMILIES.values() for cls in (f.config_class, f.model_class))
    types = " / ".join(f.swiftkv_type for f in FAMILIES.values())
    return f'''"""This folder is a SwiftKV checkpoint (https://arxiv.org/abs/2410.03960): its classes live in the
swiftkv package. Load it after `import swiftkv`, or with trust_remote_code=True."""
try:
    from swiftkv import ({names})  # noqa: F401
except ImportError as error:
    raise ImportError("this is a SwiftKV checkpoint (model_type {types}): "
                      "install the swiftkv package to load it") from error
'''


AUTO_SHIM_SOURCE = auto_shim_source()


def swiftkv_config(base_config, num_key_value_layers: int, key_value_group_size: int):
    """The SwiftKV config of a plain config of a supported family (a Mistral config becomes a Llama
    SwiftKV config); raises SwiftKVConfigError on bad N/G, ValueError on a source it cannot convert."""
    base_type = base_config.model_type
    sources = [t for f in FAMILIES.values() for t in f.source_types]
    if base_type not in sources:
        raise ValueError(
            f"cannot convert model_type {base_type!r}: already SwiftKV or unsupported; "
            f"expected one of {sources}"
        )
    family = family_of(base_type)
    why = family.source_refusal(base_config)
    if why:
        raise ValueError(f"cannot convert this {base_type} model to SwiftKV: {why}")
    values = {k: v for k, v in base_config.to_dict().items() if k not in ("model_type", "architectures")}
    values.pop("transformers_version", None)
    if family.base_type != base_type:  # e.g. Mistral -> Llama: keep only what the family's config knows
        known = set(family.config_class().to_dict())
        values = {k: v for k, v in values.items() if k in known}
    return family.config_class(
        **values,
        swiftkv=True,
        num_key_value_layers=num_key_value_layers,
        key_value_group_size=key_value_group_size,
    )


def build_swiftkv_model(teacher, num_key_value_layers: int, key_value_group_size: int):
    """A SwiftKV model holding the teacher's weights; the new parameters still need an init. It is
    never trimmed here: measuring an init runs its teacher path (`trimmed_copy` trims at write time)."""
    config = swiftkv_config(teacher.config, num_key_value_layers, key_value_group_size)
    model_class = family_of(teacher.config.model_type).model_class
    model = model_class(config).to(teacher.dtype).eval()
    weights = {k: v for k, v in teacher.state_dict().items() if k in model.state_dict()}
    missing, _ = model.load_state_dict(weights, strict=False)
    not_swiftkv = [k for k in missing if "swiftkv" not in k and k != "lm_head.weight"]
    if not_swiftkv:
        raise ValueError(f"the source checkpoint lacks weights the model needs: {not_swiftkv[:5]}")
    model.tie_weights()
    return model


@torch.no_grad()
def copy_init_params(model, average_group: bool = False) -> dict[str, torch.Tensor]:
    """The reference inits of `model`'s SwiftKV parameters, from its own (teacher) weights
    (`copy_init_tensors`)."""
    return copy_init_tensors(model.config, model.state_dict(), average_group)


@torch.no_grad()
def copy_init_tensors(
    config, weights: Mapping[str, torch.Tensor], average_group: bool = False
) -> dict[str, torch.Tensor]:
    """The reference inits from the teacher weights by name (a model's state dict, or a folder's
    tensors read one at a time: only the few each init needs are read): norm_swiftkv <-
    input_layernorm(N), then the family's attention tensors (`Family.init_tensors`: `inits.grouped_init_tensors`,
    or latent attention's `mla.latent_init_tensors`); `average_group`: the group's mean, the reference's "mean"
    init."""
    n = config.num_key_value_layers
    params = {"model.norm_swiftkv.weight": weights[f"model.layers.{n}.input_layernorm.weight"].clone()}
    return params | family_of(config.model_type).init_tensors(config, weights, average_group)


def swiftkv_tensor_names(config) -> set[str]:
    """The names of the tensors a SwiftKV model of `config` stores (a trimmed config's lack the later
    layers' q/k/v), from the model built on the meta device: no memory, whatever its size."""
    with torch.device("meta"):
        model = family_of(config.model_type).model_class(config)
    return set(model.state_dict())


@torch.no_grad()
def load_trained(
    model, tensors: dict[str, torch.Tensor], params: dict[str, torch.nn.Parameter] | None = None
) -> None:
    """Copy trained tensors (by parameter name) into `model`, checking names and shapes against
    `params` (default: its SwiftKV parameters)."""
    params = swiftkv_parameters(model) if params is None else params
    unknown = sorted(set(tensors) - set(params))
    if unknown:
        raise ValueError(
            f"SwiftKV weights {unknown[:3]} do not exist in this model "
            f"(N={model.config.num_key_value_layers}, G={model.config.key_value_group_size})"
        )
    for name, tensor in tensors.items():
        if tensor.shape != params[name].shape:
            raise ValueError(
                f"SwiftKV weight {name} has shape {tuple(tensor.shape)}; expected {tuple(params[name].shape)}"
            )
        params[name].copy_(tensor.to(params[name].dtype))


def trimmed_copy(model):
    """The same model without the later layers' original q/k/v (dead weight for the student)."""
    config = model.config.__class__(**{**model.config.to_dict(), "swiftkv_trimmed": True})
    trimmed = type(model)(config).to(model.dtype).eval()
    weights = {k: v for k, v in model.state_dict().items() if k in trimmed.state_dict()}
    trimmed.load_state_dict(weights, strict=False)
    trimmed.tie_weights()
    return trimmed


def plain_teacher(model):
    """The teacher of an (untrimmed) SwiftKV model as a plain model of its base architecture: the
    same weights without the SwiftKV parameters (vLLM, for one, runs a SwiftKV folder as the student)."""
    check_teacher_contained(model.config)
    values = {k: v for k, v in model.config.to_dict().items() if "swiftkv" not in k and k not in PLAIN_DROP}
    base_type = family_of(model.config.model_type).base_type
    plain = AutoModelForCausalLM.from_config(CONFIG_MAPPING[base_type](**values)).to(model.dtype)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "swiftkv" not in k}, strict=False)
    plain.tie_weights()
    return plain.eval()


PLAIN_DROP = (
    "model_type",
    "architectures",
    "num_key_value_layers",
    "key_value_group_size",
    "auto_map",
    "transformers_version",
)

# A trained-tensor folder (`save_swiftkv_params`): its tensors, and their geometry beside them.
TRAINED_TENSORS = "swiftkv.safetensors"
TRAINED_SPEC = "swiftkv.json"


def save_swiftkv_params(
    model: torch.nn.Module,
    folder: str | os.PathLike,
    base: str,
    dtype: torch.dtype = torch.bfloat16,
    base_model: torch.nn.Module | None = None,
    student_rank: int | None = None,
) -> Path:
    """Write the trained SwiftKV tensors of `model` (a few MB) and their geometry into `folder`;
    each file is written beside its final name and then renamed. A model whose later layers were
    distilled for the student (`--trainable lora`) also stores how its weights differ from
    `base_model`'s, as rank-`student_rank` factors (`student_deltas`)."""
    tensors = {name: p.detach().to(dtype) for name, p in swiftkv_parameters(model).items()}
    if not tensors:
        raise ValueError("the model has no SwiftKV parameters (q/k/v_proj_swiftkv, norm_swiftkv) to save")
    spec = {
        "base": base,
        "num_key_value_layers": model.config.num_key_value_layers,
        "key_value_group_size": model.config.key_value_group_size,
    }
    trained_modules = getattr(model.config, "swiftkv_student_trained", None)
    if trained_modules:
        if base_model is None or student_rank is None:
            raise ValueError(
                f"the model's later layers' {', '.join(trained_modules)} were distilled for the student; "
                "pass base_model and student_rank (the run's --lora-rank) to store their difference"
            )
        deltas = student_deltas(model, base_model, student_rank)
        tensors.update({name: t.to(dtype) for name, t in deltas.items()})
        spec |= {"student_trained": list(trained_modules), "student_rank": student_rank}
    return write_trained(Path(folder), spec, tensors)


def write_trained(folder: Path, spec: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A trained-tensor folder (`read_trained`'s twin): the tensors, then their spec, each file written
    beside its final name and then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / TRAINED_TENSORS) as tmp:
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(tmp), metadata={"format": "pt"})
    write_atomic(folder / TRAINED_SPEC, json.dumps(spec, indent=2) + "\n")
    return folder


DELTA_FACTORS = (".delta_b", ".delta_a")  # weight += delta_b @ delta_a  ([out, r] @ [r, in])
RANK_TOLERANCE = 1e-3  # of a delta's norm: what a rank-r factorisation may leave out


@torch.no_grad()
def student_deltas(model: torch.nn.Module, base_model: torch.nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """Rank-`rank` factors of every weight in which `model` differs from `base_model`, exact (up to
    RANK_TOLERANCE) for low-rank adapters merged into a distilled folder. A full-rank difference
    (`--trainable late`: whole copies) is refused: it is the size of the layers, not a few MB."""
    base, own = base_model.state_dict(), swiftkv_parameters(model)
    factors = {}
    for name, weight in model.state_dict().items():
        if name in own or name not in base or torch.equal(weight.float(), base[name].float()):
            continue
        delta = weight.float() - base[name].float()
        if delta.dim() != 2:
            raise ValueError(
                f"{name} differs from the base model and is not a matrix; only low-rank differences of "
                "the later layers' projections can be stored (--trainable lora)"
            )
        (delta_b, delta_a), left = low_rank_factors(delta, rank)
        if left > RANK_TOLERANCE:
            raise ValueError(
                f"{name} differs from the base model by more than rank {rank} ({left:.1e} of the "
                "difference left out); only --trainable lora students store as a few MB: serve the "
                "distilled folder itself"
            )
        factors[name + DELTA_FACTORS[0]], factors[name + DELTA_FACTORS[1]] = delta_b, delta_a
    return factors


def low_rank_factors(delta: torch.Tensor, rank: int) -> tuple[tuple[torch.Tensor, torch.Tensor], float]:
    """((delta_b [out, rank], delta_a [rank, in]), the share of `delta`'s norm they leave out): the best
    rank-`rank` approximation delta_b @ delta_a of `delta` (its leading singular vectors)."""
    u, s, vh = torch.linalg.svd(delta.float(), full_matrices=False)
    left = float(s[rank:].norm() / s.norm()) if s.norm() > 0 else 0.0
    root = s[:rank].sqrt()  # split the singular values evenly, so both factors round alike in bf16
    return (u[:, :rank] * root, root[:, None] * vh[:rank]), left


def stored_deltas(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each weight's stored change, delta_b @ delta_a in fp32, by the weight's name."""
    return {
        name: tensors[name + DELTA_FACTORS[0]].float() @ tensors[name + DELTA_FACTORS[1]].float()
        for name in (k.removesuffix(DELTA_FACTORS[0]) for k in tensors if k.endswith(DELTA_FACTORS[0]))
    }


@torch.no_grad()
def apply_student_deltas(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], trained_modules: list[str]
) -> None:
    """Add the stored rank factors to `model`'s weights and mark its config as student-trained."""
    params = dict(model.named_parameters())
    for name, delta in stored_deltas(tensors).items():
        if name not in params:
            raise ValueError(f"stored student weight {name} does not exist in the base model")
        params[name].copy_((params[name].float() + delta).to(params[name].dtype))
    model.config.swiftkv_student_trained = list(trained_modules)


def split_student_deltas(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(SwiftKV parameters, student delta factors) of a trained-tensor file."""
    deltas = {k: v for k, v in tensors.items() if k.endswith(DELTA_FACTORS)}
    return {k: v for k, v in tensors.items() if k not in deltas}, deltas


def read_trained(folder: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(spec, tensors) of a trained-tensor folder written by `save_swiftkv_params`."""
    folder = Path(folder)
    return read_trained_spec(folder), load_file(folder / TRAINED_TENSORS)


def read_trained_spec(folder: str | os.PathLike) -> dict:
    """The spec alone of a trained-tensor folder (no tensor is read)."""
    return json.loads((Path(folder) / TRAINED_SPEC).read_text())


def write_swiftkv_folder(
    model,
    tokenizer,
    dst: str | os.PathLike,
    info: dict,
    force: bool = False,
    extra_files: dict[str, str] | None = None,
) -> None:
    """A SwiftKV model as an HF folder, atomically: weights, config (with `swiftkv_conversion` =
    `info` and an auto_map to the shim that points plain transformers at this package), tokenizer
    (unless None: a source without one gives a folder without one)."""
    model.config.swiftkv_conversion = {**info, "date": time.strftime("%Y-%m-%d")}

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)

    write_model_folder(dst, fill, force=force)


def write_converted_folder(
    source: FolderTensors,
    config,
    new: dict[str, torch.Tensor],
    tokenizer,
    dst: str | os.PathLike,
    info: dict,
    dtype: torch.dtype,
    force: bool = False,
    extra_files: dict[str, str] | None = None,
) -> None:
    """A SwiftKV folder made of `source`'s tensors, copied one at a time (in `dtype` where they are
    floats) but those a model of `config` lacks (a trimmed one's later q/k/v), and the `new` SwiftKV
    tensors beside them; the config as `write_swiftkv_folder` writes it. No model is built: the
    whole model is never in memory."""
    names = swiftkv_tensor_names(config)
    # An MoE family's experts are copied as the source stores them, and their fused names not looked for in it.
    in_layout = family_of(config.model_type).spelled_alike
    missing = sorted(
        name for name in names - set(source) - set(new) if in_layout(name) and "swiftkv" not in name
    )
    missing = [name for name in missing if not (name == "lm_head.weight" and config.tie_word_embeddings)]
    if missing:
        raise ValueError(f"the source checkpoint lacks weights the model needs: {missing[:5]}")
    config.swiftkv_conversion = {**info, "date": time.strftime("%Y-%m-%d")}
    config.architectures = [family_of(config.model_type).model_class.__name__]
    config.dtype = dtype

    def fill(tmp: Path) -> None:
        copy_weights(
            source, tmp, kept=lambda name: name in names or not in_layout(name), added=new, dtype=dtype
        )
        config.save_pretrained(tmp)
        generation_config(source.folder, config).save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)

    write_model_folder(dst, fill, force=force)


def generation_config(folder: Path, config) -> GenerationConfig:
    """The source's generation settings, or those transformers derives from its config when it has
    none (what saving a loaded model writes)."""
    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(folder)
    return GenerationConfig.from_model_config(config)


def write_model_folder(dst: str | os.PathLike, fill: Callable[[Path], None], force: bool = False) -> Path:
    """The one writer of model folders (convert, distill, export, the cached GGUF, alias and plain-teacher
    folders): `fill(tmp)` writes the files into a temp folder that then becomes `dst` atomically. A
    SwiftKV folder gets the auto_map and the shim it names, so it loads with trust_remote_code=True in
    a process that never imported swiftkv."""
    with atomic_output_dir(dst, force=force) as tmp:
        fill(tmp)
        add_auto_shim(tmp)
    return Path(dst)


def add_auto_shim(folder: Path) -> None:
    """Point a SwiftKV config.json at the shim (`AUTO_SHIM`) and write the shim beside it. A plain
    model's folder, and one whose auto_map names other code, are left as they are."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if not is_swiftkv(config):
        return
    family = family_of(config["model_type"])
    auto_map = {
        "AutoConfig": f"{AUTO_SHIM}.{family.config_class.__name__}",
        "AutoModelForCausalLM": f"{AUTO_SHIM}.{family.model_class.__name__}",
    }
    if config.get("auto_map") not in (None, auto_map):
        return
    if config.get("auto_map") != auto_map:
        path.write_text(json.dumps({**config, "auto_map": auto_map}, indent=2, sort_keys=True) + "\n")
    (folder / f"{AUTO_SHIM}.py").write_text(AUTO_SHIM_SOURCE)


def teacher_difference(student, teacher, swiftkv_too: bool = False) -> str | None:
    """Why `teacher` is not the model `student` was converted from (None when it is): every tensor of the
    teacher must be in the student with the same shape and value. The SwiftKV tensors of a SwiftKV
    teacher are not teacher weights and are skipped unless `swiftkv_too`. The one same-teacher check:
    distill refuses a --teacher that fails it; eval shares layers < N only with one that passes it
    whole (`swiftkv_too`)."""
    mine = student.state_dict()
    for name, tensor in teacher.state_dict().items():
        if "swiftkv" in name and not swiftkv_too:
            continue
        if name not in mine:
            return f"{name} is missing from the student"
        if mine[name].shape != tensor.shape:
            return f"{name} has shape {tuple(tensor.shape)}, the student's has {tuple(mine[name].shape)}"
        if not torch.equal(mine[name], tensor):
            return f"{name} differs from the student's copy"
    return None


def tokenizer_differences(student_tokenizer, teacher_tokenizer) -> list[str]:
    """How two tokenizers differ where paired scoring and distillation need them equal (empty: they do not)."""
    differences = []
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        differences.append(
            f"vocabularies differ ({len(student_tokenizer)} vs {len(teacher_tokenizer)} tokens)"
        )
    for attr in ("bos_token_id", "eos_token_id"):
        if getattr(student_tokenizer, attr) != getattr(teacher_tokenizer, attr):
            differences.append(
                f"{attr} {getattr(student_tokenizer, attr)} vs {getattr(teacher_tokenizer, attr)}"
            )
    return differences
