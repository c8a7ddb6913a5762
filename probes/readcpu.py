"""Throwaway: CPU per local read (get_context's SQL+ranking) on memory3 tune, p50/p90."""
import sqlite3, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afterthought.backends.local import LocalBackend
from afterthought.backends.base import UserRef
from afterthought.backends.retrieval import asks_advice
from bench import memory_quality as mq
users = mq.load("tune", "memory3", Path("/tmp/ret23c/fixture"))[:20]
b = LocalBackend(Path("/tmp/ret23c/tune.sqlite3")); db = b._open()
refs = {uid: UserRef(u, g) for u, uid, g in db.execute("SELECT uuid, user_id, graph_uuid FROM users")}
t = {True: [], False: []}
for u in users:
    ref = next(r for k, r in refs.items() if u["user"] in k)
    for q in u["questions"]:
        s = time.process_time(); b._context(db, ref, q["text"], 4000); t[asks_advice(q["text"])].append(time.process_time() - s)
for k, v in t.items():
    v.sort(); print("advice" if k else "other", len(v), "p50 %.1f ms p90 %.1f ms" % (v[len(v)//2]*1000, v[int(len(v)*.9)]*1000))
