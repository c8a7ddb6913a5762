"""The Zep fake itself, run as users would run it: standalone, reached by the real SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import httpx
import pytest
from zep_cloud import AddMessage, AsyncZep
from zep_cloud.core.api_error import ApiError

from afterthought.testing import Fault, ZepFake
from afterthought.testing.redis_server import free_port, listening
from afterthought.testing.zep_fake import RANDOM_FAULTS


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


async def test_the_fake_serves_connections_numbered_above_select_limit(
    zep_fake: ZepFake,
) -> None:
    """A long test process holds many descriptors: the fake's "client gone" check must
    not rely on select(), which refuses descriptors above 1023 (it failed CI that way)."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
        user = await zep.user.create(user_id="u-many-fds")
        thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
        await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="a")])
        assert len(zep_fake.messages(thread)) == 1
        assert not zep_fake.ambiguous
    finally:
        for fd in held:
            os.close(fd)


async def test_user_conflict_and_lookup_behave_like_zep(zep_fake: ZepFake) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    created = await zep.user.create(user_id="u1")
    with pytest.raises(ApiError) as conflict:
        await zep.user.create(user_id="u1")
    assert conflict.value.status_code == 400  # as Zep answers (its Go ADK maps this)
    assert "already exists" in conflict.value.body.error.message
    zep_fake.configure({"duplicate_user_status": 409})
    with pytest.raises(ApiError) as switched:
        await zep.user.create(user_id="u1")
    assert switched.value.status_code == 409
    assert (await zep.user.lookup(user_id="u1")).uuid_ == created.uuid_
    zep_fake.inject(Fault(match="GET /users", status=429, retry_after=1))
    with pytest.raises(ApiError) as limited:
        await zep.user.get(str(created.uuid_))
    assert limited.value.status_code == 429 and (limited.value.headers or {})["retry-after"] == "1"


ADDS = "POST /threads/.*/messages"


async def _thread(zep: AsyncZep) -> str:
    user = await zep.user.create(user_id="u1")
    return str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)


async def _eventually(check: Callable[[], bool], within: float = 20.0) -> None:
    """Poll until ``check`` holds; the bound only stops a broken test."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _stored_soon(fake: ZepFake, thread: str, count: int, within: float = 20.0) -> list[str]:
    """The thread's contents once it holds ``count`` messages (a hung request commits late)."""
    deadline = time.monotonic() + within
    while len(fake.messages(thread)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return [m["content"] for m in fake.messages(thread)]


def test_random_faults_fail_before_and_after_the_work_and_hang() -> None:
    assert {f.kind for f in RANDOM_FAULTS} == {
        "503",
        "500_after_commit",
        "drop",
        "drop_after_commit",
        "429",
        "hang",
    }
    assert all(f.retry_after for f in RANDOM_FAULTS if f.status == 429)


async def test_a_hang_commits_after_the_client_gave_up_and_is_counted_ambiguous(
    zep_fake: ZepFake,
) -> None:
    zep_fake.client_timeout, zep_fake.hang_overshoot = 0.3, 0.5
    # Set-up gets all the time a loaded machine needs; only the call under test is short.
    thread = await _thread(AsyncZep(api_key="k", base_url=zep_fake.base_url, timeout=30))
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=0.3)
    zep_fake.inject(Fault(match=ADDS, hang=True))
    with pytest.raises(httpx.TimeoutException):
        await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="a")])
    assert await _stored_soon(zep_fake, thread, 1) == ["a"]
    await _eventually(lambda: zep_fake.ambiguous == {"hang": 1})  # committed, client gone
    assert zep_fake.injected == {"hang": 1}


@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_a_retry_while_a_hung_call_is_pending_is_stored_once_only_if_keys_are_honoured(
    zep_fake: ZepFake, honor: bool
) -> None:
    zep_fake.honor_idempotency, zep_fake.key_in_flight = honor, "wait"
    zep_fake.client_timeout, zep_fake.hang_overshoot = 0.3, 0.3
    # Set-up gets all the time a loaded machine needs; only the call under test is short.
    thread = await _thread(AsyncZep(api_key="k", base_url=zep_fake.base_url, timeout=30))
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=0.3)
    zep_fake.inject(Fault(match=ADDS, hang=True))
    message = [AddMessage(role="user", content="a")]
    with pytest.raises(httpx.TimeoutException):
        await zep.thread.add_messages(thread, messages=message, idempotency_key="k1")
    retry = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=5)
    await retry.thread.add_messages(thread, messages=message, idempotency_key="k1")
    await _eventually(lambda: zep_fake.ambiguous == {"hang": 1})  # the hung call is done
    if not honor:
        assert await _stored_soon(zep_fake, thread, 2) == ["a", "a"]
    else:  # the retry waited for the hung call and got its reply: one copy, for good
        assert [m["content"] for m in zep_fake.messages(thread)] == ["a"]


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault(match=ADDS, drop=True, after_commit=True), httpx.TransportError),
        (Fault(match=ADDS, status=500, after_commit=True), ApiError),
    ],
    ids=["drop", "500"],
)
async def test_a_failure_after_the_work_stores_and_counts_it_ambiguous(
    zep_fake: ZepFake, fault: Fault, error: type[Exception]
) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    thread = await _thread(zep)
    zep_fake.inject(fault)
    with pytest.raises(error):
        await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="a")])
    assert [m["content"] for m in zep_fake.messages(thread)] == ["a"]
    assert zep_fake.injected == {fault.kind: 1}
    assert zep_fake.ambiguous == {fault.kind: 1}


