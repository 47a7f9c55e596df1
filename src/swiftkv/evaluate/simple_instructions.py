"""The shipped easy instruction set (`--instruction-following simple`), rebuilt by
`python -m swiftkv.evaluate.simple_instructions` (deterministic: the same file every time).

IFBench asks for several unusual constraints at once, which a 135M model almost never meets, so a drop
cannot show. Here each prompt is a short writing task with one IFEval instruction; the instruction's text is
the checker's own description (`build_description` with fixed arguments), so the prompt asks exactly what
the same checker then verifies. Every task (5 kinds x 7 topics) meets every instruction: 35 x 14 = 490.
"""

from __future__ import annotations

import json
import random
import sys

from ..files import write_atomic
from .checkers import registry
from .instructions import SIMPLE_SET

TASKS = (
    "Write a short note to a neighbour about {topic}.",
    "Describe {topic} in a short paragraph.",
    "Give a friend some advice about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Write a short blog post about {topic}.",
)
TOPICS = (
    "a morning walk by the river", "learning to cook rice", "keeping houseplants alive",
    "a rainy afternoon in the city", "starting to run", "saving money on groceries", "a trip to the mountains",
)  # fmt: skip
KEYWORDS = ("river", "morning", "light", "garden", "window", "bread", "music", "road", "paper", "stone")
SEED = "swiftkv-simple-instructions"


def instructions(rng: random.Random) -> list[tuple[str, dict]]:
    """The 14 instruction ids with their arguments (keywords drawn from `rng`)."""
    first, second = rng.sample(KEYWORDS, 2)
    return [
        ("change_case:english_lowercase", {}),
        ("change_case:english_capital", {}),
        ("punctuation:no_comma", {}),
        ("keywords:existence", {"keywords": [first, second]}),
        ("keywords:forbidden_words", {"forbidden_words": ["very", "really"]}),
        ("keywords:frequency", {"keyword": first, "frequency": 2, "relation": "at least"}),
        ("detectable_format:title", {}),
        ("detectable_format:number_bullet_lists", {"num_bullets": 3}),
        ("detectable_format:json_format", {}),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}),
        ("detectable_content:number_placeholders", {"num_placeholders": 1}),
        ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"}),
        ("startend:quotation", {}),
        ("length_constraints:number_words", {"relation": "less than", "num_words": 50}),
    ]


def simple_items() -> list[dict]:
    """One record per (task, instruction), in IFBench's schema."""
    rng, checkers, records = random.Random(SEED), registry(), []
    for task in TASKS:
        for topic in TOPICS:
            for instruction_id, kwargs in instructions(rng):
                description = checkers[instruction_id](instruction_id).build_description(**kwargs)
                records.append(
                    {
                        "key": f"simple-{len(records)}",
                        "prompt": f"{task.format(topic=topic)} {description}",
                        "instruction_id_list": [instruction_id],
                        "kwargs": [kwargs],
                    }
                )
    return records


def main() -> int:
    records = simple_items()
    write_atomic(SIMPLE_SET, "".join(json.dumps(record) + "\n" for record in records).encode())
    print(f"wrote {len(records)} prompts to {SIMPLE_SET}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
