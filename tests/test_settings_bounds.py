"""Every number a setting takes is finite and bounded: an infinite duration passed every
check (``ge=1``) and overflowed where the agent made it a deadline or a key's lifetime,
after which every message went to the spool."""

from __future__ import annotations

import json
from typing import Any, get_args, get_origin

import annotated_types
import pytest

from afterthought.settings import Settings, SettingsError, _variable

NUMBERS = sorted(
    name
    for name, info in Settings.model_fields.items()
    if get_origin(info.annotation) is not dict  # fact_ttl_days: its own test below
    and {int, float} & set(get_args(info.annotation) or (info.annotation,))
)
BAD = ["inf", "-inf", "nan", "-1", "1e30"]


def _upper(name: str) -> Any:
    bounds = [m for m in Settings.model_fields[name].metadata if isinstance(m, annotated_types.Le)]
    return bounds[0].le if bounds else None


def test_every_number_has_a_finite_upper_bound() -> None:
    assert len(NUMBERS) > 30, NUMBERS
    unbounded = [name for name in NUMBERS if _upper(name) is None]
    assert unbounded == []
    assert all(float(_upper(name)) < 1e30 for name in NUMBERS)


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("name", NUMBERS)
def test_a_number_out_of_range_is_a_bad_setting_named_without_its_value(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_variable(name), value)
    with pytest.raises(SettingsError) as refused:
        Settings()
    said = str(refused.value)
    assert name in said and _variable(name) in said and "\n" not in said


@pytest.mark.parametrize("days", ["Infinity", "NaN", "-1", "1e30"])
def test_a_fact_lifetime_out_of_range_is_a_bad_setting(
    days: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFTERTHOUGHT_FACT_TTL_DAYS", '{"ephemeral": ' + days + "}")
    with pytest.raises(SettingsError, match="fact_ttl_days"):
        Settings()
    assert Settings(fact_ttl_days=json.loads('{"ephemeral": 36500}')).fact_ttl_days


def test_a_synthesis_model_adk_does_not_know_is_a_bad_setting_named_without_its_value() -> None:
    """ADK's own error quotes the name ("Model nope-sk-... not found."): it may be a key
    pasted into the wrong variable."""
    from afterthought.worker.extract import default_extractor

    secret = "nope-sk-SEKRET-77a1"
    with pytest.raises(SettingsError) as raised:
        default_extractor(Settings(synthesis_model=secret))
    said = str(raised.value)
    assert "AFTERTHOUGHT_SYNTHESIS_MODEL" in said
    assert "SEKRET" not in said


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"thread_queue_cap": 100, "queue_cap": 10}, "AFTERTHOUGHT_THREAD_QUEUE_CAP"),
        ({"redis_shards": 8, "queue_cap": 80}, "AFTERTHOUGHT_THREAD_QUEUE_CAP"),
        (
            {"context_ttl_seconds": 10, "context_fresh_seconds": 60},
            "AFTERTHOUGHT_CONTEXT_TTL_SECONDS",
        ),
        ({"memory_mode": "managed", "backend": "local"}, "AFTERTHOUGHT_MEMORY_MODE"),
        ({"shared_store": "sk-SEKRET-77a1"}, "AFTERTHOUGHT_SHARED_STORE"),
    ],
    ids=["thread-cap", "thread-cap-per-shard", "ttl-below-fresh", "managed-local", "store"],
)
def test_settings_that_contradict_each_other_are_warned_about_once_by_name(
    values: dict[str, Any],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from afterthought import settings as settings_module

    monkeypatch.setattr(settings_module, "_warned", set())
    with caplog.at_level("WARNING", logger="afterthought.settings"):
        Settings(**values)
        Settings(**values)
    said = [r.getMessage() for r in caplog.records if named in r.getMessage()]
    assert len(said) == 1
    assert "SEKRET" not in said[0]
    caplog.clear()
    monkeypatch.setattr(settings_module, "_warned", set())
    with caplog.at_level("WARNING", logger="afterthought.settings"):
        Settings()  # the defaults contradict nothing
    assert not [r for r in caplog.records if named in r.getMessage()]
