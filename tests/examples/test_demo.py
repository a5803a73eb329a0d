"""The demo's comparison without engines: the order of its rounds, the table and
the verdict on how busy the machine was."""

from __future__ import annotations

from pathlib import Path

from _common import ProgramReport, write_reports
from demo import CpuSample, Example, busy_verdict, format_answers, format_comparison, round_order


def test_rounds_alternate_and_mirror_so_neither_scheduler_always_goes_first():
    assert round_order(["autellix", "vllm"], 1) == ["autellix", "vllm"]
    assert round_order(["autellix", "vllm"], 3) == [
        "autellix", "vllm", "vllm", "autellix", "autellix", "vllm",
    ]  # fmt: skip
    assert round_order(["upstream"], 2) == ["upstream", "upstream"]


def test_the_probe_measures_a_share_of_a_core():
    sample = CpuSample.take()
    assert 0.0 < sample.core_share <= 1.0 and sample.load >= 0.0


def test_the_verdict_says_when_the_machine_was_too_busy():
    quiet = busy_verdict(CpuSample(0.3, 1.0), [CpuSample(0.8, 0.97), CpuSample(1.1, 0.9)])
    assert quiet.startswith("demo: the machine was quiet enough: a core gave 90%-100%")
    busy = busy_verdict(CpuSample(4.2, 0.5), [CpuSample(6.7, 0.35), CpuSample(5.0, 0.4)])
    assert busy.startswith("demo: the machine was too busy for this comparison to mean anything")
    assert "load average 5.0-6.7" in busy


def one_round(folder: Path, name: str, walls: dict[str, list[float]]) -> list[Example]:
    """A finished round: each example's reports, with these wall times."""
    folder.mkdir(parents=True)
    examples = []
    for example, seconds in walls.items():
        right = {"react_agent": "RIGHT", "mcts_agent": "SOLVED"}[example]
        reports = [ProgramReport(f"{name}-{i}", calls=2, wall_seconds=wall,
                                 columns={right: "yes" if i else "no"})
                   for i, wall in enumerate(seconds)]  # fmt: skip
        write_reports(folder / f"{example}.json", reports)
        examples.append(Example(example, None, folder / f"{example}.json", folder / "log"))  # type: ignore[arg-type]
    return examples


def test_the_comparison_pools_the_rounds_and_shows_each_pairs_ratio(tmp_path):
    runs = {
        "autellix": [
            one_round(tmp_path / "1", "a", {"mcts_agent": [40.0], "react_agent": [5.0, 5.0]}),
            one_round(tmp_path / "4", "a", {"mcts_agent": [50.0], "react_agent": [6.0, 4.0]}),
        ],
        "vllm": [
            one_round(tmp_path / "2", "v", {"mcts_agent": [40.0], "react_agent": [20.0, 10.0]}),
            one_round(tmp_path / "3", "v", {"mcts_agent": [40.0], "react_agent": [8.0, 6.0]}),
        ],
    }
    lines = format_comparison(runs).splitlines()
    assert lines[1].split()[:2] == ["EXAMPLE", "PROGRAMS"]
    react = lines[3].split()
    assert react[:3] == ["react", "4", "8/8"] and react[-3] == "2.20x"  # 11 s over 5 s
    assert lines[4].split()[:2] == ["all", "6"]
    # The searches took 45 s under autellix against 40 s: the demo says why.
    assert lines[5].startswith("demo: mcts slower under autellix: its programs have received")
    # Each pair: stock's round 2 against autellix's round 1, then 3 against 4.
    assert lines[-1] == "demo: avg ratio of each pair of rounds: 1.40x, 0.90x"  # 18 s over 20 s
    assert format_answers(runs) == (
        "demo: over all 4 rounds: mcts_agent: 0 of 4 solved; react_agent: 4 of 8 answered right"
    )
