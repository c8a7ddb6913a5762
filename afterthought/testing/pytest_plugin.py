"""pytest fixtures: ``zep_fake`` (a started :class:`ZepFake`) and ``zep_env`` (it, with
``ZEP_API_KEY`` and ``ZEP_BASE_URL`` set for the test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from afterthought.testing.zep_fake import ZepFake


@pytest.fixture
def zep_fake() -> Iterator[ZepFake]:
    with ZepFake() as fake:
        yield fake


@pytest.fixture
def zep_env(zep_fake: ZepFake, monkeypatch: pytest.MonkeyPatch) -> ZepFake:
    monkeypatch.setenv("ZEP_API_KEY", "test-key")
    monkeypatch.setenv("ZEP_BASE_URL", zep_fake.base_url)
    return zep_fake
