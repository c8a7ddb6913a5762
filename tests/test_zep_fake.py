"""The Zep fake itself, run as users would run it: standalone, reached by the real SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from zep_cloud import AddMessage, AsyncZep
from zep_cloud.core.api_error import ApiError

from afterthought.testing import Fault, ZepFake
from afterthought.testing.redis_server import free_port, listening


async def test_standalone_fake_serves_the_sdk_and_takes_control_calls() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "afterthought.testing", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not listening("127.0.0.1", port):
            assert time.monotonic() < deadline, "the fake did not start"
            time.sleep(0.05)
        zep = AsyncZep(api_key="k", base_url=f"http://127.0.0.1:{port}/api/v4", max_retries=0)
        user = await zep.user.create(user_id="u1")
        thread = await zep.thread.create(user_uuid=str(user.uuid_))
        control = f"http://127.0.0.1:{port}/_fake/config"
        body = json.dumps({"faults": [{"match": "POST /threads", "status": 503}]}).encode()
        urllib.request.urlopen(urllib.request.Request(control, data=body, method="POST"))
        with pytest.raises(ApiError) as failed:
            await zep.thread.add_messages(
                str(thread.uuid_), messages=[AddMessage(role="user", content="hi")]
            )
        assert failed.value.status_code == 503
        await zep.thread.add_messages(
            str(thread.uuid_), messages=[AddMessage(role="user", content="hi")]
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/state") as reply:
            state = json.load(reply)
        assert [m["content"] for m in state["messages"][str(thread.uuid_)]] == ["hi"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_idempotency_keys_replay_unless_switched_off(zep_fake: ZepFake) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
    for _ in range(2):
        await zep.thread.add_messages(
            thread, messages=[AddMessage(role="user", content="a")], idempotency_key="k1"
        )
    assert len(zep_fake.messages(thread)) == 1
    zep_fake.honor_idempotency = False
    await zep.thread.add_messages(
        thread, messages=[AddMessage(role="user", content="a")], idempotency_key="k1"
    )
    assert len(zep_fake.messages(thread)) == 2
    assert {r.idempotency_key for r in zep_fake.requests if r.path.endswith("/messages")} == {"k1"}


async def test_user_conflict_and_lookup_behave_like_zep(zep_fake: ZepFake) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    created = await zep.user.create(user_id="u1")
    with pytest.raises(ApiError) as conflict:
        await zep.user.create(user_id="u1")
    assert conflict.value.status_code == 409
    assert (await zep.user.lookup(user_id="u1")).uuid_ == created.uuid_
    zep_fake.inject(Fault(match="GET /users", status=429, retry_after=1))
    with pytest.raises(ApiError) as limited:
        await zep.user.get(str(created.uuid_))
    assert limited.value.status_code == 429 and limited.value.headers["retry-after"] == "1"
