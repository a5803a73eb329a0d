"""The bounded memories both process tables are built on."""

from dataclasses import dataclass

import pytest
from autellix_vllm.policy.bounded import IdleTable, RecentIds, RecentMap


@dataclass
class Entry:
    last_active_s: float
    busy: bool = False


def test_idle_table_drops_idle_entries_least_recently_active_first():
    table: IdleTable[Entry] = IdleTable(idle_ttl_s=10.0)
    for key, at in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        table.add(key, Entry(at))
    table.get("a").last_active_s = 5.0
    table.touch("a")  # active again: now the most recent
    assert [e.last_active_s for e in table] == [1.0, 2.0, 5.0]
    assert table.drop_idle(now_s=11.0) == ["b"]  # idle for exactly the TTL counts
    assert table.drop_idle(now_s=14.9) == ["c"]
    assert table.drop_idle(now_s=15.0) == ["a"]
    assert len(table) == 0 and table.departures == 3


def test_idle_table_keeps_busy_entries_however_long_idle_and_sweeps_past_them():
    table: IdleTable[Entry] = IdleTable(idle_ttl_s=10.0)
    table.add("busy", Entry(0.0, busy=True))
    table.add("idle", Entry(1.0))
    table.add("fresh", Entry(95.0))
    assert table.drop_idle(now_s=100.0) == ["idle"]
    assert "busy" in table and "fresh" in table
    table.get("busy").busy = False
    assert table.drop_idle(now_s=100.0) == ["busy"]
    assert table.pop("fresh") is not None and table.pop("fresh") is None
    assert table.departures == 3  # a pop of what is not held is no departure
    table.touch("fresh")  # touching what is not held is a no-op


def test_recent_map_forgets_the_least_recently_written_key_past_its_capacity():
    values: RecentMap[float] = RecentMap(capacity=2)
    values.put("a", 1.0)
    values.put("b", 2.0)
    assert values.get("a", 0.0) == 1.0  # a read does not refresh "a"
    values.put("c", 3.0)
    assert "a" not in values and values.get("a", 0.0) == 0.0
    values.put("b", 4.0)  # a write does: "c" is now the oldest
    values.put("d", 5.0)
    assert ("b" in values, "c" in values, "d" in values, len(values)) == (True, False, True, 2)
    with pytest.raises(ValueError):
        RecentMap(capacity=-1)


def test_recent_ids_add_says_whether_an_id_is_new_and_stays_bounded():
    ids = RecentIds(capacity=3)
    assert ids.add("x") and not ids.add("x")  # a retry of the same id
    for key in ("y", "z", "w"):
        assert ids.add(key)
    assert len(ids) == 3 and "x" not in ids  # the oldest is forgotten first
    assert ids.add("x")  # and so counts as new again
    assert "y" not in ids and all(key in ids for key in ("z", "w", "x"))
