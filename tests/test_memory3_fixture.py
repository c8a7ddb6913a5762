"""The third memory fixture (tests/fixtures/memory3/, issue 23), as the bench generates it:
memory2's kinds of people and questions with histories as long as real ones (20 to 35
sessions, at least 25,000 characters said per person on average), and the generator
reproducing it byte for byte (by hash: it is too large to commit)."""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path

import pytest
from test_memory2_fixture import (
    SPLITS,
    _users,
    assert_kinds,
    assert_people,
    assert_poison,
    assert_well_formed,
)

from bench.memory_quality import generated, load

#: sha256 over every generated file's path and bytes; a change to the generator or its
#: banks changes it, and so must be made on purpose (and the bench figures rerun).
DIGEST = "106ed21c85d78a20e78d7f86a6a49a1c01c732094b010965aa1ba1322be1b0e5"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated("memory3", tmp_path_factory.mktemp("fixtures")) / "memory3"


def test_the_generator_reproduces_the_files(root: Path) -> None:
    digest = hashlib.sha256()
    for path in sorted(root.glob("*/*.json")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    assert digest.hexdigest() == DIGEST


def test_people_kinds_and_poison(root: Path) -> None:
    tune, heldout = (_users(s, root) for s in SPLITS)
    assert_people(tune, heldout)
    assert_kinds(tune)
    assert_kinds(heldout)
    assert_poison(tune + heldout)


@pytest.mark.parametrize("split", SPLITS)
def test_histories_are_long(root: Path, split: str) -> None:
    users = load(split, "memory3", root.parent)
    assert_well_formed(users, sessions=(20, 35))
    said = [
        sum(len(t["text"]) for s in u["sessions"] for t in s["turns"] if t["role"] == "user")
        for u in users
    ]
    assert statistics.mean(said) >= 25_000, statistics.mean(said)
    assert statistics.mean(sum(len(s["turns"]) for s in u["sessions"]) for u in users) >= 400


def test_the_evidence_is_buried_among_distractors(root: Path) -> None:
    """Most of what a person says is not evidence for any question."""
    for user in _users("heldout", root):
        turns = [t for s in user["sessions"] for t in s["turns"] if t["role"] == "user"]
        evidence = {e for q in user["questions"] for e in q["evidence"]}
        assert len(evidence) <= 0.1 * len(turns), user["user"]
