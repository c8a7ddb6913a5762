"""The memory-quality fixture is what its README says it is: enough people and sessions,
and every answer really stated in its evidence (a benchmark that cannot be right is no
benchmark). The targets themselves are asserted in tests/test_memory_quality.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "memory"
SPLITS = ("tune", "heldout")
KINDS = {"current", "update", "detail", "temporal", "other-person"}


def _users(split: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((FIXTURE / split).glob("*.json"))]


def test_sixty_people_and_a_held_out_part() -> None:
    tune, heldout = (_users(s) for s in SPLITS)
    assert len(tune) + len(heldout) >= 60
    assert len(heldout) >= 20
    names = [u["user"] for u in tune + heldout]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("split", SPLITS)
def test_every_user_is_well_formed(split: str) -> None:
    for user in _users(split):
        who = user["user"]
        assert len(user["sessions"]) >= 5, who
        dates = [datetime.fromisoformat(s["date"]) for s in user["sessions"]]
        assert dates == sorted(dates), who
        turns = {t["id"]: t for s in user["sessions"] for t in s["turns"]}
        assert len(turns) == sum(len(s["turns"]) for s in user["sessions"]), who
        for fact in user["facts"]:
            said = " ".join(turns[e]["text"].lower() for e in fact["evidence"])
            assert all(turns[e]["role"] == "user" for e in fact["evidence"]), who
            assert any(v.lower() in said for v in fact["current"]), (who, fact["id"])
        for question in user["questions"]:
            assert question["kind"] in KINDS, (who, question["id"])
            assert datetime.fromisoformat(question["asked"]) > dates[-1], (who, question["id"])
            said = " ".join(turns[e]["text"].lower() for e in question["evidence"])
            assert all(turns[e]["role"] == "user" for e in question["evidence"]), who
            assert any(a.lower() in said for a in question["answers"]), (who, question["id"])


def test_poison_markers_occur_only_in_their_turn() -> None:
    texts: Counter[str] = Counter()
    everyone = [u for s in SPLITS for u in _users(s)]
    for user in everyone:
        for session in user["sessions"]:
            for turn in session["turns"]:
                texts.update(set(re.findall(r"\w+", turn["text"].lower())))
    poisoned = [u for u in everyone if u.get("poison")]
    assert len(poisoned) >= 10
    for user in poisoned:
        turns = {t["id"]: t["text"] for s in user["sessions"] for t in s["turns"]}
        for poison in user["poison"]:
            for marker in poison["markers"]:
                assert marker.lower() in turns[poison["turn"]].lower(), user["user"]
                if re.fullmatch(r"\w+", marker):
                    assert texts[marker.lower()] == 1, (user["user"], marker)
