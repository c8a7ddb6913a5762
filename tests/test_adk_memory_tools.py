"""ADK's own memory tools over ``ZepMemoryService`` (issue 26): what ``PreloadMemoryTool``
and ``load_memory`` show the model, through a real Runner, and ``afterthought://`` for
ADK's service registry."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.load_memory_tool import load_memory_tool
from google.adk.tools.preload_memory_tool import PreloadMemoryTool

from afterthought.adk_init import BEGIN, BLOCK, END
from afterthought.agent_hooks import ZepMemoryService
from afterthought.settings import Settings
from afterthought.testing.stand_in_model import StandInLlm, preloaded_lines
from tests.adk_support import APP, new_session, said_session, say
from tests.conftest import drain, run_cli

SAID_AT = 1_700_000_000.0  # 2023-11-14T22:13:20Z: an import of turns said long before
MOVED = "We moved to Lisbon last week. The flat is tiny."
HILLS = "Lisbon has so many hills!"


async def test_preload_memory_and_load_memory_show_each_statement_once_by_its_author_and_time(
    any_settings: Settings,
) -> None:
    """A session imported twice (``add_session_to_memory``), then asked about in a new
    session: ``PreloadMemoryTool`` shows what the user said as ``user: …`` under the time
    it was said (not when the backend received it), each text once — though Zep extracts
    facts that may repeat a sentence word for word; ``load_memory`` returns the same."""
    service = ZepMemoryService(settings=any_settings)
    old = said_session(
        "moving",
        [MOVED, "Noted.", HILLS, "Good luck.", "The boxes are everywhere.", "Oh no."],
        user="ada",
        at=SAID_AT,
    )
    for _ in range(2):
        await service.add_session_to_memory(old)
    await drain(any_settings)

    model = StandInLlm(script=[{"call": "load_memory", "args": {"query": "Lisbon"}}, "ok"])
    agent = LlmAgent(name="helper", model=model, tools=[PreloadMemoryTool(), load_memory_tool])
    runner = Runner(
        app_name=APP, agent=agent, session_service=InMemorySessionService(), memory_service=service
    )
    await say(runner, "ada", await new_session(runner, "ada"), "Any tips for Lisbon?")

    first, after_the_tool = model.requests
    lines = preloaded_lines(first)
    assert lines.count(f"user: {MOVED}") == 1, lines
    assert lines[lines.index(f"user: {MOVED}") - 1].startswith("Time: 2023-11-14"), lines
    texts = [line.partition(": ")[2] for line in lines if not line.startswith("Time: ")]
    assert texts.count(HILLS) == 1 and len(set(texts)) == len(texts), lines
    assert all(line.startswith("Time: 2023-11-14") for line in lines[::2]), lines
    if any_settings.resolved_backend == "local":  # (Zep ranks by meaning: loosely related too)
        assert not any("boxes" in line for line in lines), lines

    (response,) = [
        part.function_response.response
        for content in after_the_tool.contents
        for part in content.parts or []
        if part.function_response and part.function_response.name == "load_memory"
    ]
    entries: list[Any] = response["result"].memories
    found = [(e.author, (e.content.parts or [])[0].text) for e in entries]
    assert found.count(("user", MOVED)) == 1, found
    assert len({text for _, text in found}) == len(found), found
    assert all(e.timestamp and e.timestamp.startswith("2023-11-14") for e in entries), entries


async def test_a_statement_said_again_with_other_punctuation_and_case_is_shown_once(
    any_settings: Settings,
) -> None:
    """The user said the same thing in two sessions, a week apart, once with a full stop
    and once with a dash, an exclamation mark and capitals: ``PreloadMemoryTool`` shows
    it once, where it ranks best (on Zep, as the fact that repeats it); a statement with
    other words stays."""
    service = ZepMemoryService(settings=any_settings)
    again = "we moved to LISBON last week — the flat is tiny!!"
    other = "We moved to Lisbon last week. The flat is huge."
    for sid, said, at in [("first", MOVED, SAID_AT), ("second", again, SAID_AT + 7 * 86400)]:
        await service.add_session_to_memory(
            said_session(
                sid,
                [said, "Noted.", other, "Nice."] if sid == "second" else [said, "Noted."],
                user="ada",
                at=at,
            )
        )
    await drain(any_settings)

    model = StandInLlm(script=["ok"])
    agent = LlmAgent(name="helper", model=model, tools=[PreloadMemoryTool()])
    runner = Runner(
        app_name=APP, agent=agent, session_service=InMemorySessionService(), memory_service=service
    )
    await say(runner, "ada", await new_session(runner, "ada"), "How is the flat in Lisbon?")
    lines = preloaded_lines(model.requests[0])
    texts = [line.partition(": ")[2] for line in lines if not line.startswith("Time: ")]
    assert sum(text in (MOVED, again) for text in texts) == 1, lines  # as said, or a fact
    assert other in texts, lines


@pytest.mark.parametrize(
    ("uri", "kwargs"),
    [
        ("afterthought://", {}),
        ("afterthought:///", {}),
        ("afterthought://?key_prefix=shop&limit=5", {"key_prefix": "shop", "limit": 5}),
        (
            "afterthought://?context_mode=cached&fact_ttl_days=%7B%22ephemeral%22%3A+3%7D",
            {"context_mode": "cached", "fact_ttl_days": {"ephemeral": 3}},
        ),
    ],
)
def test_an_afterthought_uri_names_settings_by_their_names(uri: str, kwargs: Any) -> None:
    from afterthought.agent_hooks.adk_services import parse_uri

    assert parse_uri(uri) == kwargs


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("afterthought://localhost:6379", "takes no host, path or fragment"),
        ("afterthought://user:hunter2@h/0", "takes no host, path or fragment"),
        ("afterthought://?kee_prefix=shop", "does not know (did you mean key_prefix?)"),
        ("afterthought://?hunter2=1", "a parameter it does not know;"),  # a secret as a name
        ("afterthought://?hunter2=1&hunter2=2", "a parameter it does not know;"),
        ("afterthought://?zep_api_key=z_1", "zep_api_key= is refused"),
        ("afterthought://?redis_url=redis://:pw@h/0", "redis_url= is refused"),
        ("afterthought://?limit=0", "limit= must be 1..50"),
        ("afterthought://?limit=%C2%B2", "limit= must be 1..50"),  # '²', a digit to isdigit
        ("afterthought://?limit=%D9%A3", "limit= must be 1..50"),  # an Arabic-Indic 3
        ("afterthought://?limit=" + "9" * 5000, "limit= must be 1..50"),  # past int()'s digits
        ("afterthought://?key_prefix=a&key_prefix=b", "names key_prefix more than once"),
        ("afterthought://?key_prefix", "must be name=value pairs"),
        ("afterthought://?fact_ttl_days={7", "fact_ttl_days= must be a JSON object"),
    ],
)
def test_an_afterthought_uri_that_cannot_be_used_is_refused_in_one_line(
    uri: str, said: str
) -> None:
    from afterthought.agent_hooks.adk_services import MemoryServiceUriError, parse_uri

    with pytest.raises(MemoryServiceUriError) as caught:
        parse_uri(uri)
    assert said in str(caught.value)
    assert not {"hunter2", "z_1", ":pw@"} & set(str(caught.value).split()), caught.value


def test_a_bad_setting_in_the_uri_is_the_settings_own_error(local_settings: Settings) -> None:
    """Values are checked as the environment's are: named by setting and variable."""
    from afterthought.agent_hooks.adk_services import memory_service_from_uri
    from afterthought.settings import SettingsError

    with pytest.raises(SettingsError, match=r"context_mode \(AFTERTHOUGHT_CONTEXT_MODE\)"):
        memory_service_from_uri("afterthought://?context_mode=sometimes", agents_dir="/x")


