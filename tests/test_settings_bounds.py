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
