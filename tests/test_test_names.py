"""The test suite itself: every test module has a name of its own.

pytest imports test modules by their file name (the folders are not packages,
so helpers such as ``scripted_server`` import by name too); two modules of the
same name in different folders stop the whole run at collection. A run of a few
folders does not collect both, so this check runs with any run of the root.
"""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_every_test_module_has_a_name_of_its_own():
    folders: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and path.name != "__init__.py":
            folders[path.name].append(str(path.parent.relative_to(TESTS)))
    shared = {name: where for name, where in folders.items() if len(where) > 1}
    assert not shared, f"rename one of each: {shared}"
