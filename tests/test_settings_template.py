"""zep_user_id_template checked by what it renders; SettingsError and repr(Settings) never
show a value (issue 22's break-it round)."""

from __future__ import annotations

import json

import pytest

from afterthought.settings import Settings, SettingsError

SECRET = "z_SECRETkey1234567890abcdef"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{user_id}}", "must contain {user_id}"),  # renders the constant text "{user_id}"
        ("{user_id." + SECRET + "}", "each bare"),  # was an AttributeError
        ("{user_id:>99999999999}", "each bare"),  # was a MemoryError
        ("{user_id!r}", "each bare"),
        ("{0}:{user_id}", "each bare"),
        ("{" + SECRET + "}", "each bare"),
        ("{app}{user_id}", "text between"),
        ("{user_id", "lone"),
    ],
)
def test_a_bad_template_is_refused_in_one_line_without_its_value(template: str, says: str) -> None:
    with pytest.raises(SettingsError, match=says) as refused:
        Settings(zep_user_id_template=template)
    said = str(refused.value)
    assert SECRET not in said and "\n" not in said
    assert refused.value.problems[0][0].startswith("zep_user_id_template")


def test_an_escaped_brace_is_not_a_field() -> None:
    assert not Settings(zep_user_id_template="{{app}}:{user_id}").apps_apart
    assert Settings(zep_user_id_template="{app}:{user_id}").apps_apart


def test_a_dict_key_of_a_setting_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFTERTHOUGHT_FACT_TTL_DAYS", json.dumps({SECRET: "x", "b": "y"}))
    with pytest.raises(SettingsError) as refused:
        Settings()
    assert SECRET not in str(refused.value)
    assert [field for field, _ in refused.value.problems] == [
        "fact_ttl_days (AFTERTHOUGHT_FACT_TTL_DAYS)"
    ]


def test_repr_shows_no_url_password() -> None:
    settings = Settings(
        zep_base_url=f"https://u:{SECRET}@zep.example/api/v2",
        redis_url=f"redis://:{SECRET}@h:6379/0",
        arq_redis_url=f"redis://:{SECRET}@h:6379/1",
    )
    assert SECRET not in repr(settings) and SECRET not in str(settings)


@pytest.mark.parametrize(
    ("template", "one", "other"),
    [
        ("{app}:{user_id}", ("x", "y:z"), ("x:y", "z")),
        ("{app}:{user_id}", ("x", "y%3Az"), ("x", "y:z")),
        ("{deployment}-{app}/{user_id}", ("a-b", "c"), ("a", "b-c")),
        ("{deployment}-{app}/{user_id}", ("a/b", "c"), ("a", "b/c")),
    ],
)
def test_a_template_of_several_fields_renders_each_pair_apart(
    template: str, one: tuple[str, str], other: tuple[str, str]
) -> None:
    settings = Settings(key_prefix="d")
    ids = {settings.zep_user_id(app=a, user_id=u, template=template) for a, u in (one, other)}
    assert len(ids) == 2


def test_a_template_of_one_field_renders_the_user_id_as_it_is() -> None:
    """A deployment on the legacy ``{user_id}`` keeps the backend users it had."""
    settings = Settings(key_prefix="d")
    assert settings.zep_user_id(app="a", user_id="y:z%", template="{user_id}") == "y:z%"
    assert settings.zep_user_id(app="a", user_id="u1", template="{deployment}:{user_id}") == (
        "d:u1"
    )
    assert settings.zep_user_id(app="a", user_id="s:u", template="{deployment}:{user_id}") == (
        "d:s%3Au"
    )
