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
reviewer who never saw the corpus or the tests; never tuned on: the blind estimate),
``tune-i18n`` (instructions in thirteen languages, role-play, hidden markup, split and
encoded payloads, standing and config-style requests, and look-alikes that only mention
them: tuned on). Issue 23's held-out sets (``heldout_attacks.jsonl``,
``heldout_lookalikes.jsonl``, written by a helper who never saw the patterns) are judged
with ``--attacks``/``--lookalikes``: their one blind run admitted 8 of 73 attacks
(Wilson 95 % 5.7-20.2 %) and refused 10 of 69 look-alikes (8.1-24.7 %); general changes
made from it leave 1 and 1, so they are no longer blind. Every rate comes with its Wilson
95 % interval. Misses are listed by id only. Two later sets, each written by a helper who
read no code or data of the project: ``blind3_*`` (141 attacks / 142 look-alikes, 19
languages; its one blind run, on the first classifier, admitted 35 (24.8 %) and refused 7
(4.9 %)) and ``blind4_*`` (134 / 134, 18 languages, attacks inside ordinary chat; its
blind run on the same code admitted 40 (29.9 %) and refused 13 (9.7 %)): no longer blind.
The clause model (docs/DESIGN.md) trains on ``blind4_*`` and measures itself on
``blind3_*``, which chose nothing: 16 admitted (11.3 %) and 4 refused (2.8 %). A fifth,
``blind5_*`` (150 / 150, 17 languages and code-switching, look-alikes written to mirror the
attacks: office rules "from now on", talks on prompt injection, ``<system>`` in XML), was
judged once blind on the clause model: 26 admitted (17.3 %) and 31 refused (20.7 %); the
whole-message classifier before it gave 32 (21.3 %) and 27 (18.0 %) on it. A sixth,
``blind6_*`` (235 / 236, 14 languages: notes for the assistant hidden in meeting minutes and
pasted pages, delayed triggers; look-alikes: leases, teachers' and household rules, talks on
prompt injection, config files), judged once blind on that model: 34 admitted (14.5 %) and
46 refused (19.5 %). ``blind7`` (``tests/fixtures/blind7/``, 284 / 351, 20 languages): 77
admitted (27.1 %) and 34 refused (9.7 %). ``blind8`` (257 / 252, 22 languages): 33 (12.8 %) and
8 (3.2 %); ``blind9`` (133 / 135, 15 languages, not trained on): 6 (4.5 %) and 15 (11.1 %).
Every set but ``blind9`` now trains the shipped model: their figures here are seen ones; the
estimate for a new writer is ``python bench/train_classifier.py --cv`` (each blind set left
out in turn).

    python bench/validation.py [--split tune|heldout|heldout-2|review|tune-i18n]
    python bench/validation.py --attacks A.jsonl --lookalikes L.jsonl   # any other set
    python bench/validation.py --cost   # p50/p99 ms of CPU per detect() at 500 / 2,000 / 20,000

Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.validation import detect, prepare, refusal  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "validation"
#: The targets: at most this share of attacks admitted, of ordinary lines quarantined.
TARGETS = {"attacks_admitted": 0.02, "ordinary_quarantined": 0.01}


def load(name: str | Path) -> list[dict[str, str]]:
    path = name if isinstance(name, Path) else CORPUS / f"{name}.jsonl"
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


#: z for a two-sided 95 % interval.
Z95 = 1.959964


def wilson(part: int, whole: int) -> list[float]:
    """The Wilson score 95 % interval of ``part / whole`` (sound at 0 and at small counts,
    where the normal approximation gives an interval of width zero)."""
    if not whole:
        return [0.0, 1.0]
    p = part / whole
    denominator = 1 + Z95**2 / whole
    centre = (p + Z95**2 / (2 * whole)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / whole + Z95**2 / (4 * whole**2)) / denominator
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


SPLITS = ("tune", "heldout", "heldout-2", "review", "tune-i18n")
#: The splits the patterns were tuned on or fixed after: the targets are asserted on these;
#: ``review`` is reported as it is, the estimate for text nobody tuned for.
TUNED = ("tune", "heldout", "heldout-2", "tune-i18n")


def measure(
    splits: tuple[str, ...] = SPLITS, files: dict[str, Path] | None = None
) -> dict[str, Any]:
    """Counts, rates and their intervals per split and per category; the ids of the
    misses. ``files`` judges other sets instead ({"attacks": ..., "ordinary": ...}),
    every row of them, whatever its split says."""
    report: dict[str, Any] = {"targets": TARGETS}
    started = time.perf_counter()
    judged = 0
    for name, wrong_when_refused in (("attacks", False), ("ordinary", True)):
        if files is not None:
            if name not in files:
                continue
            rows = [r | {"split": files[name].stem} for r in load(files[name])]
        else:
            rows = [r for r in load(name) if r["split"] in splits]
        totals: Counter[str] = Counter()
        wrong: Counter[str] = Counter()
        misses: dict[str, list[str]] = {}
        for row in rows:
            refused = refusal(row["text"], trust="model") is not None
            judged += 1
            # A set's rows name their category "category" or "kind".
            category = row.get("category", row.get("kind", "-"))
            for key in (row["split"], f"{row['split']}:{category}"):
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
                    "wilson95": wilson(wrong[split], totals[split]),
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
                for split in sorted({r["split"] for r in rows})
                if totals[split]
            },
        }
    report["ms_per_text"] = round((time.perf_counter() - started) * 1000 / max(judged, 1), 3)
    return report


#: The lengths whose detect() cost is measured, and how many texts of each.
COST_LENGTHS = (500, 2000, 20000)
COST_SAMPLES = 60


def cost() -> dict[str, float]:
    """Median and 99th percentile ms of CPU (process time, not wall clock: the machine is
    shared) per :func:`detect` of ordinary chat lines joined up to each length: harmless
    text, so checks run on to the end where nothing matches. The patterns compile on first
    use, each when a text first could match it: :func:`prepare` compiles them all first,
    as a worker does at start, and a few texts of each length are judged first."""
    lines = [row["text"] for row in load("ordinary")]
    prepare()

    def joined(length: int, seed: int) -> str:
        text, i = "", seed * 37
        while len(text) < length:
            text += lines[(i * 7919) % len(lines)] + " "
            i += 1
        return text[:length]

    for length in COST_LENGTHS:
        for seed in range(100, 103):
            detect(joined(length, seed))
    figures: dict[str, float] = {}
    for length in COST_LENGTHS:
        spent = []
        for seed in range(COST_SAMPLES if length <= 2000 else COST_SAMPLES // 10):
            text = joined(length, seed)
            started = time.process_time()
            detect(text)
            spent.append((time.process_time() - started) * 1000)
        spent.sort()
        figures[f"{length}_chars_p50_ms_cpu"] = round(spent[len(spent) // 2], 2)
        figures[f"{length}_chars_p99_ms_cpu"] = round(spent[int(len(spent) * 0.99)], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, help="one split only")
    parser.add_argument("--attacks", type=Path, help="judge this attack set instead")
    parser.add_argument("--lookalikes", type=Path, help="judge this harmless set instead")
    parser.add_argument("--cost", action="store_true", help="print detect()'s CPU cost only")
    args = parser.parse_args()
    if args.cost:
        print(json.dumps(cost()))
        return
    files = {
        name: path
        for name, path in (("attacks", args.attacks), ("ordinary", args.lookalikes))
        if path is not None
    }
    splits = (args.split,) if args.split else SPLITS
    print(json.dumps(measure(splits, files or None), indent=2))


if __name__ == "__main__":
    main()
