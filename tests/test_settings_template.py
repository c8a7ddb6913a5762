"""zep_user_id_template checked by what it renders; SettingsError and repr(Settings) never
show a value (issue 22's break-it round)."""

from __future__ import annotations

import json
import logging
import traceback

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import AliasChoices

from afterthought import settings as settings_module
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
        # A field's own % is escaped to %25: the same text between fields made (app "a%",
        # user "b") and (app "a", user "%b") one backend user, "a%25%25b".
        ("{app}%25{user_id}", "% outside its fields"),
        ("{app}%{user_id}", "% outside its fields"),
        ("%{user_id}", "% outside its fields"),
        ("{user_id}" + SECRET + "%", "% outside its fields"),
        # Two deployments' templates rendered one backend user: {deployment}-{user_id} of
        # "a" (user "b/c") and {deployment}/{user_id} of "a-b" (user "c"), both "a-b/c".
        ("{deployment}-{user_id}", "start with {deployment}"),
        ("{deployment}.{app}:{user_id}", "start with {deployment}"),
        ("{deployment}é{user_id}", "start with {deployment}"),
        ("{app}:{deployment}:{user_id}", "start with {deployment}"),
        ("x:{deployment}:{user_id}", "start with {deployment}"),
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
        ("{deployment}/{app}-{user_id}", ("a-b", "c"), ("a", "b-c")),
        ("{deployment}/{app}-{user_id}", ("a/b", "c"), ("a", "b/c")),
    ],
)
def test_a_template_of_several_fields_renders_each_pair_apart(
    template: str, one: tuple[str, str], other: tuple[str, str]
) -> None:
    settings = Settings(key_prefix="d")
    ids = {settings.zep_user_id(app=a, user_id=u, template=template) for a, u in (one, other)}
    assert len(ids) == 2


_SEPARATOR = st.text(alphabet=":/|#@ -._x~é", min_size=1, max_size=3)
_NAME = st.text(alphabet=st.sampled_from("ab:/|#@%-._~é"), max_size=6)


@st.composite
def _deployment_template(draw: st.DrawFn) -> str:
    rest = draw(st.permutations(["{app}", "{user_id}"]))[: draw(st.integers(1, 2))]
    if "{user_id}" not in rest:
        rest = ["{user_id}"]
    return "{deployment}" + "".join(draw(_SEPARATOR) + field for field in rest)


def _accepted(template: str) -> bool:
    try:
        Settings(zep_user_id_template=template)
    except SettingsError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@example(  # what two deployments' templates rendered as one user before
    one="{deployment}-{user_id}",
    other="{deployment}/{user_id}",
    prefixes=["a", "a-b"],
    said=[("x", "b/c"), ("x", "c")],
)
@given(
    one=_deployment_template(),
    other=_deployment_template(),
    prefixes=st.lists(
        st.text(alphabet="ab-_.é", min_size=1, max_size=4), min_size=2, max_size=2, unique=True
    ),
    said=st.lists(st.tuples(_NAME, _NAME), min_size=2, max_size=2),
)
def test_two_deployments_never_render_one_backend_user_whatever_their_templates(
    one: str, other: str, prefixes: list[str], said: list[tuple[str, str]]
) -> None:
    """Any two templates a deployment may set: (deployment, app, user) of one and of
    another deployment are two backend users."""
    assume(_accepted(one) and _accepted(other))
    ids = {
        Settings(key_prefix=prefix).zep_user_id(app=app, user_id=user, template=template)
        for prefix, template, (app, user) in zip(prefixes, (one, other), said, strict=True)
    }
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


