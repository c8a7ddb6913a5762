"""``afterthought adk init`` keeps what services.py holds, however its markers stand: a
begin marker left without its end (an old block cut short by hand) is neither taken for
our block nor deleted with what follows it, and a second run changes nothing."""

from __future__ import annotations

from pathlib import Path

from afterthought.adk_init import BEGIN, BLOCK, init_agents_dir


def test_an_orphan_begin_marker_keeps_the_code_after_it(tmp_path: Path) -> None:
    services = tmp_path / "services.py"
    mine = f"{BEGIN}\nMY_SETTING = 1\n"
    services.write_text(mine, encoding="utf-8")
    init_agents_dir(tmp_path)
    first = services.read_text(encoding="utf-8")
    assert first.startswith(mine) and first.endswith(BLOCK)
    said = init_agents_dir(tmp_path)
    assert "already registers" in said
    assert services.read_text(encoding="utf-8") == first


def test_an_outdated_block_below_an_orphan_marker_is_the_one_updated(tmp_path: Path) -> None:
    services = tmp_path / "services.py"
    mine = f"{BEGIN}\nMY_SETTING = 1\n\n"
    old = BLOCK.replace("_register_afterthought()", "_register_afterthought()  # old")
    services.write_text(mine + old, encoding="utf-8")
    init_agents_dir(tmp_path)
    assert services.read_text(encoding="utf-8") == mine + BLOCK