def test_the_registered_scheme_builds_the_service_with_the_uris_settings(
    monkeypatch: pytest.MonkeyPatch, local_settings: Settings
) -> None:
    """What ``services.py`` calls: ADK's registry then makes our service from the URI (its
    settings over the environment's), as ``--memory_service_uri`` asks it to."""
    from google.adk.cli.service_registry import get_service_registry

    from afterthought.agent_hooks.adk_services import register

    for name, value in local_settings.as_env().items():
        monkeypatch.setenv(name, value)
    register()
    service = get_service_registry().create_memory_service(
        "afterthought://?key_prefix=shop&limit=3", agents_dir="/agents"
    )
    assert isinstance(service, ZepMemoryService)
    assert (service.settings.key_prefix, service.limit) == ("shop", 3)
    assert service.settings.redis_url == local_settings.redis_url  # the environment's


# --- afterthought adk init: the agents folder's services.py -----------------------------
USERS_OWN = 'from my_company import audit\n\naudit.register("vault")  # no newline after'


def test_adk_init_writes_the_registration_once(tmp_path: Path, local_settings: Settings) -> None:
    first = run_cli(local_settings, "adk", "init", str(tmp_path))
    assert first.returncode == 0 and f"wrote {tmp_path / 'services.py'}" in first.stdout
    assert "adk web --memory_service_uri afterthought://" in first.stdout
    again = run_cli(local_settings, "adk", "init", str(tmp_path))
    assert again.returncode == 0 and "already registers" in again.stdout, again.stdout
    assert (tmp_path / "services.py").read_text() == BLOCK
    compile(BLOCK, "services.py", "exec")


