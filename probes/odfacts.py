import sqlite3, sys, json, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import memory_quality as mq
db = sqlite3.connect("/tmp/ret23c/tune.sqlite3")
users = mq.load("tune", "memory3", Path("/tmp/ret23c/fixture"))
kinds = collections.Counter(); qs = collections.Counter()
for u in users:
    uuid = next(x for x, uid in db.execute("SELECT uuid,user_id FROM users") if u["user"] in uid)
    turns = {t["id"]: t["text"] for s in u["sessions"] for t in s["turns"]}
    facts = db.execute("SELECT subject,predicate,value,kind,source_keys,invalid_at FROM facts WHERE user_uuid=?", (uuid,)).fetchall()
    for q in u["questions"]:
        if q["kind"] != "open-domain": continue
        qs[q["text"]] += 1
        for e in q["evidence"]:
            row = db.execute("SELECT message_key, eligible FROM messages WHERE user_uuid=? AND content=?", (uuid, turns[e])).fetchone()
            fs = [f for f in facts if row and row[0] in json.loads(f[4])]
            kinds[tuple(sorted({(f[0]=="user", f[3], f[5] is None) for f in fs}))] += 1
            if not fs: print("NOFACT", row and row[1], q["text"], "|", turns[e][:100])
print(kinds); print(qs)
