"""Throwaway: where a question's evidence ranks, and what outranks it."""
import sqlite3, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afterthought.backends.local import LocalBackend
from afterthought.backends import ranking
from afterthought.backends.retrieval import question_terms, expansion_terms
user, query = sys.argv[1], sys.argv[2]
path = Path(f"/tmp/ret23c/tune.sqlite3")
b = LocalBackend(path)
db = b._open()
uuid = next(u for u, uid in db.execute("SELECT uuid, user_id FROM users") if user in uid)
print("terms", question_terms(query), "exp", expansion_terms(query))
rel = b._relevant(db, uuid, query)
texts = dict(db.execute(f"SELECT id, content FROM messages WHERE user_uuid=? AND eligible=1", (uuid,)).fetchall())
st = b._statements(db, uuid, query, limit=None)
print("relevant", len(rel), "statements", len(st))
for i, s in enumerate(st[:40]):
    print(i, s.message_id, "R" if s.message_id in rel[:len(rel)] else " ", s.text[:150].replace("\n"," "))
from afterthought.backends.local import _lexical, _counts
exp = expansion_terms(query)
print(_counts(db, uuid, exp))
for i in _lexical(db, uuid, exp)[:15]: print("  exp", i, texts[i][:120])
for i in _lexical(db, uuid, question_terms(query))[:15]: print("  q", i, texts[i][:120])