#: What a secret pasted into the wrong place looks like: no message, log or traceback may
#: hold it.
CANARY = "sk_live_CANARY7f3e9a"
#: Each setting's bad value holding the canary, in the environment; the rest are refused
#: as the canary alone (not a number, not a choice, not a URL, ...).
BAD = {
    "redis_url": f"redis://:{CANARY}@/0",  # no host
    "arq_redis_url": f"redis://:{CANARY}@/0",
    "zep_api_key": f"{CANARY} pasted",  # a space
    "zep_base_url": f"ftp://{CANARY}",
    "key_prefix": f"{CANARY} x",
    "local_db_path": f"~{CANARY}/memory.sqlite3",  # a user this machine has no home for
    "spool_path": f"~{CANARY}/spool",
    "zep_user_id_template": "{" + CANARY + "}",
    "fact_ttl_days": json.dumps({CANARY: -1}),
}
#: Settings any text is a value of (names, free-form ids, a key): taken as given, never
#: logged either.
ANY_TEXT = {
    "embedding_model", "assistant_name", "context_template_uuid", "synthesis_model",
    "audit_key", "tombstone_key", "metrics_host", "shared_store",
}  # fmt: skip


def _variable_of(field: str) -> str:
    alias = Settings.model_fields[field].validation_alias
    return (
        str(alias.choices[0])
        if isinstance(alias, AliasChoices)
        else f"AFTERTHOUGHT_{field.upper()}"
    )


@pytest.mark.parametrize("field", sorted(Settings.model_fields))
def test_no_setting_echoes_a_value_in_its_error_its_logs_or_its_traceback(
    field: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Table-driven over every setting: a bad value holding a secret is refused in one
    line naming the setting (and the variable the project defines), never the value."""
    monkeypatch.setattr(settings_module, "_warned", set())
    variable = _variable_of(field)
    monkeypatch.setenv(variable, BAD.get(field, CANARY))
    caplog.set_level(logging.DEBUG)
    if field in ANY_TEXT:
        Settings()
    else:
        with pytest.raises(SettingsError) as refused:
            Settings()
        said = str(refused.value)
        trace = "".join(traceback.format_exception(refused.value))
        assert "\n" not in said and said.startswith("bad setting: ")
        assert CANARY not in said and CANARY not in trace
        assert variable in said
    assert CANARY not in caplog.text


def test_an_unknown_variable_or_keyword_is_not_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``AFTERTHOUGHT_<a key pasted as a name>``: counted and what it probably meant said,
    the name itself never (it is the user's text)."""
    monkeypatch.setattr(settings_module, "_warned", set())
    monkeypatch.setenv(f"AFTERTHOUGHT_{CANARY}", "1")
    monkeypatch.setenv("AFTERTHOUGHT_PREFIX", "shop")
    caplog.set_level(logging.WARNING)
    Settings()
    assert CANARY.upper() not in caplog.text.upper()
    assert "2 AFTERTHOUGHT_ variables name no setting" in caplog.text
    assert "did you mean AFTERTHOUGHT_KEY_PREFIX?" in caplog.text
    with pytest.raises(SettingsError) as refused:
        Settings(**{CANARY: 1, "key_prefx": "shop"})
    assert CANARY not in str(refused.value)
    assert "2 keyword arguments name no setting (did you mean key_prefix?)" in str(refused.value)


def test_a_relative_store_is_warned_about_without_its_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(settings_module, "_warned", set())
    caplog.set_level(logging.WARNING)
    settings = Settings(local_db_path=f"{CANARY}/memory.sqlite3")
    assert settings.local_db_path.is_absolute()
    assert "local_db_path (AFTERTHOUGHT_LOCAL_DB_PATH) is relative" in caplog.text
    assert CANARY not in caplog.text


def test_an_unknown_keyword_to_an_agent_surface_is_a_settings_error() -> None:
    """``create_callbacks(<a key pasted as a name>=1)``, and the plugin, the memory service
    and ``TurnMemory.create``: the one line ``Settings`` says, not a ``TypeError`` naming it."""
    from afterthought.agent_hooks import (
        MemoryPlugin,
        TurnMemory,
        ZepMemoryService,
        create_callbacks,
    )

    for make in (create_callbacks, MemoryPlugin, ZepMemoryService, TurnMemory.create):
        with pytest.raises(SettingsError) as refused:
            make(**{CANARY: 1, "key_prefx": "shop"})
        said = str(refused.value)
        assert "\n" not in said and CANARY not in said
        assert "2 keyword arguments name no setting (did you mean key_prefix?)" in said
