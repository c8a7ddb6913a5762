"""Lexicon phrases as regexes, and every concept's phrases found in one walk of a text.

A concept (:mod:`afterthought.lexicon`: "you", the order verbs, "from now on", ...) is a
set of normalised phrases. :func:`regex` writes it as one alternation, which is what the
checks match. Tried at every character, those alternations cost more than the rest of the
screen: each holds hundreds of phrases, and there are a dozen. :class:`Index` holds every
concept's phrases in one trie per start condition and walks it from each place a phrase
could start, once per text, so it knows for every concept where its regex can match;
:class:`afterthought.prefilter.Pattern` then runs the regex only there (the regex has the
last word: the walk only says where to look)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property, lru_cache
from typing import Any

#: The letters of the alphabets written with a space between words, as the view holds them
#: (Latin, Greek, Cyrillic, Armenian, Georgian; the Indic scripts with their vowel signs):
#: a capital Cyrillic or Greek letter folds to Latin ("Мой" reads "moй"), so a word may
#: mix them.
LETTERS = "a-z0-9\u00c0-\u024f\u0370-\u058f\u0900-\u0dff\u10a0-\u10ff"
_SPACED_LETTER = re.compile(f"[{LETTERS}]")
#: Where a phrase may start: anywhere (Chinese, Japanese and Thai have no spaces, Arabic
#: and Hebrew write "and" and "the" onto the word), or, in a spaced alphabet, at a word's
#: start: not inside a word, nor right after a French "j'", "n'", "t'" (whose verb follows:
#: "j'ai" holds no "AI", "j'ignore" no order to ignore).
ANYWHERE = ""
WORD_START = rf"(?<![{LETTERS}])(?<!(?<![{LETTERS}])[jnt]')"
#: A short phrase of a spaced alphabet ends at a word's end ("ne" must not be "next", "вы"
#: not "выход", "हम" not "हमेशा"); one that ends in an apostrophe ("j'") runs into its word.
WORD_END = rf"(?![{LETTERS}])"


def bounds(phrase: str) -> tuple[str, str]:
    """How a phrase may start and end in a match, as regex look-arounds."""
    if not _SPACED_LETTER.match(phrase):
        return ANYWHERE, ""
    short = len(phrase) <= 3 and _SPACED_LETTER.match(phrase[-1]) is not None
    return WORD_START, WORD_END if short else ""


#: A trie of phrases: a character to the rest; :data:`_END` to the ways a phrase may end.
_Trie = dict[str, "_Trie"]
_END = "\0"
_LOOP = "\1"


def _tries(phrases: Iterable[str]) -> dict[str, _Trie]:
    tries: dict[str, _Trie] = {}
    for phrase in phrases:
        start, end = bounds(phrase)
        node = tries.setdefault(start, {})
        for char in phrase:
            node = node.setdefault(char, {})
        node.setdefault(_END, {})[end] = {}
    return tries


def regex(phrases: Iterable[str]) -> str:
    """The phrases (normalised, single-spaced) as one regex alternation: they share one
    trie per start condition, so a match costs a walk down it, not a try of every phrase;
    a space inside a phrase matches any spacing, none included."""
    tries = _tries(phrases)
    return "|".join(start + _alternation(trie) for start, trie in sorted(tries.items()))


def _alternation(trie: _Trie) -> str:
    """The trie as a regex: longer phrases tried before the shorter ones they extend."""
    branches = [
        (r"\s*" if char == " " else re.escape(char)) + _alternation(rest)
        for char, rest in sorted(trie.items())
        if char != _END
    ]
    if _END in trie:  # a phrase that may end anywhere makes its word-end twin moot
        branches.append("" if "" in trie[_END] else next(iter(trie[_END])))
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


#: A node of :class:`Index`'s tries: a character to the next node; :data:`_END` to the
#: concepts a phrase ends here for (those it may end anywhere for, and those it ends only
#: at a word's end for); :data:`_LOOP` marks where a space in a phrase was (any spacing
#: matches it, none included).
_Node = dict[str, Any]


#: How many characters of a phrase the opening scan (in C) checks before the walk (in
#: Python) reads on: most places where a phrase's first letter stands start none.
OPENING = 4


def _head(trie: _Trie, depth: int) -> _Trie:
    """The trie cut ``depth`` characters deep, each cut a phrase's end (of any kind)."""
    if depth == 0:
        return {_END: {"": {}}}
    head = {char: _head(rest, depth - 1) for char, rest in trie.items() if char != _END}
    if _END in trie:
        head[_END] = {"": {}}
    return head


