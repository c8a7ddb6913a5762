"""Attacks a running `afterthought inspect` (read-only on $RO, --allow-forget on $RW;
tokens read from the files the inspectors' stdout went to). Prints one line a check,
PASS/FAIL, and exits 1 when any failed. Data: probes/break26b/seed.py first."""

import os
import re
import sys
from pathlib import Path
from urllib.parse import urlencode

import httpx

RO = os.environ.get("RO", "http://127.0.0.1:8766")
RW = os.environ.get("RW", "http://127.0.0.1:8767")
RO_TOKEN = re.search(
    r"token: (\S+)", Path(os.environ.get("RO_OUT", "/tmp/b26b/inspect_ro.out")).read_text()
)[1]
RW_TOKEN = re.search(
    r"token: (\S+)", Path(os.environ.get("RW_OUT", "/tmp/b26b/inspect_rw.out")).read_text()
)[1]
failed: list[str] = []


def check(name: str, ok: bool, got: object = "") -> None:
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f"  got: {got!r}"[:300]))
    if not ok:
        failed.append(name)


def port(base: str) -> str:
    return base.rsplit(":", 1)[1]


def login(c: httpx.Client, base: str, token: str) -> str:
    r = c.post(f"{base}/login", data={"token": token}, headers={"Origin": base})
    assert r.status_code == 303, r.status_code
    cookie = r.cookies.get(f"afterthought_inspect_{port(base)}")
    assert cookie
    return cookie


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html)[1]


GUARDED = [
    "/",
    "/user?app=memory_plugin&user=alice",
    "/dead-letters",
    "/quarantine",
    "/forget?app=memory_plugin&user=alice",
]
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]

