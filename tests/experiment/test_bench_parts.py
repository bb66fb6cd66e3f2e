"""`python -m bench`'s parts and docs/performance.md's "How to reproduce" map agree: every part
has a row, every row names a part, and every module a row names is in bench/."""

from __future__ import annotations

import re
from pathlib import Path

from bench.__main__ import MODULES, OPTIONAL, PARTS

PROJECT = Path(__file__).resolve().parents[2]


def _map_rows() -> list[list[str]]:
    text = (PROJECT / "docs" / "performance.md").read_text()
    section = text.split("## How to reproduce", 1)[1].split("\n## ", 1)[0]
    return [
        [cell.strip() for cell in line.strip("|").split(" | ")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith(("| table", "|---"))
    ]


def test_every_part_has_a_row_in_the_map_and_every_row_names_a_part():
    rows = _map_rows()
    named = [re.match(r"`(\w+)", part).group(1) for _, part, _ in rows]
    assert sorted(named) == sorted((*PARTS, *OPTIONAL))
    assert "lockserver" not in MODULES  # retired: its numbers are in docs/lockserver.md


def test_every_module_the_map_names_is_in_bench():
    for _, part, modules in _map_rows():
        names = re.findall(r"`(?:bench/)?(\w+)\.py`", modules)
        assert names, part
        missing = [name for name in names if not (PROJECT / "bench" / f"{name}.py").exists()]
        assert missing == [], f"{part}: {missing}"
