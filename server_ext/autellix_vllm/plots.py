"""Figures shared by the simulator's sweep and the engine benchmark (matplotlib,
the ``sim`` extra): a figure of side-by-side panels, and a latency CDF panel."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def save_panels(path: str, title: str, panels: Sequence[Callable[[Any], None]]) -> Any:
    """Draw each of ``panels`` (a function of a matplotlib ``Axes``) side by side and
    write the figure to ``path`` (PNG); returns the (closed) figure."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for draw, ax in zip(panels, axes[0], strict=True):
        draw(ax)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def draw_latency_cdf(ax: Any, latencies: Mapping[str, Sequence[float]], title: str) -> None:
    """One step curve per key: the share of programs whose latency (seconds) is at most
    x. A log x axis, since program latencies span orders of magnitude."""
    for key, values in latencies.items():
        ordered = sorted(values)
        if not ordered:
            continue
        shares = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.step(ordered, shares, where="post", label=key)
    ax.set_xscale("log")
    ax.set_xlabel("program latency (s): arrival to last call's completion")
    ax.set_ylabel("share of programs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", linewidth=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
