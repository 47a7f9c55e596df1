"""The one matplotlib setup of every PNG swiftkv writes (eval report, sweep, scoring cost, offline
and online bench): a headless backend, one figure, tight layout, saved, closed even on error."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def figure(path: str | os.PathLike, figsize: tuple[float, float], ncols: int = 1, dpi: int = 110) -> Iterator:
    """Yield (figure, axes) for `ncols` side-by-side panels (one axis when ncols = 1); on leaving,
    lay the figure out and save it to `path` as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi, format="png")
    finally:
        plt.close(fig)