async def test_failures_before_the_work_or_of_a_read_leave_nothing_ambiguous(
    zep_fake: ZepFake,
) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    thread = await _thread(zep)
    zep_fake.inject(Fault(match=ADDS, status=503))
    zep_fake.inject(Fault(match=ADDS, drop=True))
    zep_fake.inject(Fault(match="POST /users/lookup", status=500, after_commit=True))
    for _ in range(2):
        with pytest.raises((ApiError, httpx.TransportError)):
            await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="a")])
    with pytest.raises(ApiError):
        await zep.user.lookup(user_id="u1")
    assert zep_fake.messages(thread) == []
    assert zep_fake.injected == {"503": 1, "drop": 1, "500_after_commit": 1}
    assert not zep_fake.ambiguous


async def test_a_client_that_timed_out_on_a_slow_commit_is_counted_gone(
    zep_fake: ZepFake,
) -> None:
    thread = await _thread(AsyncZep(api_key="k", base_url=zep_fake.base_url, timeout=30))
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=0.2)
    zep_fake.latency = 0.4
    with pytest.raises(httpx.TimeoutException):
        await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="a")])
    assert await _stored_soon(zep_fake, thread, 1) == ["a"]
    await _eventually(lambda: zep_fake.ambiguous == {"client_gone": 1})
    assert not zep_fake.injected


def test_every_request_draws_a_fault_at_rate_one_and_control_sets_the_timeouts() -> None:
    with ZepFake(fault_rate=1.0, seed=3) as fake:
        control = f"http://127.0.0.1:{fake.port}/_fake/config"
        body = json.dumps({"client_timeout": 0.1, "hang_overshoot": 0.05}).encode()
        urllib.request.urlopen(urllib.request.Request(control, data=body, method="POST"))
        assert (fake.client_timeout, fake.hang_overshoot) == (0.1, 0.05)
        zep = AsyncZep(api_key="k", base_url=fake.base_url, max_retries=0, timeout=0.1)
        asyncio.run(_try_users(zep, 12))
        time.sleep(0.2)  # a last hang commits after its client gave up
        with urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/_fake/state") as reply:
            state = json.load(reply)
        assert sum(state["injected"].values()) == 12
        assert state["ambiguous"] == dict(fake.ambiguous)
        fake.reset()
        assert not fake.injected and not fake.ambiguous


async def _try_users(zep: AsyncZep, count: int) -> None:
    for n in range(count):
        with contextlib.suppress(ApiError, httpx.TransportError):
            await zep.user.create(user_id=f"u{n}")


@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_a_request_served_late_lands_when_the_fakes_clock_says(honor: bool) -> None:
    """Dropped at once, done minutes later on a clock the test moves: after a resend under
    the same key, once where keys are honoured, twice where they are ignored; a message
    update (the only one v4 has) merges metadata."""
    now = [0.0]
    with ZepFake(clock=lambda: now[0], honor_idempotency=honor, key_in_flight="run_both") as fake:
        zep = AsyncZep(api_key="k", base_url=fake.base_url, max_retries=0)
        user = await zep.user.create(user_id="u1")
        thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
        fake.inject(Fault(match="POST /threads/.*/messages", late=120.0))
        said = [AddMessage(role="user", content="hi")]
        with pytest.raises(httpx.TransportError):
            await zep.thread.add_messages(thread, messages=said, idempotency_key="k1")
        assert fake.held() == 1 and fake.messages(thread) == []
        await zep.thread.add_messages(thread, messages=said, idempotency_key="k1")
        now[0] = 119.0
        assert len(fake.messages(thread)) == 1 and fake.held() == 1
        now[0] = 120.0
        stored = fake.messages(thread)
        assert [m["content"] for m in stored] == ["hi"] * (1 if honor else 2)
        assert fake.held() == 0 and fake.outcomes()["ambiguous"] == {"late": 1}
        await zep.thread.message.update(thread, stored[-1]["uuid"], metadata={"copy": "yes"})
        assert fake.messages(thread)[-1]["metadata"] == {"copy": "yes"}
