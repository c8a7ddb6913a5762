"""The issue's targets, on the held-out part of the natural fixture (never read while
tuning), through a real ADK Runner, a real worker and the local store: what
``bench/memory_quality.py`` prints, asserted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from afterthought.settings import Settings
from bench.memory_quality import evaluate, load


@pytest.fixture(scope="module")
def heldout() -> list[dict[str, Any]]:
    return load("heldout")


async def test_heldout_targets(
    make_settings: Callable[..., Settings], heldout: list[dict[str, Any]]
) -> None:
    # The turn path's own budget: a loaded machine must not turn a slow read into a miss.
    result = await evaluate(make_settings(), heldout)

    cached, query = result["cached"], result["query"]
    assert cached["fact_recall"] >= 0.8, cached
    assert cached["stale_as_current"] == 0, cached
    assert cached["poison_shown"] == 0, cached
    assert query["evidence_in_block"] >= 0.85, query
    assert query["poison_shown"] == 0, query
    assert query["stale_as_current"] == 0, query
