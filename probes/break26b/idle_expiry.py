"""A login of an inspector started with --session-hours 0.0006 (2.16 s): used every
second it lives on; unused for 3 s it is gone (401), and stays gone."""

import re
import sys
import time
from pathlib import Path

import httpx

BASE = "http://127.0.0.1:8768"
token = re.search(r"token: (\S+)", Path("/tmp/b26b/inspect_idle.out").read_text())[1]
with httpx.Client() as c:
    r = c.post(BASE + "/login", data={"token": token})
    jar = {"afterthought_inspect_8768": r.cookies["afterthought_inspect_8768"]}
    kept = []
    for _ in range(4):
        time.sleep(1)
        kept.append(c.get(BASE + "/quarantine", cookies=jar).status_code)
    time.sleep(3)
    gone = [c.get(BASE + "/quarantine", cookies=jar).status_code for _ in range(2)]
print("used every 1 s:", kept, "after 3 s idle:", gone)
sys.exit(0 if kept == [200] * 4 and gone == [401, 401] else 1)
