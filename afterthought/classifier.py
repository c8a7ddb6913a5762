"""A small multilingual classifier of instruction-like text: how much a clause reads as
an order to the assistant rather than something a person says about their life.

The rules of :mod:`afterthought.validation` catch what they can name (markup, encoded
payloads, the English phrasings); this model scores the rest, in any language, one clause
at a time (:func:`afterthought.validation.units`: an order hidden after small talk is not
diluted by it), from the clause's normalised view (look-alikes folded, accents and
invisible characters dropped): character 2- to 4-grams, which need no word boundaries
(Chinese, Japanese, Thai) and see through inflection, word 1- and 2-grams, and the cues
the validation reads from its lexicon (whom the clause addresses, an order verb, "from now
on", a quotation, ...), which carry across languages what n-grams cannot. A logistic
regression over them, trained by ``bench/train_classifier.py``; its weights ship in
``classifier.json`` beside this module (no download, no dependency, pure Python: a few
dictionary look-ups per character)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

MODEL = Path(__file__).with_name("classifier.json")
#: Character n-gram sizes, and at most this many characters read (a long paste is judged
#: by its start and end; the rules read all of it).
CHAR_SIZES = (2, 3, 4)
MAX_CHARS = 600

_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"\w+")


def features(view: str, extra: Iterable[str] = ()) -> set[str]:
    """The n-grams of a normalised view (:func:`afterthought.validation.normalise`):
    character n-grams of its collapsed spacing, prefixed ``w:`` for words; with ``extra``
    (the cues :func:`afterthought.validation.cues` reads)."""
    text = _SPACES.sub(" ", view).strip()
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS // 2] + " " + text[-MAX_CHARS // 2 :]
    padded = f" {text} "
    # Each size's n-grams are the smaller size's extended by one character, joined in C
    # (a slice per n-gram costs twice as much); added in the same order as size by size.
    grams: set[str] = set()
    sized: list[str] = list(padded)
    for n in range(2, CHAR_SIZES[-1] + 1):
        sized = list(map(str.__add__, sized, padded[n - 1 :]))
        if n in CHAR_SIZES:
            grams.update(sized)
    words = _WORD.findall(text)
    grams.update(["w:" + w for w in words])
    grams.update(map("w:{} {}".format, words, words[1:]))
    grams.update(extra)
    return grams


@cache
def _model() -> tuple[dict[str, float], float, float]:
    data = json.loads(MODEL.read_text(encoding="utf-8"))
    return data["weights"], float(data["bias"]), float(data["threshold"])


def score(view: str, extra: Iterable[str] = ()) -> float:
    """The probability the model gives that ``view`` (with its cues ``extra``) is an order
    to the assistant.
    Weights are summed over the n-grams present and scaled by the square root of their
    number, so a long statement is not more suspect for being long."""
    weights, bias, _ = _model()
    grams = features(view, extra)
    if not grams:
        return 0.0
    # Most n-grams have no weight: skipped in C (adding 0.0 would change no sum).
    total = sum(filter(None, map(weights.get, grams))) / math.sqrt(len(grams))
    return 1.0 / (1.0 + math.exp(-(bias + total)))


def threshold() -> float:
    """The score from which a statement is refused (chosen by the training script)."""
    return _model()[2]
