"""The chaos bench, small enough for every CI run: ADK sessions sharing one event loop that
stalls, workers SIGKILLed, a Zep fake failing before and after committing and hanging past
the client's timeout. Nothing may be lost, doubled or reordered, whether or not the backend
honours idempotency keys."""

from __future__ import annotations

import json

import pytest

from bench import chaos
from tests.conftest import REDIS_URL


@pytest.mark.timeout(300)
@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
def test_a_stalling_agent_with_killed_workers_and_ambiguous_faults_loses_nothing(
    honor: bool,
) -> None:
    result = chaos.run(
        messages=300,
        sessions=16,  # enough enqueues in flight that stalls catch some of them
        turns_per_session=10,
        workers=2,
        kills=2,
        fault_rate=0.15,
        honor_idempotency=honor,
        stall=True,
        think=0.1,
        seed=5 if honor else 6,
        redis_url=REDIS_URL,
        timeout=60,
    )
    report = json.dumps(result)  # the whole report, diagnosis included, when it fails
    assert result["stalls"]["count"] > 0 and result["kills"] == 2, report
    assert result["settled"], report
    found = (result["lost"], result["duplicated"], result["out_of_order"], result["stray"])
    assert found == (0, 0, 0, 0), report


@pytest.mark.timeout(300)
def test_sessions_pinning_identity_in_state_on_a_stalling_loop_lose_nothing() -> None:
    """Issue 21: every session's first message was lost when its state pinned a user and
    thread (untrusted) and the loop stalled during the pins' registry check. One turn a
    session, so every message said is a session's first."""
    result = chaos.run(
        messages=240,
        sessions=16,
        turns_per_session=1,
        workers=2,
        kills=1,
        fault_rate=0.1,
        stall=True,
        think=0.05,
        seed=8,
        redis_url=REDIS_URL,
        timeout=60,
        pin_identity=True,
    )
    report = json.dumps(result)
    assert result["stalls"]["count"] > 0 and result["pin_identity"], report
    assert result["settled"], report
    found = (result["lost"], result["duplicated"], result["out_of_order"], result["stray"])
    assert found == (0, 0, 0, 0), report
    assert result["hooks"]["dropped"] == 0, report


@pytest.mark.timeout(300)
def test_workers_killed_and_the_database_crash_restarted_lose_nothing_on_postgres() -> None:
    """The PostgreSQL store, in a server of the run's own: workers SIGKILLed mid-transaction
    and the server stopped as a crash stops it (every connection cut) and started again."""
    try:
        from afterthought.testing.postgres_server import _binaries

        _binaries()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    result = chaos.run(
        messages=200,
        sessions=10,
        turns_per_session=10,
        workers=2,
        kills=2,
        stall=True,
        think=0.1,
        seed=7,
        redis_url=REDIS_URL,
        timeout=120,
        backend="postgres",
        pg_restarts=1,
    )
    report = json.dumps(result)
    assert result["failovers"] == 1 and result["kills"] == 2, report
    found = (result["lost"], result["duplicated"], result["out_of_order"], result["stray"])
    assert found == (0, 0, 0, 0), report
