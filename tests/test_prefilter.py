"""The prefilter skips a pattern only where it cannot match, and the screen's verdicts are
the ones recorded before it (``tests/fixtures/validation_verdicts.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afterthought import prefilter, validation

FIXTURES = Path(__file__).parent / "fixtures"
VERDICTS = FIXTURES / "validation_verdicts.json"


def _fixture_texts() -> dict[str, str]:
    texts: dict[str, str] = {}
    for path in sorted([*FIXTURES.glob("validation/*.jsonl"), *FIXTURES.glob("blind7/*.jsonl")]):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                texts[f"{path.parent.name}/{path.name}:{row['id']}"] = row["text"]
    return texts


def _patterns() -> list[prefilter.Pattern]:
    found = [p for p in vars(validation).values() if isinstance(p, prefilter.Pattern)]
    return [*found, *validation._INSTRUCTIONS, *validation._CUES.values()]


def test_a_pattern_is_skipped_only_where_it_cannot_match() -> None:
    attacks = [t for k, t in _fixture_texts().items() if "attack" in k]
    readings = {w for t in attacks for w in validation._views(validation.normalise(t))}
    for pattern in _patterns():
        for reading in readings:
            if pattern.compiled.search(reading) is not None:
                assert pattern.possible(reading), (pattern.pattern[:60], reading[:60])


@pytest.mark.parametrize(
    ("source", "matching", "lacking"),
    [
        (r"\bignore\s+(?:all\s+)?previous\b", "so ignore  all previous", "ignore previously"),
        (r"(?<![a-z])ai\b", "the ai said", "the bot spoke"),
        (r"\byou(?:'re|\s+are)\s+now\b", "you're now", "you are not now"),
        (r"x\w+bot\b", "xchatbot", "robot"),
    ],
)
def test_a_pattern_runs_only_where_its_requirements_are(
    source: str, matching: str, lacking: str
) -> None:
    pattern = prefilter.Pattern(source)
    assert pattern.search(matching) is not None
    assert not pattern.possible(lacking)


def test_the_verdicts_are_the_recorded_ones() -> None:
    recorded = json.loads(VERDICTS.read_text(encoding="utf-8"))
    texts = _fixture_texts()
    assert set(recorded) == set(texts)
    changed = [k for k, t in texts.items() if validation.detect(t) != recorded[k]]
    assert not changed


def test_the_screen_reads_a_text_in_work_linear_in_its_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted in characters handed to a regex (not wall time, the machine is shared):
    ten times the text is at most about ten times the work."""
    scanned = [0]
    search = prefilter.Pattern.search

    def counting(self: prefilter.Pattern, text: str, *args: int | None) -> object:
        if self.possible(text):
            scanned[0] += len(text)
        return search(self, text, *args)

    monkeypatch.setattr(prefilter.Pattern, "search", counting)
    chat = "we went hiking on Sunday and my knee hurts a bit. the kids loved the lake. "

    def work(length: int) -> int:
        scanned[0] = 0
        assert validation.detect((chat * (length // len(chat) + 1))[:length]) is None
        return scanned[0]

    assert work(20_000) <= 12 * work(2_000)
