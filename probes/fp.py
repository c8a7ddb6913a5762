"""Throwaway: which stage flags the fixture's evidence turns as instruction-like."""
import json, sys, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afterthought import validation as v
from bench import memory_quality as mq
split = sys.argv[1]
users = mq.load(split, "memory3", Path("/tmp/ret23c/fixture"))
stage = collections.Counter(); ev_flag = 0; ev_n = 0; samples = []
for u in users:
    turns = {t["id"]: t for s in u["sessions"] for t in s["turns"]}
    evid = {e for q in u["questions"] for e in q["evidence"]}
    for e in evid:
        t = turns[e]["text"]; ev_n += 1
        if v.detect(t) is not None:
            ev_flag += 1
            rules = v.detect(t, _model=False)
            stage["rules" if rules else "model"] += 1
            samples.append(("R " if rules else "M ") + t[:160])
print("evidence turns", ev_n, "flagged", ev_flag, dict(stage))
for s in samples[:40]: print(s)