def test_adk_init_keeps_what_a_users_services_py_holds(tmp_path: Path) -> None:
    """Appended after the user's own lines, which stay byte for byte; their permissions
    too; an older block of ours is brought up to date in place, the rest untouched."""
    from afterthought.adk_init import init_agents_dir

    target = tmp_path / "services.py"
    target.write_text(USERS_OWN)
    target.chmod(0o600)
    assert init_agents_dir(tmp_path).startswith("added")
    assert target.read_text() == USERS_OWN + "\n\n" + BLOCK
    assert target.stat().st_mode & 0o777 == 0o600
    assert "already" in init_agents_dir(tmp_path)
    assert target.read_text() == USERS_OWN + "\n\n" + BLOCK

    after = "\nextra = 1\n"
    target.write_text(f"{USERS_OWN}\n{BEGIN}\nimport old_name\n{END}\n{after}")
    assert init_agents_dir(tmp_path).startswith("updated")
    assert target.read_text() == f"{USERS_OWN}\n{BLOCK}{after}"
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left beside it


def test_adk_init_leaves_a_registration_written_by_hand(tmp_path: Path) -> None:
    from afterthought.adk_init import init_agents_dir

    by_hand = "from afterthought.agent_hooks.adk_services import register\nregister()\n"
    (tmp_path / "services.py").write_text(by_hand)
    assert "by hand" in init_agents_dir(tmp_path)
    assert (tmp_path / "services.py").read_text() == by_hand


@pytest.mark.parametrize(
    "mention",
    [
        "# we used to import afterthought.agent_hooks.adk_services here\n",
        'NOTE = "afterthought.agent_hooks.adk_services is registered elsewhere"\n',
        "from afterthought.agent_hooks.adk_services import register\n",  # never called
        f"# our markers quoted in a line: {BEGIN} ... {END}\n",
    ],
)
def test_adk_init_is_not_fooled_by_a_mention_of_the_registration(
    tmp_path: Path, mention: str
) -> None:
    from afterthought.adk_init import init_agents_dir

    (tmp_path / "services.py").write_text(mention)
    assert init_agents_dir(tmp_path).startswith("added")
    assert (tmp_path / "services.py").read_text() == mention + "\n" + BLOCK


@pytest.mark.parametrize(
    "by_hand",
    [
        "from afterthought.agent_hooks.adk_services import register as r\nr()\n",
        "import afterthought.agent_hooks.adk_services as s\ns.register()\n",
        "import afterthought.agent_hooks.adk_services\n"
        "afterthought.agent_hooks.adk_services.register()\n",
    ],
)
def test_adk_init_knows_each_spelling_of_a_registration_by_hand(
    tmp_path: Path, by_hand: str
) -> None:
    from afterthought.adk_init import init_agents_dir

    (tmp_path / "services.py").write_text(by_hand)
    assert "by hand" in init_agents_dir(tmp_path)
    assert (tmp_path / "services.py").read_text() == by_hand


