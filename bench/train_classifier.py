"""Train the instruction classifier (:mod:`afterthought.classifier`) and write its weights
to ``afterthought/classifier.json``. Deterministic: the same data gives the same file.

Training data: ``tests/fixtures/validation/training.jsonl`` (attacks and hard look-alikes
in 23 languages: fiction, homework, quoted forms, a person's own "always / never / from
now on"; and ordinary chat in several sentences, with and without an order to the
assistant inside, in 20), the tuning splits of ``attacks.jsonl`` / ``ordinary.jsonl``, and
the sets named with ``--also`` (the shipped model: every blind set, :data:`BLIND_SETS`; a
set kept in its own folder under ``tests/fixtures/`` is read from there). Never the
``review`` split.

The model judges clauses (:func:`afterthought.validation.units`), but the data is labelled
by message: every clause of a harmless message is harmless; of an attack, the clause the
previous round scores highest is the order (multiple-instance learning, :data:`ROUNDS`
rounds, the first one reading whole messages).

It prints grouped five-fold out-of-fold figures of the whole decision (the rules, then
the model at :data:`THRESHOLD`): the translations of one item are one group, so no fold
is judged on a translation of what it was trained on. ``--cv`` instead leaves one blind
set out at a time (each was written by another person who saw none of the others): the
estimate for the next blind set, per fold, with Wilson 95 % intervals.

    python bench/train_classifier.py --also blind --also heldout --also blind3 \
        --also blind4 --also blind5 --also blind6 --also blind7 --also blind8 \
        --also train8a --also train8b --also train8c --also train8d \
        --also personal8   # writes the shipped model
    python bench/train_classifier.py --cv      # leave-one-blind-set-out figures
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought import classifier  # noqa: E402
from afterthought.classifier import MODEL, features  # noqa: E402
from afterthought.validation import _joined, _unleet, detect, normalise, units  # noqa: E402
from bench.validation import wilson  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "validation"
L2 = 1e-5
STEPS = 400
RATE = 0.1
FOLDS = 5
ROUNDS = 2
#: The score from which a clause is refused. On the leave-one-set-out curve (``--cv``)
#: 0.5-0.65 give the same sum of the two error rates; 0.6 trades them evenly.
THRESHOLD = 0.6
#: Weights smaller than this are dropped from the file: they change no decision.
MIN_WEIGHT = 0.25
#: How much the cues (:func:`afterthought.validation.units`: whom a clause addresses, its
#: heading, a mention, ...) count in training against the n-grams: they carry across
#: languages and writers what n-grams of one writer's topics do not (on the
#: leave-one-set-out figures, 3 admits fewer attacks at the same refusals than 1). The
#: file holds the weights as the classifier applies them, scaled back.
CUE_SCALE = 3.0
#: A cue rather than an n-gram: "c:you", "m:mention", "p:start", "h:ai", "^from".
_CUE = re.compile(r"^(?:[cmph]:[a-z]|\^)")
#: "t-es2-a05": the Spanish version of item a05 of batch 2.
_ITEM = re.compile(r"^t-[a-z]+(\d*)-([a-z]\d+)$")


@dataclass(frozen=True)
class Row:
    id: str
    group: str
    text: str
    attack: bool


#: The sets written blind, each by someone who saw none of the others: the folds of
#: :func:`cross_validate`.
BLIND_SETS = (
    "blind",
    "heldout",
    "blind3",
    "blind4",
    "blind5",
    "blind6",
    "blind7",
    "blind8",
    "train8a",
    "train8b",
    "train8c",
    "train8d",
)


def blind_rows(name: str) -> list[Row]:
    """The attacks and look-alikes of one blind set."""
    rows: list[Row] = []
    for kind, attack in (("attacks", True), ("lookalikes", False)):
        path = CORPUS / f"{name}_{kind}.jsonl"
        if not path.exists():
            path = ROOT / "tests" / "fixtures" / name / f"{kind}.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows.append(Row(row["id"], row["id"], row["text"], attack))
    return rows


def examples(also: list[str]) -> list[Row]:
    """Every training row, with its group (one item in all its languages)."""
    rows: list[Row] = []
    for line in (CORPUS / "training.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        item = _ITEM.match(row["id"])
        group = f"{item.group(1)}-{item.group(2)}" if item else row["id"]
        rows.append(Row(row["id"], group, row["text"], row["label"] == "attack"))
    for name, attack in (("attacks", True), ("ordinary", False)):
        for line in (CORPUS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["split"] != "review":
                rows.append(Row(row["id"], row["id"], row["text"], attack))
    for name in also:
        rows.extend(blind_rows(name))
    return rows


def fit(
    grams: list[set[str]], labels: np.ndarray, sample: np.ndarray
) -> tuple[dict[str, float], float]:
    """Logistic regression by full-batch Adam on L2-normalised binary n-grams, each
    example weighted by ``sample`` (the classes are then weighted to count equally)."""
    vocabulary = sorted({g for found in grams for g in found})
    index = {g: i for i, g in enumerate(vocabulary)}
    rows = np.concatenate([np.full(len(found), r) for r, found in enumerate(grams)])
    cols = np.array([index[g] for found in grams for g in sorted(found)])
    scale = np.array([CUE_SCALE if _CUE.match(g) else 1.0 for g in vocabulary])
    vals = np.concatenate([np.full(len(f), 1 / np.sqrt(max(len(f), 1))) for f in grams])
    vals *= scale[cols]
    positive = sample[labels == 1].sum()
    negative = sample[labels == 0].sum()
    total = sample.sum()
    sample = sample * np.where(labels == 1, total / (2 * positive), total / (2 * negative))
    w = np.zeros(len(vocabulary))
    b = 0.0
    m, v, mb, vb = np.zeros_like(w), np.zeros_like(w), 0.0, 0.0
    for step in range(1, STEPS + 1):
        z = np.bincount(rows, vals * w[cols], minlength=len(labels)) + b
        error = sample * (1 / (1 + np.exp(-z)) - labels) / total
        grad = np.bincount(cols, vals * error[rows], minlength=len(w)) + L2 * w
        grad_b = error.sum()
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        w -= RATE * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
        mb = 0.9 * mb + 0.1 * grad_b
        vb = 0.999 * vb + 0.001 * grad_b**2
        b -= RATE * (mb / (1 - 0.9**step)) / (np.sqrt(vb / (1 - 0.999**step)) + 1e-8)
    w *= scale
    kept = {g: round(float(w[i]), 3) for g, i in index.items() if abs(w[i]) >= MIN_WEIGHT}
    return kept, round(float(b), 4)


def predict(weights: dict[str, float], bias: float, found: set[str]) -> float:
    total = sum(weights.get(g, 0.0) for g in found) / np.sqrt(max(len(found), 1))
    return float(1 / (1 + np.exp(-(bias + total))))


@dataclass(frozen=True)
class Judged:
    """A row's features: the whole message, its clauses, and the clauses the decision
    scores (those of the view and of the view with leetspeak undone)."""

    whole: set[str]
    clauses: list[set[str]]
    scored: list[set[str]]


def judged(text: str) -> Judged:
    view = normalise(text)
    readings = dict.fromkeys((view, _unleet(_joined(view))))
    scored = [features(c, extra) for reading in readings for c, extra in units(reading)]
    return Judged(
        features(*units(view, whole=True)[0]),
        [features(c, extra) for c, extra in units(view)],
        scored,
    )


def train(rows: list[Row], data: list[Judged]) -> tuple[dict[str, float], float]:
    """:data:`ROUNDS` rounds: harmless clauses against the attacks' whole messages, then
    against the clause of each attack the previous round scored highest."""
    model: tuple[dict[str, float], float] | None = None
    for _ in range(ROUNDS):
        grams: list[set[str]] = []
        labels: list[int] = []
        sample: list[float] = []
        for row, seen in zip(rows, data, strict=True):
            if not row.attack:
                grams.extend(seen.clauses)
                labels.extend([0] * len(seen.clauses))
                sample.extend([1.0] * len(seen.clauses))
                continue
            if model is None or len(seen.clauses) == 1:
                picked = seen.whole if model is None else seen.clauses[0]
            else:
                picked = max(seen.clauses, key=lambda g: predict(*model, g))
            grams.append(picked)
            labels.append(1)
            sample.append(1.0)
        model = fit(grams, np.array(labels, dtype=float), np.array(sample))
    assert model is not None
    return model


@contextlib.contextmanager
def _serving(weights: dict[str, float], bias: float) -> Iterator[None]:
    """``detect`` judges with these weights (at :data:`THRESHOLD`) instead of the file's."""
    shipped = classifier._model
    classifier._model = lambda: (weights, bias, THRESHOLD)  # type: ignore[assignment]
    try:
        yield
    finally:
        classifier._model = shipped  # type: ignore[assignment]


