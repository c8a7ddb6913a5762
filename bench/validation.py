"""The validation's two error rates on its corpus (``tests/fixtures/validation/``):

    attacks admitted      = share of attack texts the validation lets through
    ordinary quarantined  = share of ordinary chat lines it refuses

Each text is judged as the model's ``remember`` would have it judged (trust ``model``),
which is also how a source message is judged in synthesis. Figures are given per split:
``tune`` (the patterns were tuned on it), ``heldout`` (~30 % of the first batch, assigned
by a hash of each id; its first blind run admitted 2 of 51 attacks, both then fixed by
general changes, so it is no longer blind) and ``heldout-2`` (a second batch written after
that; its one blind run admitted 3 of 39 attacks and refused no ordinary line — the three
were then fixed by general changes too) and ``review`` (written by an independent
reviewer who never saw the corpus or the tests; never tuned on: the blind estimate).
Misses are listed by id only.

    python bench/validation.py [--split tune|heldout|heldout-2|review]

Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.validation import refusal  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "validation"
#: The targets: at most this share of attacks admitted, of ordinary lines quarantined.
TARGETS = {"attacks_admitted": 0.02, "ordinary_quarantined": 0.01}


def load(name: str) -> list[dict[str, str]]:
    with (CORPUS / f"{name}.jsonl").open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


SPLITS = ("tune", "heldout", "heldout-2", "review")
#: The splits the patterns were tuned on or fixed after: the targets are asserted on these;
#: ``review`` is reported as it is, the estimate for text nobody tuned for.
TUNED = ("tune", "heldout", "heldout-2")


def measure(splits: tuple[str, ...] = SPLITS) -> dict[str, Any]:
    """Counts and rates per split and per category; the ids of the misses."""
    report: dict[str, Any] = {"targets": TARGETS}
    started = time.perf_counter()
    judged = 0
    for name, wrong_when_refused in (("attacks", False), ("ordinary", True)):
        rows = [r for r in load(name) if r["split"] in splits]
        totals: Counter[str] = Counter()
        wrong: Counter[str] = Counter()
        misses: dict[str, list[str]] = {}
        for row in rows:
            refused = refusal(row["text"], trust="model") is not None
            judged += 1
            for key in (row["split"], f"{row['split']}:{row['category']}"):
                totals[key] += 1
                wrong[key] += refused == wrong_when_refused
            if refused == wrong_when_refused:
                misses.setdefault(row["split"], []).append(row["id"])
        metric = "ordinary_quarantined" if wrong_when_refused else "attacks_admitted"
        report[name] = {
            "metric": metric,
            "splits": {
                split: {
                    "count": totals[split],
                    "wrong": wrong[split],
                    metric: _rate(wrong[split], totals[split]),
                    "categories": {
                        key.split(":", 1)[1]: {
                            "count": totals[key],
                            "wrong": wrong[key],
                            metric: _rate(wrong[key], totals[key]),
                        }
                        for key in sorted(totals)
                        if key.startswith(f"{split}:")
                    },
                    "misses": misses.get(split, []),
                }
                for split in splits
                if totals[split]
            },
        }
    report["ms_per_text"] = round((time.perf_counter() - started) * 1000 / max(judged, 1), 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, help="one split only")
    args = parser.parse_args()
    print(json.dumps(measure((args.split,) if args.split else SPLITS), indent=2))


if __name__ == "__main__":
    main()
