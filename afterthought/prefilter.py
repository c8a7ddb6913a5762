"""Regexes compiled on first use and run only on text that could hold a match.

:mod:`afterthought.validation` has about a hundred patterns; compiled at import they cost
most of a second in every process (worker, CLI, each test), and tried at every character
of a long text they cost more than the rest of the screen together, though on most text
few of them can match. So a :class:`Pattern` compiles when first used, and before it
searches it asks what every match of it holds — read off its parse tree once: literal
strings, words that stand whole between non-word characters, pairs of words that follow
each other — and looks for that in the text's words (one pass per text, shared by every
pattern). A pattern whose requirements are missing cannot match, so it is not run: the
answers are the regex's own, only found without trying it where it cannot match."""

from __future__ import annotations

import itertools
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

with warnings.catch_warnings():  # the parser's public name is deprecated, not the parser
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_constants as sc
    import sre_parse

#: Where a match holds a word boundary or a run of non-word characters, in the strings
#: below: the word characters on either side of it stand whole in the text.
EDGE = "\0"
#: At most this many strings a part of a pattern is known to spell as a set; beyond it
#: only what each alternative holds is kept.
MOST_STRINGS = 64
#: At most this many requirements are checked per pattern (the most telling ones).
MOST_REQUIREMENTS = 3

_WORD = re.compile(r"\w+")
_WORD_CHAR = re.compile(r"\w")

#: What a part of a pattern matches: the set of strings it spells when that is known (None
#: when not), and requirements: sets of strings, each holding one a match holds.
_Facts = tuple[set[str] | None, list[frozenset[str]]]


def _non_word(op: object, av: object) -> bool:
    """Whether a one-character item matches only non-word characters (``\\s``, ``[.!?]``)."""
    if op is sc.LITERAL:
        assert isinstance(av, int)
        return not _WORD_CHAR.match(chr(av))
    if op is sc.CATEGORY:
        return av in (sc.CATEGORY_SPACE, sc.CATEGORY_NOT_WORD)
    if op is sc.RANGE:
        assert isinstance(av, tuple)
        return not any(_WORD_CHAR.match(chr(c)) for c in range(av[0], av[1] + 1))
    if op is sc.IN:
        assert isinstance(av, list)
        return bool(av) and av[0][0] is not sc.NEGATE and all(_non_word(o, a) for o, a in av)
    return False


def _sequence(items: list[tuple[Any, Any]]) -> _Facts:
    run: set[str] | None = {""}  # what the items since the last unknown one spell
    whole = True
    needs: list[frozenset[str]] = []
    for op, av in items:
        spelt, more = _item(op, av)
        needs.extend(more)
        if run is not None and spelt is not None and len(run) * len(spelt) <= MOST_STRINGS:
            run = {a + b for a in run for b in spelt}
            continue
        whole = False
        if run is not None and "" not in run:
            needs.append(frozenset(run))
        run = spelt
    if whole:
        return run, needs
    if run is not None and "" not in run:
        needs.append(frozenset(run))
    return None, needs


def _item(op: object, av: Any) -> _Facts:
    if op is sc.LITERAL:
        return {chr(av)}, []
    if op is sc.AT:
        return ({EDGE} if av is sc.AT_BOUNDARY else {""}), []
    if op in (sc.ASSERT, sc.ASSERT_NOT):  # a look-around holds nothing of the match
        return {""}, []
    if op is sc.SUBPATTERN:
        _, added, _, sub = av
        return (None, []) if added & sc.SRE_FLAG_IGNORECASE else _sequence(list(sub))
    if op is sc.BRANCH:
        branches = [_sequence(list(b)) for b in av[1]]
        if all(spelt is not None for spelt, _ in branches):
            spelt_all = set().union(*(spelt for spelt, _ in branches if spelt is not None))
            if len(spelt_all) <= MOST_STRINGS:
                return spelt_all, []
        chosen = [_strongest(*b) for b in branches]
        if any(c is None for c in chosen):
            return None, []
        return None, [frozenset().union(*(c for c in chosen if c is not None))]
    if op in (sc.MAX_REPEAT, sc.MIN_REPEAT, sc.POSSESSIVE_REPEAT):
        least, most, sub = av
        if least >= 1 and len(sub) == 1 and _non_word(*sub[0]):
            return {EDGE}, []
        spelt, needs = _sequence(list(sub))
        if least == 0:
            return (spelt | {""} if most == 1 and spelt is not None else None), []
        if least == most == 1:
            return spelt, needs
        strongest = _strongest(spelt, needs)
        return None, [] if strongest is None else [strongest]
    if _non_word(op, av):
        return {EDGE}, []
    return None, []  # any character, a class, a back-reference: nothing known


