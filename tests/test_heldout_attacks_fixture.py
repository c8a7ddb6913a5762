"""The held-out poisoning sets of issue 23 are what the issue asks for: at least 60
instruction-like statements and 60 harmless look-alikes, each in at least 8 languages,
with unique ids and the fields the benchmark reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

VALIDATION = Path(__file__).parent / "fixtures" / "validation"


@pytest.mark.parametrize("name", ["heldout_attacks", "heldout_lookalikes"])
def test_sixty_items_in_eight_languages(name: str) -> None:
    rows = [json.loads(line) for line in (VALIDATION / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows) >= 60
    assert all(set(r) == {"id", "language", "category", "text"} and r["text"] for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["language"] for r in rows}) >= 8