def test_adk_init_writes_through_a_linked_services_py(tmp_path: Path) -> None:
    """A services.py kept elsewhere (a dotfiles repository) stays a link to it."""
    from afterthought.adk_init import AgentsDirError, init_agents_dir

    (tmp_path / "agents").mkdir()
    kept = tmp_path / "kept.py"
    kept.write_text(USERS_OWN)
    link = tmp_path / "agents" / "services.py"
    link.symlink_to(kept)
    assert init_agents_dir(tmp_path / "agents").startswith("added")
    assert link.is_symlink() and kept.read_text() == USERS_OWN + "\n\n" + BLOCK
    kept.unlink()
    with pytest.raises(AgentsDirError, match=r"is a link to .*kept\.py, which does not exist"):
        init_agents_dir(tmp_path / "agents")
    assert link.is_symlink() and not kept.exists()


def test_adk_init_names_the_file_it_cannot_write_or_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from afterthought.adk_init import AgentsDirError, init_agents_dir

    target = tmp_path / "services.py"
    target.write_text("def broken(:\n")
    with pytest.raises(AgentsDirError, match=r"services.py is not valid Python \(line 1\)"):
        init_agents_dir(tmp_path)
    target.write_text(USERS_OWN)

    def refused(**_: object) -> None:  # a folder the user may not write to (tests run as root)
        raise PermissionError(13, "Permission denied", str(tmp_path / ".services-x.py"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(AgentsDirError) as caught:
        init_agents_dir(tmp_path)
    assert f"cannot write {target}: Permission denied" in str(caught.value)
    assert target.read_text() == USERS_OWN


def test_adk_init_says_the_command_quoted_for_a_shell(
    tmp_path: Path, local_settings: Settings
) -> None:
    import shlex

    folder = tmp_path / "my agents; rm -rf ~"
    folder.mkdir()
    done = run_cli(local_settings, "adk", "init", str(folder))
    assert done.returncode == 0, done.stderr
    (then,) = [line for line in done.stdout.splitlines() if line.startswith("then: ")]
    assert shlex.split(then.removeprefix("then: "))[-1] == str(folder)


def test_adk_init_refuses_an_agents_own_folder_and_a_missing_one(
    tmp_path: Path, local_settings: Settings
) -> None:
    """ADK reads services.py of the folder that holds the agents: one written into an
    agent's own folder would be ignored, and the URI refused at start."""
    agent = tmp_path / "my_agent"
    agent.mkdir()
    (agent / "agent.py").write_text("root_agent = None\n")
    refused = run_cli(local_settings, "adk", "init", str(agent))
    assert refused.returncode == 2 and "an agent's own folder" in refused.stderr
    assert str(tmp_path) in refused.stderr and not (agent / "services.py").exists()
    missing = run_cli(local_settings, "adk", "init", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_the_example_agents_folder_is_registered_as_adk_init_writes_it() -> None:
    """The README's ``adk web`` guide runs ``examples/adk_web`` as it is in the repository."""
    from afterthought.adk_init import init_agents_dir

    folder = Path(__file__).resolve().parents[1] / "examples" / "adk_web"
    assert "already registers" in init_agents_dir(folder)
    assert sorted(p.name for p in folder.iterdir() if (p / "agent.py").exists()) == [
        "memory_plugin",
        "memory_tools",
    ]


def test_what_adk_web_keeps_of_the_example_agents_is_not_committed() -> None:
    """``adk web`` writes each agent's sessions under its ``.adk/``: a user's turns."""
    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for agent in ("memory_plugin", "memory_tools"):
        kept = f"examples/adk_web/{agent}/.adk/session.db"
        checked = subprocess.run(["git", "check-ignore", "-q", kept], cwd=root, check=False)
        assert checked.returncode == 0, kept
