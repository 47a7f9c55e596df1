"""A student and its teacher, loaded so that both can be scored in one pass when possible.

When the student is an (untrimmed) SwiftKV model whose non-SwiftKV weights equal the teacher's, the
teacher *is* the student with swiftkv off: layers < N are identical for both, so one
`embed_and_early` feeds `late(student=False)` and `late(student=True)` ("shared" mode, one model in
memory, layers < N computed once). Otherwise the two models run separately ("separate" mode).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..files import folder_fingerprint, portable_path
from ..model.config import is_swiftkv
from ..model.surgery import teacher_difference, tokenizer_differences
from ..sources import SourceLike, check_supported, check_weights_present, open_source
from .processes import Processes

STUDENT, TEACHER = "student", "teacher"
ROLES = (TEACHER, STUDENT)


@dataclass
class ModelPair:
    student: torch.nn.Module
    teacher: torch.nn.Module | None  # None in shared mode: the student's own teacher path
    tokenizer: object
    names: dict[str, str]  # role -> what the user passed (alias or folder)
    cache_keys: dict[str, str]  # role -> fingerprint of the weights + dtype (results-cache key)
    dtype: torch.dtype
    processes: Processes = field(default_factory=Processes)  # the device, and the share of the work

    @property
    def device(self) -> torch.device:
        return self.processes.device

    @property
    def mode(self) -> str:
        return "shared" if self.teacher is None else "separate"

    @property
    def max_length(self) -> int:
        return int(getattr(self.student.config, "max_position_embeddings", 2048))

    def model_of(self, role: str) -> torch.nn.Module:
        return self.teacher if role == TEACHER and self.teacher is not None else self.student

    @torch.inference_mode()
    def final_hidden(
        self, input_ids: torch.Tensor, keep_rows: torch.Tensor | None, roles
    ) -> dict[str, torch.Tensor]:
        """Post-norm hidden states [batch, kept positions, H] of each role, `keep_rows` being sequence
        positions (None: all). lm_head is left to the caller, so it only runs on the rows scored. In
        shared mode one `forward_pair` serves both roles (layers < N once)."""
        batch, seq = input_ids.shape
        input_ids = input_ids.to(self.device)
        positions = torch.arange(seq) if keep_rows is None else torch.as_tensor(keep_rows)
        positions = positions.to(self.device)
        if self.teacher is None:
            rows = (torch.arange(batch, device=self.device)[:, None] * seq + positions[None]).reshape(-1)
            pair = self.student.model.forward_pair(input_ids, rows=rows)
            both = {TEACHER: pair.teacher, STUDENT: pair.student}
            return {role: both[role].view(batch, len(positions), -1) for role in roles}
        out = {}
        for role in roles:
            model = self.model_of(role)
            if is_swiftkv(model):  # the student alone: its later layers on the kept positions only
                out[role] = model.model(
                    input_ids=input_ids, keep_rows=positions, swiftkv=True
                ).last_hidden_state
            else:
                out[role] = model.model(input_ids=input_ids).last_hidden_state[:, positions]
        return out

    def lm_head(self, role: str) -> torch.nn.Module:
        return self.model_of(role).lm_head


def check_causal_lm(folder: Path) -> None:
    config = check_supported(folder)
    architectures = config.get("architectures") or []
    if architectures and not any(name.endswith("ForCausalLM") for name in architectures):
        raise ValueError(f"{folder}: architectures {architectures} is not a causal LM; expected *ForCausalLM")


def check_same_tokenizer(student_tok, teacher_tok, names: dict[str, str]) -> None:
    """Paired scoring compares token by token, so the two vocabularies must be the same."""
    differences = tokenizer_differences(student_tok, teacher_tok)
    if differences:
        raise ValueError(
            f"student {names[STUDENT]!r} and teacher {names[TEACHER]!r} have different tokenizers: "
            + "; ".join(differences)
            + ". Expected the teacher the student was converted from."
        )


def can_run_teacher_path(model) -> bool:
    return is_swiftkv(model) and not model.config.teacher_missing


def load_pair(
    student_src: SourceLike,
    teacher_src: SourceLike | None,
    dtype: torch.dtype = torch.bfloat16,
    share_early: bool = True,
    processes: Processes | None = None,
) -> ModelPair:
    """Load MODEL and TEACHER (None: the student's own teacher path) for paired scoring, on
    `processes.device` (default: one process on the CPU).
    `share_early=False` keeps two models even when they could share layers < N (for speed comparisons).
    The weights are read in `dtype` (an 8B model in bf16 never passes through 32 GB of fp32 in each
    process; reading in fp32 and casting gives the same values)."""
    processes = processes or Processes()
    sources = {STUDENT: open_source(student_src)}  # an opened Source is not resolved again
    if teacher_src is not None:
        sources[TEACHER] = open_source(teacher_src)
    for source in sources.values():
        check_causal_lm(source.folder)
        check_weights_present(source.folder)
    names = pair_names(student_src, teacher_src)
    tokenizer = sources[STUDENT].load_tokenizer()
    if teacher_src is not None:  # before any weights are read: a wrong pair fails fast
        check_same_tokenizer(tokenizer, sources[TEACHER].load_tokenizer(), names)
    student = sources[STUDENT].load_model(dtype)
    keys = {STUDENT: folder_fingerprint(sources[STUDENT].folder)}
    teacher = None
    if teacher_src is None:
        if not can_run_teacher_path(student):
            why = student.config.teacher_missing if is_swiftkv(student) else "it is not a SwiftKV model"
            raise ValueError(
                f"{student_src!r} cannot run its own teacher path ({why}); "
                "pass --teacher with the model it was converted from"
            )
        keys[TEACHER] = keys[STUDENT] + "-teacher-path"
    else:
        teacher = sources[TEACHER].load_model(dtype)
        keys[TEACHER] = folder_fingerprint(sources[TEACHER].folder)
        if (
            share_early
            and can_run_teacher_path(student)
            and teacher_difference(student, teacher, swiftkv_too=True) is None
        ):
            teacher = None  # the student's teacher path computes exactly the teacher: share layers < N
    if is_swiftkv(student):
        student.set_swiftkv(True)  # `generate` and plain forwards of the student run the SwiftKV path
    dtype_name = str(dtype).removeprefix("torch.")
    keys = {role: f"{key}-{dtype_name}" for role, key in keys.items()}
    place = {"device": processes.device, "dtype": dtype}
    return ModelPair(
        student.to(**place),
        teacher.to(**place) if teacher is not None else None,
        tokenizer,
        names,
        keys,
        dtype,
        processes,
    )


def load_floor_pair(
    teacher_src: SourceLike, dtype: torch.dtype, floor_dtype: torch.dtype, processes: Processes | None = None
) -> ModelPair:
    """The teacher (in `dtype`) paired with itself in `floor_dtype` as the "student": how far the
    teacher moves from itself with precision alone, the floor of every agreement measure."""
    pair = load_pair(teacher_src, teacher_src, dtype, processes=processes)
    pair.student = pair.student.to(floor_dtype)
    floor_name = str(floor_dtype).removeprefix("torch.")
    pair.cache_keys[STUDENT] = pair.cache_keys[STUDENT].rsplit("-", 1)[0] + f"-{floor_name}"
    pair.names[STUDENT] = f"{pair.names[TEACHER]} in {floor_name}"
    return pair


def pair_names(student_src: SourceLike, teacher_src: SourceLike | None) -> dict[str, str]:
    """The pair's names as results and reports give them; without a teacher, the student's own teacher path."""
    student = recorded_name(student_src)
    return {
        STUDENT: student,
        TEACHER: recorded_name(teacher_src) if teacher_src else f"{student} (swiftkv off)",
    }


def recorded_name(src: SourceLike) -> str:
    """A model source as results and reports name it: the name it was given by, a path in its portable form
    (a record names no folder of the machine that wrote it)."""
    return portable_path(str(src))


def describe(pair: ModelPair) -> dict:
    """Facts about the pair for the report."""
    config = pair.student.config
    info = {
        "student": pair.names[STUDENT],
        "teacher": pair.names[TEACHER],
        "mode": pair.mode,
        "dtype": str(pair.dtype).removeprefix("torch."),
        "cache_keys": pair.cache_keys,
    }
    if is_swiftkv(pair.student):
        info.update(
            num_hidden_layers=config.num_hidden_layers,
            num_key_value_layers=config.num_key_value_layers,
            key_value_group_size=config.key_value_group_size,
        )
    return json.loads(json.dumps(info))
