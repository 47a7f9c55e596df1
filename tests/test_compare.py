"""docs/distill-study/compare.py's greedy-answer table: two students' first divergences paired prompt by prompt,
and nothing where a run did not keep them."""

import importlib.util
from pathlib import Path

import pytest

from swiftkv.evaluate.stats import paired_divergences
from swiftkv.results import StudentResult

COMPARE = Path(__file__).parents[1] / "docs" / "distill-study" / "compare.py"


def load_compare():
    spec = importlib.util.spec_from_file_location("compare", COMPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student(chat: list[int] | None, long: list[int] | None, new_tokens: int = 32) -> StudentResult:
    def greedy(divergences):
        return {"prompts": 4, "new_tokens": new_tokens, "first_divergences": divergences}

    return StudentResult.from_json({"generation": greedy(chat), "long_prompt": greedy(long)})


def test_greedy_answers_are_paired_prompt_by_prompt():
    compare = load_compare()
    before, after = student([1, 4, 32, 2], [3, 3, 3, 3]), student([2, 9, 32, 1], [3, 5, 6, 3])
    lines = compare.generation_table(before, after)
    chat = paired_divergences([1, 4, 32, 2], [2, 9, 32, 1])
    assert lines[2] == (
        f"| generation | 4 | 9.75 | 11.00 | +1.25 (± {chat['diff_stderr']:.2f}) | 1 / 2 | {chat['sign_p']:.2g} |"
    )
    assert lines[3].startswith("| long_prompt | 4 | 3.00 | 4.25 | +1.25 ") and "| 0 / 2 |" in lines[3]
    assert compare.generation_table(student(None, None), after) == []  # an older run: no per-prompt record
    with pytest.raises(ValueError, match="answers of 32 and 64 tokens"):
        compare.generation_table(before, student([2, 9, 32, 1], None, new_tokens=64))