@dataclass(frozen=True)
class _Check:
    """What a text holds when a match of one string is in it: these whole words, these
    pairs of words one right after the other, this piece (between edges) verbatim."""

    words: frozenset[str]
    pairs: frozenset[tuple[str, str]]
    piece: str

    @classmethod
    def of(cls, spelt: str) -> _Check:
        spaced = spelt.replace(EDGE, " ")
        whole = [
            (m.group(0), m.start())
            for m in _WORD.finditer(spaced)
            if m.start() > 0 and m.end() < len(spaced)
        ]
        # Two whole words with no word character between them in the match are
        # neighbours in the text's words.
        pairs = {
            (a, b)
            for (a, i), (b, j) in itertools.pairwise(whole)
            if not _WORD.search(spaced, i + len(a), j)
        }
        piece = max(spelt.split(EDGE), key=len)
        return cls(frozenset(w for w, _ in whole), frozenset(pairs), piece)

    @property
    def strength(self) -> int:
        return 100 * len(self.words) + 10 * len(self.pairs) + len(self.piece)

    def held(self, text: Held) -> bool:
        return self.words <= text.words and self.pairs <= text.pairs and self.piece in text.text


def _strongest(spelt: set[str] | None, needs: list[frozenset[str]]) -> frozenset[str] | None:
    candidates = [*needs, *([frozenset(spelt)] if spelt is not None else [])]
    usable = [c for c in candidates if all(s.replace(EDGE, "") for s in c)]
    return max(usable, key=lambda c: (min(_Check.of(s).strength for s in c), -len(c)), default=None)


#: A requirement with more checks than this of pieces alone (no whole word to look up) is
#: not checked: the substring searches would cost more than the regex.
MOST_PIECES = 16


@dataclass(frozen=True)
class _Choice:
    """Checks one of which passes on any text the pattern matches in, indexed by a whole
    word each needs (one set intersection finds the few worth checking)."""

    by_word: dict[str, tuple[_Check, ...]]
    pieces: tuple[_Check, ...]

    @cached_property
    def words(self) -> frozenset[str]:
        """The words that index the checks (a set: intersected with a text's words, the
        smaller of the two is walked)."""
        return frozenset(self.by_word)

    @classmethod
    def of(cls, strings: frozenset[str]) -> _Choice | None:
        checks = {_Check.of(s) for s in strings}
        pieces = tuple(c for c in checks if not c.words)
        if len(pieces) > MOST_PIECES:
            return None
        by_word: dict[str, list[_Check]] = {}
        for check in checks - set(pieces):
            by_word.setdefault(max(check.words, key=len), []).append(check)
        return cls({w: tuple(c) for w, c in by_word.items()}, pieces)

    @property
    def strength(self) -> int:
        return min(c.strength for cs in (*self.by_word.values(), self.pieces) for c in cs)

    def held(self, text: Held) -> bool:
        indexed = (c for w in self.words & text.words for c in self.by_word[w])
        return any(c.held(text) for c in indexed) or any(c.held(text) for c in self.pieces)


def requirements(source: str, flags: int = 0) -> tuple[_Choice, ...]:
    """What every match of ``source`` holds: each a choice of checks, one of which passes
    on any text the pattern matches in (the strongest few; none when nothing is known,
    and then the pattern always runs)."""
    tree = sre_parse.parse(source, flags)
    if tree.state.flags & sc.SRE_FLAG_IGNORECASE:
        return ()
    spelt, needs = _sequence(list(tree.data))
    candidates = {*needs, *([frozenset(spelt)] if spelt is not None else [])}
    choices = [
        choice
        for strings in candidates
        if all(s.replace(EDGE, "") for s in strings) and (choice := _Choice.of(strings))
    ]
    choices.sort(key=lambda choice: -choice.strength)
    return tuple(choices[:MOST_REQUIREMENTS])


@dataclass(frozen=True)
class Held:
    """A text's words and neighbouring word pairs, read once for every pattern."""

    text: str
    words: frozenset[str]
    pairs: frozenset[tuple[str, str]]


@lru_cache(maxsize=32)
def held(text: str) -> Held:
    words = _WORD.findall(text)
    return Held(text, frozenset(words), frozenset(itertools.pairwise(words)))


