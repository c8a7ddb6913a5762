"""The screen's one-pass pieces give the answers of the regexes they stand in for: the
phrase index (:class:`afterthought.phrases.Index`) finds every place a lexicon concept's
regex matches, so a concept tried only there finds what ``finditer`` finds; the
instruction patterns asked as a set (:class:`afterthought.prefilter.PatternSet`, each
alternation split into its branches) say what one search of each says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afterthought import validation
from afterthought.prefilter import Pattern, alternatives

FIXTURES = Path(__file__).parent / "fixtures"


def _fixture_views() -> list[str]:
    views = []
    for path in sorted([*FIXTURES.glob("validation/*.jsonl"), *FIXTURES.glob("blind7/*.jsonl")]):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                views.append(validation.normalise(json.loads(line)["text"]))
    return views


def _spans(pattern: Pattern | re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


_PHRASES = sorted({p for lines in validation._CONCEPTS.values() for p in validation._folded(lines)})
_SPACING = st.sampled_from(["", " ", "  ", "\n", "\t "])
#: Phrases of every concept run together, cut short or broken, their spaces spaced anew,
#: with the characters that decide where a phrase may start and end around them.
_MASHUPS = st.lists(
    st.tuples(
        st.sampled_from(_PHRASES),
        st.integers(0, 3),
        _SPACING,
        st.sampled_from(["", " ", "x", "é", "_", "-", ".", "9", "д", "的", "'"]),
    ),
    min_size=1,
    max_size=8,
).map(
    lambda parts: "".join(
        phrase[: len(phrase) - cut].replace(" ", spacing) + after
        for phrase, cut, spacing, after in parts
    )
)


def _same_as_the_regex(text: str) -> None:
    for name, cue in validation._CUES.items():
        assert _spans(cue, text) == _spans(cue.compiled, text), name
    for name in validation._CONCEPTS:
        concept = validation._concept(name)
        assert _spans(concept, text) == _spans(concept.compiled, text), name


def test_each_concept_is_found_where_its_regex_matches_in_the_corpus() -> None:
    for view in _fixture_views():
        _same_as_the_regex(view)


@settings(max_examples=300, deadline=None)
@given(_MASHUPS)
def test_each_concept_is_found_where_its_regex_matches_in_any_text(text: str) -> None:
    _same_as_the_regex(text)
    _same_as_the_regex(validation.normalise(text))


@pytest.mark.parametrize(
    ("source", "branches"),
    [
        (r"a|b(c|d)|[|]|\|x", ["a", "b(c|d)", "[|]", r"\|x"]),
        (r"[]|]|y", ["[]|]", "y"]),
        (r"[^]|]|z", ["[^]|]", "z"]),
        (r"(?s:x|y)|[\]|]", ["(?s:x|y)", r"[\]|]"]),
        (r"\bno(?:ne|t)\b", [r"\bno(?:ne|t)\b"]),
    ],
)
def test_an_alternation_is_split_at_its_top_level_only(source: str, branches: list[str]) -> None:
    assert alternatives(source) == branches


def test_the_instruction_set_says_what_its_patterns_say() -> None:
    whole = [re.compile(p, re.MULTILINE) for p in validation._INSTRUCTION_PATTERNS]
    readings = {w for v in _fixture_views() for w in validation._views(validation._unmentioned(v))}
    matched = 0
    for reading in readings:
        said = any(p.search(reading) for p in whole)
        assert validation._INSTRUCTIONS.search(reading) == said, reading[:80]
        matched += said
    assert 0 < matched < len(readings)
