"""The Grafana dashboard (docs/grafana/autellix.json) queries only series the code exports.

The exported names are read from the code's own prometheus-client objects: the
router's registry (``RouterMetrics``) and the engine's table collector
(``TableCollector.describe``), so a renamed or removed series breaks this test,
not a dashboard panel in production.
"""

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from autellix_vllm.engine.metrics import TableCollector  # noqa: E402
from autellix_vllm.router.metrics import RouterMetrics  # noqa: E402

DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana" / "autellix.json"

# The sample names a family of each type puts on the wire.
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
# PromQL words that are not metric names (operators, modifiers, grouping).
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
_LABEL_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_NUMBERS = re.compile(r"(?<![A-Za-z0-9_:])[0-9][0-9A-Za-z_.]*")  # 0.95, 1e3, 5m (a duration)
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def exported_names() -> set[str]:
    """Every sample name the router and the engines may export."""
    families = [
        *RouterMetrics().registry.collect(),
        *TableCollector(dict).describe(),
    ]
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: the identifiers left once
    strings, label matchers, ranges, grouping clauses and numbers are removed,
    that are neither functions (followed by ``(``) nor keywords."""
    for pattern in (_STRINGS, _LABEL_MATCHERS, _RANGES, _GROUPING, _NUMBERS):
        expr = pattern.sub(" ", expr)
    names = set()
    for match in _NAME.finditer(expr):
        rest = expr[match.end() :].lstrip()
        if not rest.startswith("(") and match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


def panels() -> list[dict]:
    """Every panel, those inside collapsed rows too (rows themselves hold no query)."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def test_the_expression_reader_finds_metric_names_and_nothing_else():
    expr = (
        'histogram_quantile(0.95, sum by (key, le) (rate(x_seconds_bucket{key="a b"}[5m])))'
        " / on (key) group_left y_total offset 1m"
    )
    assert metric_names(expr) == {"x_seconds_bucket", "y_total"}


def test_every_panel_queries_only_series_the_code_exports():
    exported = exported_names()
    assert "autellix_router_call_seconds_bucket" in exported
    assert "autellix_holds_total" in exported
    for panel in panels():
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']!r}: {target['expr']!r} reads no series"
            unknown = names - exported
            assert not unknown, f"{panel['title']!r} queries {unknown}, which nothing exports"


def test_the_dashboard_covers_the_issues_questions():
    """Programs live, calls waiting by level, holds, preemptions, latency per key,
    engines' health: each is queried by some panel."""
    queried = {
        name for panel in panels() for t in panel["targets"] for name in metric_names(t["expr"])
    }
    for name in (
        "autellix_router_programs_active",
        "autellix_queue_depth",
        "autellix_held_blocks",
        "autellix_holds_total",
        "autellix_preemptions_total",
        "autellix_router_call_seconds_bucket",
        "autellix_router_engine_healthy",
    ):
        assert name in queried, name
