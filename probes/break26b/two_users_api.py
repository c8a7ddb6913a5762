"""Two users over ADK's real `adk api_server --memory_service_uri afterthought://`
(examples/adk_web, memory_tools app): each says something private, then a new session
asks; checks the stand-in's reply (what PreloadMemoryTool gave it) has their own memory
and never the other's. Run with the api server on $API (default 127.0.0.1:8611) and a
worker beside it."""

import os
import sys
import time
import uuid

import httpx

API = os.environ.get("API", "http://127.0.0.1:8611")
APP = os.environ.get("APP", "memory_tools")
run = uuid.uuid4().hex[:6]
USERS = {
    f"alice{run}": "my secret code word is PERIWINKLE and I moved to Lisbon",
    f"bob{run}": "my secret code word is TANGERINE and I moved to Oslo",
}


def turn(c: httpx.Client, user: str, text: str) -> str:
    s = c.post(f"{API}/apps/{APP}/users/{user}/sessions", json={}).json()["id"]
    r = c.post(
        f"{API}/run",
        json={
            "app_name": APP,
            "user_id": user,
            "session_id": s,
            "new_message": {"role": "user", "parts": [{"text": text}]},
        },
    )
    r.raise_for_status()
    out = []
    for ev in r.json():
        for p in (ev.get("content") or {}).get("parts") or []:
            if p.get("text"):
                out.append(p["text"])
            if p.get("function_response"):
                out.append(repr(p["function_response"]))
    return "\n".join(out)


def main() -> int:
    with httpx.Client(timeout=60) as c:
        for u, t in USERS.items():
            print(u, "->", turn(c, u, t)[:200].replace("\n", " | "))
        time.sleep(4)
        bad = 0
        for u in USERS:
            reply = turn(c, u, "what is my secret code word? where did I move?")
            mine = USERS[u].split()[5]
            other = next(USERS[o].split()[5] for o in USERS if o != u)
            print(f"--- {u}:\n{reply}\n")
            print(u, "own:", mine in reply, "other's:", other in reply)
            bad += (mine not in reply) + (other in reply)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
