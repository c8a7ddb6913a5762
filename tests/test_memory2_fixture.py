"""The second memory fixture (tests/fixtures/memory2/, issue 23) is what its FORMAT.md says:
enough people, a held-out part, every kind at least 15 % of the questions, every answer
really in its evidence (or the evidence's session date), and the generator reproduces it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "memory2"
SPLITS = ("tune", "heldout")
KINDS = {"single-hop", "multi-hop", "temporal", "open-domain", "update"}


def _users(split: str, root: Path = FIXTURE) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / split).glob("*.json"))]


def test_a_hundred_people_and_a_held_out_part() -> None:
    assert_people(*(_users(s) for s in SPLITS))


def assert_people(tune: list[dict[str, Any]], heldout: list[dict[str, Any]]) -> None:
    assert len(tune) + len(heldout) >= 100
    assert len(heldout) >= 40
    names = [u["user"] for u in tune + heldout]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("split", SPLITS)
def test_every_kind_is_at_least_fifteen_percent(split: str) -> None:
    assert_kinds(_users(split))


def assert_kinds(users: list[dict[str, Any]]) -> None:
    kinds = Counter(q["kind"] for u in users for q in u["questions"])
    assert set(kinds) == KINDS
    assert min(kinds.values()) >= 0.15 * sum(kinds.values()), kinds


@pytest.mark.parametrize("split", SPLITS)
def test_every_user_is_well_formed(split: str) -> None:
    assert_well_formed(_users(split), sessions=(6, 15))


def assert_well_formed(users: list[dict[str, Any]], sessions: tuple[int, int]) -> None:
    """Sessions in order, every fact and answer really in its evidence (or the evidence's
    session date), multi-hop with two statements, updates with a stale value."""
    for user in users:
        who = user["user"]
        assert sessions[0] <= len(user["sessions"]) <= sessions[1], who
        dates = [datetime.fromisoformat(s["date"]) for s in user["sessions"]]
        assert dates == sorted(dates), who
        turns = {t["id"]: t for s in user["sessions"] for t in s["turns"]}
        assert len(turns) == sum(len(s["turns"]) for s in user["sessions"]), who
        day = {t["id"]: d for s, d in zip(user["sessions"], dates, strict=True) for t in s["turns"]}
        for fact in user["facts"]:
            said = " ".join(turns[e]["text"].lower() for e in fact["evidence"])
            assert all(turns[e]["role"] == "user" for e in fact["evidence"]), who
            assert any(v.lower() in said for v in fact["current"]), (who, fact["id"])
        for question in user["questions"]:
            assert datetime.fromisoformat(question["asked"]) > dates[-1], (who, question["id"])
            assert all(turns[e]["role"] == "user" for e in question["evidence"]), who
            if question.get("answer_source") == "session_date":
                said = day[question["evidence"][0]].date().isoformat()
            else:
                said = " ".join(turns[e]["text"].lower() for e in question["evidence"])
            assert any(a.lower() in said for a in question["answers"]), (who, question["id"])
            if question["kind"] == "multi-hop":
                assert len(question["evidence"]) >= 2, (who, question["id"])
            if question["kind"] == "update":
                fact = next(f for f in user["facts"] if f["id"] == question["fact"])
                assert fact["stale"], (who, question["id"])


def test_poison_markers_occur_only_in_their_turn() -> None:
    assert_poison([u for s in SPLITS for u in _users(s)])


def assert_poison(everyone: list[dict[str, Any]]) -> None:
    texts: Counter[str] = Counter()
    for user in everyone:
        for session in user["sessions"]:
            for turn in session["turns"]:
                texts.update(set(re.findall(r"\w+", turn["text"].lower())))
    poisoned = [u for u in everyone if u["poison"]]
    assert len(poisoned) >= 20
    for user in poisoned:
        turns = {t["id"]: t["text"] for s in user["sessions"] for t in s["turns"]}
        for poison in user["poison"]:
            for marker in poison["markers"]:
                assert marker.lower() in turns[poison["turn"]].lower(), user["user"]
                assert texts[marker.lower()] == 1, (user["user"], marker)


def test_the_generator_reproduces_the_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(FIXTURE / "generate.py"), str(tmp_path)], check=True)
    written = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.glob("*/*.json")}
    assert written == {p.relative_to(FIXTURE): p.read_bytes() for p in FIXTURE.glob("*/*.json")}
