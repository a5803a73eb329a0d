"""Figures shared by the simulator's sweep, the engine benchmark and ``autellix ps``
(matplotlib, the ``sim`` extra): a figure of side-by-side panels, a latency CDF
panel, and a program's timeline as a waterfall."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def save_panels(
    path: str, title: str, panels: Sequence[Callable[[Any], None]], height: float = 4.0
) -> Any:
    """Draw each of ``panels`` (a function of a matplotlib ``Axes``) side by side and
    write the figure, ``height`` inches tall, to ``path`` (PNG); returns the (closed)
    figure."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), height), squeeze=False)
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


# A call's parts in a waterfall, in the order they happen: (timeline key, label, colour).
WATERFALL_PARTS = (
    ("queue_s", "queue", "tab:red"),
    ("prefill_s", "prefill", "tab:orange"),
    ("decode_s", "decode", "tab:blue"),
    ("other_s", "other", "tab:gray"),
)
NO_TIMINGS_COLOUR = "black"  # a call the engine reported no timings for
WATERFALL_ROW_INCHES = 0.25


def save_timeline(path: str, title: str, data: dict[str, Any]) -> Any:
    """Write ``data`` (a program's timeline, ``router.timeline.timeline``) to ``path``
    as a waterfall (PNG); returns the (closed) figure."""
    height = max(3.0, 1.5 + WATERFALL_ROW_INCHES * len(data["calls"]))
    # The title goes on the panel: a figure's title overlaps it on a tall figure.
    return save_panels(path, "", [lambda ax: draw_timeline(ax, data, title)], height=height)


def draw_timeline(ax: Any, data: dict[str, Any], title: str) -> None:
    """One row per call, by arrival: a bar per part of the call (queue, prefill,
    decode, other; one black bar if the engine gave no timings), then a hatched,
    hollow bar for the program's own time after it (no call in flight)."""
    labelled: set[str] = set()  # one legend entry per kind of bar

    def bar(row: int, start: float, seconds: float, label: str, **style: Any) -> None:
        ax.barh(row, seconds, left=start, height=0.6,
                label=None if label in labelled else label, **style)  # fmt: skip
        labelled.add(label)

    for row, call in enumerate(data["calls"]):
        start = call["start_s"]
        if any(call[key] is None for key, _, _ in WATERFALL_PARTS):
            bar(row, start, call["duration_s"], "no engine timings", color=NO_TIMINGS_COLOUR)
        else:
            for key, label, colour in WATERFALL_PARTS:
                if call[key] > 0:  # the simulator's calls have no "other"
                    bar(row, start, call[key], label, color=colour)
                start += call[key]
        if call["gap_after_s"]:
            end = call["start_s"] + call["duration_s"]
            bar(row, end, call["gap_after_s"], "program's own time", fill=False,
                hatch="///", edgecolor="tab:green")  # fmt: skip
    ax.set_yticks(range(len(data["calls"])))
    ax.set_yticklabels([c["call_id"] or c["thread_id"] or "-" for c in data["calls"]], fontsize=7)
    ax.invert_yaxis()  # the first call on top
    ax.set_xlabel("seconds since the program's first call arrived")
    ax.grid(True, axis="x", linewidth=0.3)
    ax.margins(y=0.5 / max(1, len(data["calls"])))
    ax.set_title(
        f"{title}: {len(data['calls'])} calls in {data['latency_s']:.3f}s: in calls"
        f" {data['in_calls_s']:.3f}s, own time {data['own_time_s']:.3f}s",
        fontsize=9,
    )
    if labelled:
        # Beside the axes: inside, it would hide the last calls' bars.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