class Pattern:
    """A regex compiled when first used, run only where :func:`requirements` are held.
    ``source`` may be a function giving it, when building it costs time too. With
    ``starts`` (a function giving, in order, every place in a text where a match can
    begin, such as :meth:`afterthought.phrases.Index.starts_of`), the regex is tried only
    at those places; it must match no empty string."""

    def __init__(
        self,
        source: str | Callable[[], str],
        flags: int = 0,
        *,
        starts: Callable[[str], list[int]] | None = None,
    ) -> None:
        self._source = source
        self._flags = flags
        self._starts = starts

    @cached_property
    def pattern(self) -> str:
        return self._source if isinstance(self._source, str) else self._source()

    @cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern, self._flags)

    @cached_property
    def requirements(self) -> tuple[_Choice, ...]:
        """What every match holds (:func:`requirements`)."""
        return requirements(self.pattern, self._flags)

    def prepare(self) -> None:
        """Compile the regex and read its requirements now rather than on first use."""
        _ = self.compiled, self.requirements

    def possible(self, text: str) -> bool:
        """Whether ``text`` holds what every match holds (False: it cannot match)."""
        if self._starts is not None:
            return bool(self._starts(text))
        if not self.requirements:
            return True
        seen = held(text)
        return all(choice.held(seen) for choice in self.requirements)

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> re.Match[str] | None:
        if self._starts is not None:
            return next(self._anchored(text, pos, endpos), None)
        # Read only up to endpos: there the text ends for the regex, words included.
        if not self.possible(text if endpos is None else text[:endpos]):
            return None
        return self.compiled.search(text, pos, len(text) if endpos is None else endpos)

    def _anchored(
        self, text: str, pos: int = 0, endpos: int | None = None
    ) -> Iterator[re.Match[str]]:
        """The matches :meth:`finditer` finds from ``pos``, each tried only where
        ``starts`` says one can begin: from each place the search would reach next."""
        assert self._starts is not None
        end = len(text) if endpos is None else endpos
        match = self.compiled.match
        after = pos
        for at in self._starts(text if endpos is None else text[:endpos]):
            if at >= after and (found := match(text, at, end)) is not None:
                yield found
                after = found.end()

    def match(self, text: str) -> re.Match[str] | None:
        return self.compiled.match(text) if self.possible(text) else None

    def fullmatch(self, text: str) -> re.Match[str] | None:
        return self.compiled.fullmatch(text) if self.possible(text) else None

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if self._starts is not None:
            return self._anchored(text)
        return self.compiled.finditer(text) if self.possible(text) else iter(())

    def findall(self, text: str) -> list[Any]:
        return self.compiled.findall(text) if self.possible(text) else []

    def sub(self, repl: str | Callable[[re.Match[str]], str], text: str) -> str:
        return self.compiled.sub(repl, text) if self.possible(text) else text


def alternatives(source: str) -> list[str]:
    """The branches of a regex that is an alternation at its top level (``a|b`` gives
    ``a`` and ``b``), else the regex itself. Some branch matches a text exactly where the
    whole does, and each branch has requirements of its own, stronger than theirs in
    common."""
    parts: list[str] = []
    depth, begin, i, in_class = 0, 0, 0, False
    while i < len(source):
        char = source[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 2 if source[i + 1 : i + 2] == "^" else 1
            if source[i : i + 1] == "]":  # first in a class, "]" is one of its characters
                i += 1
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(source[begin:i])
            begin = i + 1
        i += 1
    parts.append(source[begin:])
    return parts


class PatternSet:
    """Patterns asked together whether any of them matches a text: a text's words name
    the few that can (an index from a word every match of a pattern holds to the
    pattern), and only those are tried."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns

    def __iter__(self) -> Iterator[Pattern]:
        return iter(self.patterns)

    @cached_property
    def _index(self) -> tuple[dict[str, list[tuple[int, int]]], list[int], list[int]]:
        """A word to the requirements (pattern, its number among those indexed) it meets;
        each pattern's count of requirements indexed (those of whole words alone); the
        patterns with none, always tried."""
        by_word: dict[str, list[tuple[int, int]]] = {}
        gates: list[int] = []
        always: list[int] = []
        for number, pattern in enumerate(self.patterns):
            words = [c.words for c in pattern.requirements if not c.pieces]
            gates.append(len(words))
            if not words:
                always.append(number)
            for gate, choice in enumerate(words):
                for word in choice:
                    by_word.setdefault(word, []).append((number, gate))
        return by_word, gates, always

    def prepare(self) -> None:
        """Prepare every pattern and the index now rather than on first use."""
        for pattern in self.patterns:
            pattern.prepare()
        _ = self._index

    def search(self, text: str) -> bool:
        """Whether any of the patterns matches in ``text``."""
        by_word, gates, always = self._index
        met = set().union(*(by_word[w] for w in held(text).words & by_word.keys()))
        counts = Counter(number for number, _ in met)
        candidates = [n for n, count in counts.items() if count == gates[n]] + always
        return any(self.patterns[number].search(text) for number in sorted(candidates))