with httpx.Client(timeout=30, follow_redirects=False) as c:
    # --- no token / wrong token on every route and method
    for base in (RO, RW):
        for path in [*GUARDED, "/logout"]:
            for m in METHODS:
                r = c.request(m, base + path)
                check(f"no-token {m} {base[-4:]}{path}", r.status_code in (401, 405), r.status_code)
        for bad in ["x", RO_TOKEN[:-1], RO_TOKEN + "x", RO_TOKEN.upper(), " " + RW_TOKEN[:-1]]:
            r = c.get(RO + "/", headers={"Authorization": f"Bearer {bad}"})
            check(f"wrong token {bad[:6]!r}", r.status_code == 401, r.status_code)
    r = c.get(RO + "/", headers={"Authorization": f"Bearer {RW_TOKEN}"})
    check("other inspector's token refused", r.status_code == 401, r.status_code)
    r = c.get(RO + "/", headers={"Authorization": f"Basic {RO_TOKEN}"})
    check("Basic scheme refused", r.status_code == 401, r.status_code)
    r = c.get(RO + f"/?token={RO_TOKEN}")
    check("token in query refused", r.status_code == 401, r.status_code)
    r = c.get(RO + "/", cookies={f"afterthought_inspect_{port(RO)}": RO_TOKEN})
    check("token as cookie refused", r.status_code == 401, r.status_code)

    # --- login, cookie attributes, logout, stolen cookie
    r = c.post(RO + "/login", data={"token": RO_TOKEN})
    sc = r.headers.get("set-cookie", "")
    check("login 303", r.status_code == 303, r.status_code)
    check("cookie HttpOnly", "httponly" in sc.lower(), sc)
    check("cookie SameSite=Strict", "samesite=strict" in sc.lower(), sc)
    check("cookie named after port", sc.startswith(f"afterthought_inspect_{port(RO)}="), sc)
    check("cookie is not the token", RO_TOKEN not in sc, sc)
    check(
        "cookie no Max-Age/Expires (session)",
        "max-age" not in sc.lower() and "expires" not in sc.lower(),
        sc,
    )
    cookie = r.cookies.get(f"afterthought_inspect_{port(RO)}")
    jar = {f"afterthought_inspect_{port(RO)}": cookie}
    page = c.get(RO + "/", cookies=jar)
    check("cookie opens page", page.status_code == 200, page.status_code)
    csrf = csrf_of(page.text)
    # second session: its own csrf
    cookie2 = login(c, RO, RO_TOKEN)
    jar2 = {f"afterthought_inspect_{port(RO)}": cookie2}
    csrf2 = csrf_of(c.get(RO + "/", cookies=jar2).text)
    check("csrf per session", csrf != csrf2)
    r = c.post(RO + "/logout", data={"csrf": csrf2}, cookies=jar)
    check("logout with another session's csrf refused", r.status_code == 403, r.status_code)
    r = c.post(RO + "/logout", data={}, cookies=jar)
    check("logout without csrf refused", r.status_code == 403, r.status_code)
    for hdrs in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.com"},
        {"Origin": "http://127.0.0.1:9999"},
    ):
        r = c.post(RO + "/logout", data={"csrf": csrf}, cookies=jar, headers=hdrs)
        check(f"logout cross-site {hdrs}", r.status_code == 403, r.status_code)
    r = c.post(RO + "/logout", data={"csrf": csrf}, cookies=jar)
    check("logout 303", r.status_code == 303, r.status_code)
    r = c.get(RO + "/", cookies=jar)
    check("stolen cookie after logout refused", r.status_code == 401, r.status_code)
    r = c.get(RO + "/", cookies=jar2)
    check("other session survives logout", r.status_code == 200, r.status_code)
    # cookie from another port
    rw_cookie = login(c, RW, RW_TOKEN)
    r = c.get(RO + "/", cookies={f"afterthought_inspect_{port(RO)}": rw_cookie})
    check("cookie of the other port's inspector refused", r.status_code == 401, r.status_code)
    r = c.get(RO + "/", cookies={"afterthought_inspect": cookie2})
    check("cookie under the portless name refused", r.status_code == 401, r.status_code)

    # --- cross-site login
    for hdrs in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://evil.com"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        r = c.post(RO + "/login", data={"token": RO_TOKEN}, headers=hdrs)
        check(
            f"login cross-site {hdrs}",
            r.status_code == 401 and "set-cookie" not in r.headers,
            r.status_code,
        )

    # --- Host header / DNS rebinding
    auth = {"Authorization": f"Bearer {RO_TOKEN}"}
    for host in [
        "evil.com",
        "evil.com:8766",
        "127.0.0.1.evil.com",
        "127.0.0.1:8766@evil.com",
        "localhost.",
        "127.0.0.1:abc",
        "",
        "[::1]x",
        "127.0.0.1:\uff18\uff17\uff16\uff16".encode(),
        "127.0.0.1\t1",
    ]:
        r = c.get(RO + "/", headers={**auth, "Host": host})
        check(f"Host {host!r} refused", r.status_code == 400, r.status_code)
    for host in ["127.0.0.1:8766", "localhost:8766", "LOCALHOST", "[::1]:8766"]:
        r = c.get(RO + "/", headers={**auth, "Host": host})
        check(f"Host {host!r} served", r.status_code == 200, r.status_code)

    # --- read-only refuses every write, however asked
    fpage = c.get(RO + "/forget?app=memory_plugin&user=alice", headers=auth)
    check(
        "RO dry run shown", fpage.status_code == 200 and "dry-run" in fpage.text, fpage.status_code
    )
    check("RO has no confirm button", 'id="confirm"' not in fpage.text)
    fp = re.search(r'name="preview" value="([^"]+)"', fpage.text)
    import hmac as _h
    from hashlib import sha256

    bearer_csrf = _h.new(RO_TOKEN.encode(), b"csrf", sha256).hexdigest()
    form = {
        "csrf": bearer_csrf,
        "app": "memory_plugin",
        "user": "alice",
        "preview": fp[1] if fp else "",
    }
    for m in ["POST", "PUT", "DELETE", "PATCH"]:
        r = c.request(m, RO + "/forget", data=form, headers=auth)
        check(f"RO {m} /forget refused", r.status_code in (403, 405), r.status_code)
    for hdr in ("X-HTTP-Method-Override", "X-Method-Override"):
        r = c.post(
            RO + "/forget", data={**form, "_method": "DELETE"}, headers={**auth, hdr: "DELETE"}
        )
        check(f"RO override {hdr}", r.status_code in (403, 405), r.status_code)
    r = c.get(RO + "/user?app=memory_plugin&user=alice", headers=auth)
    check(
        "alice still there after RO attempts",
        "Lisbon" in r.text or "jazz" in r.text or "current facts" in r.text,
        r.text[:100],
    )

    # --- XSS: no raw payload in any page
    hostile = ["<script>", "<img src=x", '"><img', 'href="javascript:', '<a href="javascript']
    pages = [
        c.get(RO + "/?" + urlencode({"q": q}), headers=auth)
        for q in ["a", "<script>", '"><img src=x onerror=alert(1)>', "{{7*7}}"]
    ]
    for u in [
        "<script>alert(1)</script>",
        '"><img src=x onerror=alert(1)>',
        "javascript:alert(1)",
        "alice",
        "\u0430lice",
        "{{7*7}}",
    ]:
        pages.append(
            c.get(RO + "/user?" + urlencode({"app": "memory_plugin", "user": u}), headers=auth)
        )
        pages.append(
            c.get(RO + "/forget?" + urlencode({"app": "memory_plugin", "user": u}), headers=auth)
        )
    pages += [c.get(RO + "/dead-letters", headers=auth), c.get(RO + "/quarantine", headers=auth)]
    for p in pages:
        low = p.text.lower()
        bad = [h for h in hostile if h in low]
        check(
            f"no raw payload {p.request.url.path}?{str(p.request.url.query)[:40]}",
            not bad and p.status_code == 200,
            (p.status_code, bad),
        )
        check(
            f"headers {p.request.url.path}",
            "script" not in p.headers.get("content-security-policy", "x script")
            and p.headers.get("x-frame-options") == "DENY"
            and p.headers.get("cache-control") == "no-store",
            dict(p.headers),
        )
    check("49 not evaluated", ">49<" not in "".join(p.text for p in pages))
    check(
        "content shown to authenticated (CONTENTMARK)", any("CONTENTMARK" in p.text for p in pages)
    )
    ua = c.get(
        RO + "/user?" + urlencode({"app": "memory_plugin", "user": "\u0430lice"}), headers=auth
    ).text
    check("look-alike marked U+0430", "U+0430" in ua, ua[:200])

    # --- odd ids: traversal, NUL, huge, bad utf-8
    for q in [
        "app=..%2F..&user=..%2F..%2Fetc%2Fpasswd",
        "app=memory_plugin&user=%00",
        "app=%ff%fe&user=%c0%af",
        "app=memory_plugin&user=" + "A" * 8000,
        "app=memory_plugin&user=alice&fact=..%2F..%2Fx",
        "app=memory_plugin&user=alice&fact=" + "f" * 8000,
        "app=%20&user=%20",
        "app=memory_plugin&user=%ED%A0%80",
    ]:
        for path in ("/user", "/forget"):
            r = c.get(f"{RO}{path}?{q}", headers=auth)
            check(
                f"odd id {path}?{q[:50]}", r.status_code in (200, 303, 400, 414, 431), r.status_code
            )
    import socket

    with socket.create_connection(("127.0.0.1", int(port(RO)))) as s:
        s.sendall(
            f"GET /user?app=memory_plugin&user={'A' * 70000} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {RO_TOKEN}\r\nConnection: close\r\n\r\n".encode()
        )
        head = s.recv(200).split(b"\r\n")[0]
    check("huge id answered (no crash)", head.split()[1] in (b"200", b"400", b"414", b"431"), head)
    r = c.get(RO + "/", headers=auth)
    check("still alive", r.status_code == 200, r.status_code)

print(f"\n{len(failed)} failed")
sys.exit(1 if failed else 0)
