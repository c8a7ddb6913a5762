"""``afterthought adk init`` keeps what services.py holds, however its markers stand: a
begin marker left without its end (an old block cut short by hand) is neither taken for
our block nor deleted with what follows it, and a second run changes nothing; its
encoding and line endings are kept, markers quoted in a string are text, and a
``services.py`` that is no regular file is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from afterthought.adk_init import BEGIN, BLOCK, END, AgentsDirError, init_agents_dir


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


def test_a_bom_or_a_declared_encoding_is_read_and_kept(tmp_path: Path) -> None:
    """Python reads a BOM and a coding line (PEP 263): so does init, and it writes the file
    back in the same encoding, its other bytes as they were."""
    services = tmp_path / "services.py"
    for original in (
        "\ufeffGREETING = 'olá'\n".encode(),
        "# -*- coding: latin-1 -*-\nGREETING = 'olá'\n".encode("latin-1"),
    ):
        services.write_bytes(original)
        assert init_agents_dir(tmp_path).startswith("added")
        written = services.read_bytes()
        assert written.startswith(original) and written.endswith(BLOCK.encode())
        assert "already" in init_agents_dir(tmp_path)


def test_windows_line_endings_are_kept_and_the_block_is_found_again(tmp_path: Path) -> None:
    services = tmp_path / "services.py"
    services.write_bytes(b"import os\r\n")
    init_agents_dir(tmp_path)
    written = services.read_bytes()
    assert written == b"import os\r\n\r\n" + BLOCK.replace("\n", "\r\n").encode()
    assert "already" in init_agents_dir(tmp_path)
    assert services.read_bytes() == written


def test_markers_quoted_in_a_docstring_are_not_a_block(tmp_path: Path) -> None:
    """The markers inside a string are text the user wrote, never replaced."""
    services = tmp_path / "services.py"
    quoted = f'"""How to register:\n{BEGIN}\nold\n{END}\n"""\n'
    services.write_text(quoted)
    assert init_agents_dir(tmp_path).startswith("added")
    assert services.read_text() == quoted + "\n" + BLOCK


def test_a_services_py_that_is_no_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "services.py")
    with pytest.raises(AgentsDirError, match="not a regular file"):
        init_agents_dir(tmp_path)