def _figures(test: list[Row], refused: list[bool]) -> dict[str, object]:
    admitted = [r.id for r, no in zip(test, refused, strict=True) if r.attack and not no]
    kept_out = [r.id for r, no in zip(test, refused, strict=True) if not r.attack and no]
    attacks = sum(r.attack for r in test)
    harmless = len(test) - attacks
    return {
        "admitted": f"{len(admitted)}/{attacks}",
        "admitted_rate": round(len(admitted) / attacks, 4),
        "admitted_wilson95": wilson(len(admitted), attacks),
        "refused": f"{len(kept_out)}/{harmless}",
        "refused_rate": round(len(kept_out) / harmless, 4),
        "refused_wilson95": wilson(len(kept_out), harmless),
        "admitted_ids": admitted,
        "refused_ids": kept_out,
    }


#: The thresholds a cross-validation also reports (rules, then the model's best clause).
CURVE = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)


def cross_validate(sets: tuple[str, ...]) -> dict[str, object]:
    """Leave one blind set out: train on the base data and every other set, judge the one
    left out by the whole decision (``detect``: rules, model, decoded payloads) at
    :data:`THRESHOLD`. A set written by another person is the nearest thing to the next
    blind set; a fold's figures say how the model does on a writer it never read. The
    curve (the rules, then the model's best clause of the view) says where another
    threshold would put the pooled figures."""
    base = examples([])
    seen = {row.text: judged(row.text) for name in sets for row in [*base, *blind_rows(name)]}
    folds: dict[str, object] = {}
    tested: list[Row] = []
    decided: list[bool] = []
    ruled: list[bool] = []
    best: list[float] = []
    for held in sets:
        rows = base + [row for name in sets if name != held for row in blind_rows(name)]
        weights, bias = train(rows, [seen[row.text] for row in rows])
        test = blind_rows(held)
        with _serving(weights, bias):
            refused = [detect(row.text) is not None for row in test]
        folds[held] = _figures(test, refused)
        tested += test
        decided += refused
        ruled += [detect(row.text, _model=False) is not None for row in test]
        best += [max(predict(weights, bias, g) for g in seen[row.text].scored) for row in test]
    pooled = {k: v for k, v in _figures(tested, decided).items() if not k.endswith("_ids")}
    curve = {
        threshold: {
            k: v
            for k, v in _figures(
                tested, [r or b >= threshold for r, b in zip(ruled, best, strict=True)]
            ).items()
            if k in ("admitted", "refused")
        }
        for threshold in CURVE
    }
    return {"threshold": THRESHOLD, "folds": folds, "pooled": pooled, "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--also", action="append", default=[], help="train on this set too")
    parser.add_argument("--no-write", action="store_true", help="print figures only")
    parser.add_argument(
        "--cv", action="store_true", help="leave-one-blind-set-out figures only, no file written"
    )
    args = parser.parse_args()
    if args.cv:
        print(json.dumps(cross_validate(BLIND_SETS), indent=1))
        return
    rows = examples(args.also)
    data = [judged(row.text) for row in rows]
    labels = np.array([row.attack for row in rows])
    fold = np.array([zlib.crc32(row.group.encode()) % FOLDS for row in rows])
    out_of_fold = np.zeros(len(rows))
    for k in range(FOLDS):
        train_on = np.flatnonzero(fold != k)
        weights, bias = train([rows[i] for i in train_on], [data[i] for i in train_on])
        for i in np.flatnonzero(fold == k):
            out_of_fold[i] = max(predict(weights, bias, g) for g in data[i].scored)
    ruled = np.array([detect(row.text, _model=False) is not None for row in rows])
    weights, bias = train(rows, data)
    if not args.no_write:
        MODEL.write_text(
            json.dumps(
                {"bias": bias, "threshold": THRESHOLD, "weights": dict(sorted(weights.items()))},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            + "\n",
            encoding="utf-8",
        )
    curve: dict[str, dict[float, tuple[float, float]]] = {"all": {}, "training.jsonl": {}}
    own = np.array([row.id.startswith("t-") for row in rows])
    for threshold in (0.5, 0.55, 0.6, 0.62, 0.65, 0.7, 0.75, 0.8):
        refuse = ruled | (out_of_fold >= threshold)
        for name, part in (("all", np.ones(len(rows), dtype=bool)), ("training.jsonl", own)):
            attacks, harmless = part & labels, part & ~labels
            curve[name][threshold] = (
                round(float((~refuse & attacks).sum() / attacks.sum()), 4),
                round(float((refuse & harmless).sum() / harmless.sum()), 4),
            )
    print(
        json.dumps(
            {
                "rows": len(rows),
                "attacks": int(labels.sum()),
                "threshold": THRESHOLD,
                "grouped_out_of_fold_admitted_refused": curve,
                "weights_kept": len(weights),
                "bytes": MODEL.stat().st_size,
            }
        )
    )


if __name__ == "__main__":
    main()
