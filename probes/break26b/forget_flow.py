"""The --allow-forget inspector's forget, attacked: a confirm from another site, without
the CSRF token, with a made-up or stale fingerprint, with another user's fingerprint; a
look-alike's forget leaving the id it mimics; then a real confirm (shows Forgotten / the
cannot-tell note) and a replay of that confirm (nothing to forget: the dry run again)."""

import hmac
import re
import sys
from hashlib import sha256
from pathlib import Path

import httpx

RW = "http://127.0.0.1:8767"
token = re.search(r"token: (\S+)", Path("/tmp/b26b/inspect_rw.out").read_text())[1]
failed = []


def check(name, ok, got=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f"  got: {got!r}"[:300]))
    if not ok:
        failed.append(name)


def dry(c, params):
    r = c.get(RW + "/forget", params=params)
    fp = re.search(r'name="preview" value="([^"]+)"', r.text)
    return r, (fp[1] if fp else None)


with httpx.Client(timeout=60) as c:
    r = c.post(RW + "/login", data={"token": token})
    c.cookies.set("afterthought_inspect_8767", r.cookies["afterthought_inspect_8767"])
    home = c.get(RW + "/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', home.text)[1]
    target = {"app": "memory_plugin", "user": "alice\u200b"}
    mimicked = {"app": "memory_plugin", "user": "alice"}
    before = c.get(RW + "/user", params=mimicked).text.count('class="text statement"')
    r, fp = dry(c, target)
    check("dry run has a confirm", fp is not None and 'id="confirm"' in r.text, r.status_code)
    form = {"csrf": csrf, "preview": fp, **target}
    for hdrs in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.com"},
        {"Origin": "http://localhost:8767"},
    ):
        r = c.post(RW + "/forget", data=form, headers=hdrs)
        check(f"cross-site confirm {hdrs}", r.status_code == 403, r.status_code)
    r = c.post(RW + "/forget", data={**form, "csrf": ""})
    check("no csrf", r.status_code == 403, r.status_code)
    bearer_csrf = hmac.new(token.encode(), b"csrf", sha256).hexdigest()
    r = c.post(RW + "/forget", data={**form, "csrf": bearer_csrf})
    check("the bearer csrf with a cookie session refused", r.status_code == 403, r.status_code)
    r = c.post(RW + "/forget", data={**form, "preview": "0" * 64})
    check(
        "made-up fingerprint: dry run again (409)",
        r.status_code == 409 and 'id="changed"' in r.text,
        r.status_code,
    )
    _, fp_other = dry(c, mimicked)
    r = c.post(RW + "/forget", data={**form, "preview": fp_other})
    check("another user's fingerprint: 409", r.status_code == 409, r.status_code)
    r = c.post(RW + "/forget", data=form)
    check(
        "confirm forgets",
        r.status_code == 200 and 'id="done"' in r.text,
        (r.status_code, r.text[-600:]),
    )
    check("says forgotten or cannot-tell", 'id="forgotten"' in r.text or 'id="unsure"' in r.text)
    after = c.get(RW + "/user", params=mimicked).text.count('class="text statement"')
    check("the mimicked id keeps its statements", before == after and before > 0, (before, after))
    gone = c.get(RW + "/user", params=target).text
    check("look-alike's statements gone", 'class="text statement"' not in gone)
    r = c.post(RW + "/forget", data=form)
    check(
        "replayed confirm does nothing (409, nothing)",
        r.status_code == 409 and 'id="nothing"' in r.text,
        r.status_code,
    )
print(f"{len(failed)} failed")
sys.exit(1 if failed else 0)
