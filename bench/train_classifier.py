"""Train the instruction classifier (:mod:`afterthought.classifier`) and write its weights
to ``afterthought/classifier.json``. Deterministic: the same data gives the same file.

Training data: ``tests/fixtures/validation/training.jsonl`` (attacks and hard look-alikes
in 23 languages: fiction, homework, quoted forms, a person's own "always / never / from
now on") and the tuning splits of ``attacks.jsonl`` / ``ordinary.jsonl``. Never the
``review`` split nor the ``heldout_*`` / ``blind_*`` sets: those measure it.

It prints five-fold out-of-fold figures of the whole decision (the rules, then the model
at :data:`THRESHOLD`) on the training data.

    python bench/train_classifier.py            # writes the model, prints its figures
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.classifier import MODEL, features  # noqa: E402
from afterthought.validation import detect, normalise  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "validation"
L2 = 1e-5
STEPS = 400
RATE = 0.1
FOLDS = 5
#: The score from which a statement is refused. Chosen on the validation sets
#: (``blind_*``, ``heldout_*``: 0.61-0.63 trade their two errors evenly), so their figures
#: are not blind; the out-of-fold figures printed are the training data's own.
THRESHOLD = 0.62
#: Weights smaller than this are dropped from the file: they change no decision.
MIN_WEIGHT = 0.25


def examples() -> list[tuple[str, str, int]]:
    """(id, text, 1 for an order to the assistant) for every training row."""
    rows: list[tuple[str, str, int]] = []
    for line in (CORPUS / "training.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.append((row["id"], row["text"], int(row["label"] == "attack")))
    for name, label in (("attacks", 1), ("ordinary", 0)):
        for line in (CORPUS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["split"] != "review":
                rows.append((row["id"], row["text"], label))
    return rows


def fit(grams: list[set[str]], labels: np.ndarray) -> tuple[dict[str, float], float]:
    """Logistic regression by full-batch Adam on L2-normalised binary n-grams, classes
    weighted to count equally."""
    vocabulary = sorted({g for found in grams for g in found})
    index = {g: i for i, g in enumerate(vocabulary)}
    rows = np.concatenate([np.full(len(found), r) for r, found in enumerate(grams)])
    cols = np.array([index[g] for found in grams for g in sorted(found)])
    vals = np.concatenate([np.full(len(f), 1 / np.sqrt(max(len(f), 1))) for f in grams])
    positives = labels.sum()
    sample = np.where(
        labels == 1, len(labels) / (2 * positives), len(labels) / (2 * (len(labels) - positives))
    )
    w = np.zeros(len(vocabulary))
    b = 0.0
    m, v, mb, vb = np.zeros_like(w), np.zeros_like(w), 0.0, 0.0
    for step in range(1, STEPS + 1):
        z = np.bincount(rows, vals * w[cols], minlength=len(labels)) + b
        error = sample * (1 / (1 + np.exp(-z)) - labels) / len(labels)
        grad = np.bincount(cols, vals * error[rows], minlength=len(w)) + L2 * w
        grad_b = error.sum()
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        w -= RATE * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
        mb = 0.9 * mb + 0.1 * grad_b
        vb = 0.999 * vb + 0.001 * grad_b**2
        b -= RATE * (mb / (1 - 0.9**step)) / (np.sqrt(vb / (1 - 0.999**step)) + 1e-8)
    kept = {g: round(float(w[i]), 3) for g, i in index.items() if abs(w[i]) >= MIN_WEIGHT}
    return kept, round(float(b), 4)


def predict(weights: dict[str, float], bias: float, found: set[str]) -> float:
    total = sum(weights.get(g, 0.0) for g in found) / np.sqrt(max(len(found), 1))
    return float(1 / (1 + np.exp(-(bias + total))))


def main() -> None:
    rows = examples()
    grams = [features(normalise(text)) for _, text, _ in rows]
    labels = np.array([label for _, _, label in rows], dtype=float)
    fold = np.array([zlib.crc32(row_id.encode()) % FOLDS for row_id, _, _ in rows])
    out_of_fold = np.zeros(len(rows))
    for k in range(FOLDS):
        train = np.flatnonzero(fold != k)
        weights, bias = fit([grams[i] for i in train], labels[train])
        for i in np.flatnonzero(fold == k):
            out_of_fold[i] = predict(weights, bias, grams[i])
    ruled = np.array([detect(text, _model=False) is not None for _, text, _ in rows])
    threshold = THRESHOLD
    weights, bias = fit(grams, labels)
    MODEL.write_text(
        json.dumps(
            {"bias": bias, "threshold": threshold, "weights": dict(sorted(weights.items()))},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        + "\n",
        encoding="utf-8",
    )
    refuse = ruled | (out_of_fold >= threshold)
    missed = int((~refuse & (labels == 1)).sum())
    refused = int((refuse & (labels == 0)).sum())
    print(
        json.dumps(
            {
                "rows": len(rows),
                "attacks": int(labels.sum()),
                "threshold": threshold,
                "out_of_fold_with_rules_attacks_admitted": missed,
                "out_of_fold_with_rules_harmless_refused": refused,
                "weights_kept": len(weights),
                "bytes": MODEL.stat().st_size,
            }
        )
    )


if __name__ == "__main__":
    main()