class Index:
    """Every concept's phrases (``concepts`` gives them, called once on first use), and
    for a text the places where each concept's :func:`regex` can match."""

    def __init__(self, concepts: Callable[[], Mapping[str, Iterable[str]]]) -> None:
        self._concepts = concepts

    @cached_property
    def _phrases(self) -> dict[str, frozenset[str]]:
        return {name: frozenset(phrases) for name, phrases in self._concepts().items()}

    @cached_property
    def tries(self) -> dict[str, _Node]:
        """One trie per start condition, of every concept's phrases."""
        tries: dict[str, _Node] = {}
        for name, phrases in self._phrases.items():
            for phrase in phrases:
                start, end = bounds(phrase)
                node = tries.setdefault(start, {})
                for char in phrase:
                    node = node.setdefault(char, {_LOOP: True} if char == " " else {})
                node.setdefault(_END, {}).setdefault(name, set()).add(end)
        # A phrase that may end anywhere makes its word-end twin moot: each end is the
        # concepts ended anywhere, and those ended only at a word's end.
        stack = list(tries.values())
        while stack:
            node = stack.pop()
            if (ends := node.get(_END)) is not None:
                node[_END] = (
                    frozenset(n for n, how in ends.items() if "" in how),
                    frozenset(n for n, how in ends.items() if "" not in how),
                )
            stack.extend(child for char, child in node.items() if char not in (_END, _LOOP))
        return tries

    @cached_property
    def openings(self) -> list[tuple[re.Pattern[str], _Node]]:
        """For each trie, where a phrase of it can start: its first :data:`OPENING`
        characters, after what its start allows (a look-ahead: every such place is found,
        overlapping or not)."""
        tries = _tries(p for phrases in self._phrases.values() for p in phrases)
        openings = []
        for start, trie in sorted(tries.items()):
            head = _head(trie, OPENING)
            # The regex tries a trie's branches one by one: a character class first skips
            # those of the other scripts (hundreds) at once.
            parts = [
                f"(?={script}){_alternation(part)}"
                for script in (r"[\x00-\x7f]", r"[^\x00-\x7f]")
                if (part := {c: rest for c, rest in head.items() if re.match(script, c)})
            ]
            openings.append((re.compile(f"{start}(?=(?:{'|'.join(parts)}))"), self.tries[start]))
        return openings

    def prepare(self) -> None:
        """Build the tries and the opening scans now rather than on first use."""
        _ = self.tries, self.openings

    def starts(self, text: str) -> dict[str, list[int]]:
        """For each concept with a phrase in ``text``, the places (in order) where its
        regex matches when tried there."""
        return _starts(self, text)

    def starts_of(self, name: str) -> Callable[[str], list[int]]:
        """:meth:`starts` of one concept."""
        return lambda text: self.starts(text).get(name, [])


def _walk(trie: _Node, text: str, at: int) -> set[str]:
    """The concepts one of whose phrases in ``trie`` matches ``text`` from ``at``: every
    path through the trie is followed at once (a space in a phrase reads as ``\\s*``)."""
    matched: set[str] = set()
    states = [trie]
    i, end = at, len(text)
    while states:
        following = text[i] if i < end else ""
        for node in states:
            if (ends := node.get(_END)) is not None:
                matched |= ends[0]
                if not _SPACED_LETTER.match(following):
                    matched |= ends[1]
        if not following:
            break
        space = following.isspace()
        nxt = []
        for node in states:
            if space and _LOOP in node:
                nxt.append(node)
            if (child := node.get(following)) is not None:
                nxt.append(child)
                if (gap := child.get(" ")) is not None:
                    nxt.append(gap)
        states = nxt
        i += 1
    return matched


@lru_cache(maxsize=16)
def _starts(index: Index, text: str) -> dict[str, list[int]]:
    found: dict[str, set[int]] = {}
    for opening, trie in index.openings:
        for at in opening.finditer(text):
            for name in _walk(trie, text, at.start()):
                found.setdefault(name, set()).add(at.start())
    return {name: sorted(places) for name, places in found.items()}
