"""Tests for the patch tool: real files in tmp_path, edited through a real LocalEnvironment.

Every call goes through ``registry.adispatch``, as a script's call would. The rollback
test uses a local environment whose writes to one path fail, the way a full disk does.
"""

from __future__ import annotations

import errno
import os
import stat
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from patching import call, snapshot, v4a

import hermes_sandbox.tools.patch_tool as patch_tool
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools.patch_format import parse_patch
from hermes_sandbox.tools.patch_hunks import apply_hunks
from hermes_sandbox.tools.patch_text import PatchError
from hermes_sandbox.tools.registry import ToolContext, registry

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def env(anyio_backend: str) -> AsyncIterator[LocalEnvironment]:
    async with LocalEnvironment() as environment:
        yield environment


@pytest.fixture
def ctx(env: LocalEnvironment, tmp_path: Path) -> ToolContext:
    return ToolContext(task_id="t", environment=env, cwd=str(tmp_path))


class FailingWrites(LocalEnvironment):
    """A local environment whose writes to one path fail with ENOSPC."""

    def __init__(self, failing_path: str) -> None:
        super().__init__()
        self.failing_path = failing_path

    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        if path == self.failing_path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        await super().write_bytes(path, data, make_parents=make_parents, mode=mode)


async def call_with_a_failing_write(tmp_path: Path, failing: str, patch: str) -> dict[str, Any]:
    """The patch tool's result when writing ``tmp_path / failing`` fails (a full disk)."""
    async with FailingWrites(str(tmp_path / failing)) as env:
        ctx = ToolContext(task_id="t", environment=env, cwd=str(tmp_path))
        return await call(ctx, patch=patch)


def test_registered_in_the_file_toolset() -> None:
    entry = registry.get("patch")
    assert entry is not None and entry.toolset == "file"
    assert entry.handler is patch_tool.patch


# -- replace mode ---------------------------------------------------------------------


async def test_replace_once_writes_and_returns_a_diff(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "app.py"
    target.write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    result = await call(
        ctx, path="app.py", old_string="def g():\n    return 2", new_string="def g():\n    return 3"
    )
    assert result["status"] == "ok"
    assert result["path"] == str(target)
    assert result["replacements"] == 1
    assert "-    return 2" in result["diff"] and "+    return 3" in result["diff"]
    assert "@@ -3,4 +3,4 @@" in result["diff"]  # line numbers of the real file
    assert target.read_text() == "def f():\n    return 1\n\n\ndef g():\n    return 3\n"


async def test_replace_keeps_crlf_line_endings(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = await call(ctx, path="win.txt", old_string="one\ntwo", new_string="one\n1.5\ntwo")
    assert result["status"] == "ok", result
    assert target.read_bytes() == b"one\r\n1.5\r\ntwo\r\nthree\r\n"
    assert "\r" not in result["diff"]


async def test_replace_unicode(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "üñí.txt"
    target.write_text("café ☕ 日本語\nλ = 1\n", encoding="utf-8")
    result = await call(ctx, path="üñí.txt", old_string="日本語", new_string="にほんご 🎌")
    assert result["status"] == "ok", result
    assert target.read_text(encoding="utf-8") == "café ☕ にほんご 🎌\nλ = 1\n"
    assert "+café ☕ にほんご 🎌" in result["diff"]


async def test_replace_keeps_bytes_that_are_not_utf8(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "latin1.txt"
    target.write_bytes(b"caf\xe9\nprice: 10\n")
    result = await call(ctx, path="latin1.txt", old_string="10", new_string="12")
    assert result["status"] == "ok", result
    assert target.read_bytes() == b"caf\xe9\nprice: 12\n"


async def test_replace_keeps_the_file_mode(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "run.sh"
    target.write_text("echo hi\n")
    target.chmod(0o755)
    assert (await call(ctx, path="run.sh", old_string="hi", new_string="ho"))["status"] == "ok"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


async def test_replace_path_with_spaces_and_quotes(ctx: ToolContext, tmp_path: Path) -> None:
    folder = tmp_path / 'it\'s a "dir"'
    folder.mkdir()
    target = folder / "my file $HOME.txt"
    target.write_text("alpha\n")
    result = await call(
        ctx, path='it\'s a "dir"/my file $HOME.txt', old_string="alpha", new_string="beta"
    )
    assert result["status"] == "ok", result
    assert target.read_text() == "beta\n"


async def test_replace_not_found(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    result = await call(ctx, path="a.txt", old_string="goodbye", new_string="x")
    assert "not found" in result["error"]
    assert "whitespace" not in result["error"]


async def test_replace_not_found_points_at_a_whitespace_insensitive_match(
    ctx: ToolContext, tmp_path: Path
) -> None:
    (tmp_path / "a.py").write_text("import os\n\nif x:\n\tcall(a,  b)\n")
    result = await call(ctx, path="a.py", old_string="if x:\n    call(a, b)", new_string="pass")
    assert "not found" in result["error"]
    assert "line 3" in result["error"] and "whitespace" in result["error"]
    assert (tmp_path / "a.py").read_text() == "import os\n\nif x:\n\tcall(a,  b)\n"


async def test_replace_ambiguous_lists_every_line(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("x = 1\ny = 2\nx = 1\n\nx = 1\n")
    result = await call(ctx, path="a.txt", old_string="x = 1", new_string="x = 9")
    assert "3 times" in result["error"]
    assert "lines 1, 3, 5" in result["error"]
    assert "replace_all" in result["error"]
    assert target.read_text() == "x = 1\ny = 2\nx = 1\n\nx = 1\n"


async def test_replace_all(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("x = 1\ny = 2\nx = 1\n")
    result = await call(ctx, path="a.txt", old_string="x = 1", new_string="x = 9", replace_all=True)
    assert result["replacements"] == 2
    assert target.read_text() == "x = 9\ny = 2\nx = 9\n"


async def test_replace_diff_is_capped(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "big.txt"
    target.write_text("start\n")
    new = "start\n" + "".join(f"line {i} {'x' * 60}\n" for i in range(2000))
    result = await call(ctx, path="big.txt", old_string="start\n", new_string=new)
    assert result["status"] == "ok"
    assert len(result["diff"]) <= patch_tool.MAX_DIFF_CHARS + 100
    assert "diff truncated" in result["diff"]
    assert target.read_text() == new


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"path": "missing.txt", "old_string": "a", "new_string": "b"}, "File not found"),
        ({"path": "folder", "old_string": "a", "new_string": "b"}, "is a directory"),
        ({"path": "blob.bin", "old_string": "a", "new_string": "b"}, "binary"),
        ({"path": "a.txt", "old_string": "", "new_string": "b"}, "needs old_string"),
        ({"path": "a.txt", "old_string": "a", "new_string": "a"}, "identical"),
        ({"old_string": "a", "new_string": "b"}, "needs a path"),
        ({"path": "a.txt", "old_string": "a"}, "needs new_string"),
        ({"path": "a.txt", "old_string": "a", "new_string": "b", "mode": "x"}, "mode"),
        (
            {"path": "a.txt", "old_string": "a", "new_string": "b", "replace_all": "maybe"},
            "replace_all",
        ),
    ],
)
async def test_replace_refuses(
    ctx: ToolContext, tmp_path: Path, args: dict[str, Any], expected: str
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "blob.bin").write_bytes(b"a\0b")
    before = snapshot(tmp_path)
    result = await call(ctx, **args)
    assert expected in result["error"]
    assert snapshot(tmp_path) == before


async def test_arguments_left_out_by_the_stub_arrive_as_none(
    ctx: ToolContext, tmp_path: Path
) -> None:
    # The generated hermes_tools.patch sends every optional parameter, None when unset.
    (tmp_path / "a.txt").write_text("a\n")
    result = await call(
        ctx, path="a.txt", old_string="a", new_string="b", replace_all=None, mode=None, patch=None
    )
    assert result["status"] == "ok"


async def test_writes_outside_the_workspace_are_refused(
    env: LocalEnvironment, tmp_path: Path
) -> None:
    inside = tmp_path / "work"
    inside.mkdir()
    (tmp_path / "outside.txt").write_text("a\n")
    (inside / "link.txt").symlink_to(tmp_path / "outside.txt")
    ctx = ToolContext(task_id="t", environment=env, cwd=str(inside), workspace_root=str(inside))
    for path in ("../outside.txt", "link.txt"):
        result = await call(ctx, path=path, old_string="a", new_string="b")
        assert "outside the workspace" in result["error"], path
        assert result["refused"] is True
    result = await call(ctx, patch="*** Begin Patch\n*** Add File: ../new.txt\n+x\n*** End Patch\n")
    assert "outside the working directory" in result["error"]
    assert (tmp_path / "outside.txt").read_text() == "a\n"
    assert not (tmp_path / "new.txt").exists()


# -- patch mode -----------------------------------------------------------------------


async def test_patch_adds_updates_moves_and_deletes(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(
        "import os\n\n\ndef main():\n    print('hi')\n    return 0\n"
    )
    (tmp_path / "notes it's.txt").write_text("keep\nold\n")
    (tmp_path / 'gone "soon".txt').write_text("bye\n")
    result = await call(
        ctx,
        mode="patch",
        patch=v4a(
            """
            *** Begin Patch
            *** Add File: new dir/hello $USER.txt
            +line 1
            +
            +line 3
            *** Update File: src/app.py
            @@ def main():
                 print('hi')
            -    return 0
            +    return 1
            *** Update File: notes it's.txt
            *** Move to: archive/notes it's.txt
            @@
             keep
            -old
            +new
            *** Delete File: gone "soon".txt
            *** End Patch
            """
        ),
    )
    assert result["status"] == "ok", result
    assert result["files"] == [
        {"path": str(tmp_path / "new dir" / "hello $USER.txt"), "action": "add"},
        {"path": str(tmp_path / "src" / "app.py"), "action": "update"},
        {
            "path": str(tmp_path / "notes it's.txt"),
            "action": "update",
            "moved_to": str(tmp_path / "archive" / "notes it's.txt"),
        },
        {"path": str(tmp_path / 'gone "soon".txt'), "action": "delete"},
    ]
    assert snapshot(tmp_path) == {
        "new dir/hello $USER.txt": b"line 1\n\nline 3\n",
        "src/app.py": b"import os\n\n\ndef main():\n    print('hi')\n    return 1\n",
        "archive/notes it's.txt": b"keep\nnew\n",
    }
    diff = result["diff"]
    assert "+++ b/new dir/hello $USER.txt" in diff
    assert "--- a/notes it's.txt\n+++ b/archive/notes it's.txt" in diff
    assert "+++ /dev/null" in diff and "-bye" in diff


async def test_patch_is_the_default_mode_when_patch_is_given(
    ctx: ToolContext, tmp_path: Path
) -> None:
    result = await call(ctx, patch="*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch")
    assert result["status"] == "ok"
    assert (tmp_path / "a.txt").read_text() == "a\n"


_CLASS_A_FIRST = """
    @@ class A:
    +    x = 0
    @@ class B:
    @@     def run(self):
    -        return 1
    +        return 2
"""
_CLASS_B_FIRST = """
    @@ class B:
    @@     def run(self):
    -        return 1
    +        return 2
    @@ class A:
    +    x = 0
"""


@pytest.mark.parametrize(
    "hunks", [_CLASS_A_FIRST, _CLASS_B_FIRST], ids=["in-order", "out-of-order"]
)
async def test_patch_hunks_anchors_and_end_of_file(
    ctx: ToolContext, tmp_path: Path, hunks: str
) -> None:
    target = tmp_path / "m.py"
    target.write_text(
        "class A:\n    def run(self):\n        return 1\n\n"
        "class B:\n    def run(self):\n        return 1\n\n# end\n"
    )
    body = textwrap.dedent(hunks).strip("\n")
    text = (
        "*** Begin Patch\n*** Update File: m.py\n"
        + body
        + "\n@@\n-# end\n+# the end\n*** End of File\n*** End Patch\n"
    )
    # Nested anchors narrow the search to B's run(); "class A:" is found even when its
    # hunk comes after a hunk further down the file (an anchor is a hint, not an order).
    result = await call(ctx, patch=text)
    assert result["status"] == "ok", result
    assert target.read_text() == (
        "class A:\n    x = 0\n    def run(self):\n        return 1\n\n"
        "class B:\n    def run(self):\n        return 2\n\n# the end\n"
    )


async def test_an_anchor_for_added_lines_alone_must_name_one_line(
    ctx: ToolContext, tmp_path: Path
) -> None:
    target = tmp_path / "m.py"
    target.write_text("def f():\n    pass\n\ndef g():\n    pass\n")
    for anchor, expected in (("def h", "was not found"), ("pass", "fits lines 2, 5")):
        result = await call(
            ctx, patch=f"*** Begin Patch\n*** Update File: m.py\n@@ {anchor} @@\n+x = 1\n"
        )
        assert expected in result["error"], result
    assert target.read_text() == "def f():\n    pass\n\ndef g():\n    pass\n"


async def test_patch_accepts_a_unified_diff_hunk_header(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    result = await call(
        ctx,
        patch="*** Begin Patch\n*** Update File: a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
        "*** End Patch\n",
    )
    assert result["status"] == "ok", result
    assert (tmp_path / "a.txt").read_text() == "one\n2\nthree\n"


async def test_patch_tolerates_trailing_whitespace(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("alpha   \nbeta\t\ngamma\n")
    result = await call(
        ctx,
        patch="*** Begin Patch\n*** Update File: a.txt\n alpha\n-beta\n+BETA\n gamma  \n"
        "*** End Patch",
    )
    assert result["status"] == "ok", result
    assert target.read_text() == "alpha   \nBETA\ngamma\n"


async def test_patch_keeps_crlf_and_a_missing_final_newline(
    ctx: ToolContext, tmp_path: Path
) -> None:
    (tmp_path / "win.txt").write_bytes(b"a\r\nb\r\nc\r\n")
    (tmp_path / "tail.txt").write_bytes(b"x\ny")
    result = await call(
        ctx,
        patch=v4a(
            """
            *** Begin Patch
            *** Update File: win.txt
             a
            -b
            +B1
            +B2
             c
            *** Update File: tail.txt
             x
            -y
            +z
            *** End Patch
            """
        ),
    )
    assert result["status"] == "ok", result
    assert (tmp_path / "win.txt").read_bytes() == b"a\r\nB1\r\nB2\r\nc\r\n"
    assert (tmp_path / "tail.txt").read_bytes() == b"x\nz"


async def test_patch_unicode(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "ü.txt").write_text("ça va\n日本\n", encoding="utf-8")
    result = await call(
        ctx,
        patch="*** Begin Patch\n*** Update File: ü.txt\n ça va\n-日本\n+日本語 🎌\n"
        "*** Add File: 新しい.txt\n+ñ\n*** End Patch",
    )
    assert result["status"] == "ok", result
    assert (tmp_path / "ü.txt").read_text(encoding="utf-8") == "ça va\n日本語 🎌\n"
    assert (tmp_path / "新しい.txt").read_text(encoding="utf-8") == "ñ\n"


async def test_patch_whose_third_file_fails_changes_nothing(
    ctx: ToolContext, tmp_path: Path
) -> None:
    for name in ("one.txt", "two.txt", "three.txt"):
        (tmp_path / name).write_text(f"{name}\nvalue = 1\n")
    before = snapshot(tmp_path)
    result = await call(
        ctx,
        patch=v4a(
            """
            *** Begin Patch
            *** Update File: one.txt
            -value = 1
            +value = 2
            *** Update File: two.txt
            -value = 1
            +value = 2
            *** Update File: three.txt
             three.txt
            -value = 7
            +value = 2
            *** End Patch
            """
        ),
    )
    error = result["error"]
    assert "three.txt" in error and "hunk 1" in error and "does not match" in error
    assert "no file was changed" in error
    assert "one.txt" not in error.replace("three.txt", "")
    assert snapshot(tmp_path) == before


async def test_patch_reports_every_problem_at_once(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "exists.txt").write_text("x\n")
    (tmp_path / "taken.txt").write_text("x\n")
    before = snapshot(tmp_path)
    result = await call(
        ctx,
        patch=v4a(
            """
            *** Begin Patch
            *** Add File: exists.txt
            +new
            *** Update File: missing.txt
            -a
            +b
            *** Delete File: also-missing.txt
            *** Update File: exists.txt
            *** Move to: taken.txt
            *** End Patch
            """
        ),
    )
    error = result["error"]
    assert "4 problems" in error
    assert "Add File exists.txt" in error and "already exists" in error
    assert "Update File missing.txt" in error and "File not found" in error
    assert "Delete File also-missing.txt" in error
    assert "cannot move to taken.txt" in error
    assert snapshot(tmp_path) == before


async def test_patch_refuses_to_move_onto_an_existing_file(
    ctx: ToolContext, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    result = await call(
        ctx, patch="*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n*** End Patch"
    )
    assert "cannot move to b.txt" in result["error"]
    assert snapshot(tmp_path) == {"a.txt": b"a\n", "b.txt": b"b\n"}


async def test_patch_move_keeps_the_file_mode(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("echo a\n")
    (tmp_path / "run.sh").chmod(0o750)
    result = await call(
        ctx,
        patch="*** Begin Patch\n*** Update File: run.sh\n*** Move to: bin/run.sh\n-echo a\n"
        "+echo b\n*** End Patch",
    )
    assert result["status"] == "ok", result
    moved = tmp_path / "bin" / "run.sh"
    assert moved.read_text() == "echo b\n" and not (tmp_path / "run.sh").exists()
    assert stat.S_IMODE(moved.stat().st_mode) == 0o750


async def test_a_failed_write_rolls_everything_back(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("1\n")
    (tmp_path / "old name.txt").write_text("moved\n")
    (tmp_path / "bye.txt").write_text("bye\n")
    (tmp_path / "three.txt").write_text("3\n")
    before = snapshot(tmp_path)
    result = await call_with_a_failing_write(
        tmp_path,
        "three.txt",
        v4a(
            """
            *** Begin Patch
            *** Add File: sub/added.txt
            +added
            *** Update File: one.txt
            -1
            +one
            *** Update File: old name.txt
            *** Move to: new 'name'.txt
            -moved
            +moved!
            *** Delete File: bye.txt
            *** Update File: three.txt
            -3
            +three
            *** End Patch
            """
        ),
    )
    assert "three.txt" in result["error"] and "No space left" in result["error"]
    assert "rolled back" in result["error"]
    after = snapshot(tmp_path)
    assert after == before
    assert not (tmp_path / "new 'name'.txt").exists()


async def test_operations_on_one_file_are_played_in_order(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text("echo a\n")
    (tmp_path / "a.sh").chmod(0o750)
    (tmp_path / "x.txt").write_text("x\n")
    (tmp_path / "y.txt").write_text("y\n")
    result = await call(
        ctx,
        patch=v4a(
            """
            *** Begin Patch
            *** Move File: a.sh -> bin/a.sh
            *** Update File: bin/a.sh
            -echo a
            +echo b
            *** Move File: x.txt -> tmp.txt
            *** Move File: y.txt -> x.txt
            *** Move File: tmp.txt -> y.txt
            *** Add File: new.txt
            +1
            *** Update File: new.txt
            -1
            +2
            *** End Patch
            """
        ),
    )
    assert result["status"] == "ok", result
    assert snapshot(tmp_path) == {
        "bin/a.sh": b"echo b\n",
        "x.txt": b"y\n",
        "y.txt": b"x\n",
        "new.txt": b"2\n",
    }
    # The moved file was renamed, not rewritten: it keeps its mode.
    assert stat.S_IMODE((tmp_path / "bin" / "a.sh").stat().st_mode) == 0o750
    assert "a.sh renamed to bin/a.sh unchanged\n--- a/bin/a.sh" in result["diff"]


async def test_a_failed_write_rolls_back_a_move_and_a_replaced_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    (tmp_path / "c.txt").write_text("c\n")
    before = snapshot(tmp_path)
    result = await call_with_a_failing_write(
        tmp_path,
        "z.txt",
        v4a(
            """
            *** Begin Patch
            *** Delete File: b.txt
            *** Move File: a.txt -> b.txt
            *** Update File: b.txt
            -a
            +moved
            *** Delete File: c.txt
            *** Add File: c.txt
            +new c
            *** Add File: z.txt
            +z
            *** End Patch
            """
        ),
    )
    assert "z.txt" in result["error"] and "rolled back" in result["error"], result
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("patch_text", "expected"),
    [
        ("*** Begin Patch\n*** Add File: b.txt\n+b\n*** End Patch\n*** Add File: c.txt", "after"),
        ("*** Delete File: a.txt\n*** Begin Patch\n*** Add File: b.txt\n+b\n", "before"),
        ("*** Add File: b.txt\n+b\n*** Update File: a.txt\n-a\n+b\n x\n", "hunk 1"),
        ("*** Begin Patch\n*** End Patch", "changes no file"),
        ("*** Begin Patch\n*** Add File: a.txt\nno plus\n*** End Patch", "patch line 3"),
        ("*** Begin Patch\n*** Update File: a.txt\n*** End Patch", "has no hunks"),
        ("*** Begin Patch\n*** Update File: a.txt\n@@\n a\n*** End Patch", "changes nothing"),
        ("*** Begin Patch\n*** Update File: a.txt\n?a\n*** End Patch", "patch line 3"),
        ("*** Begin Patch\n*** Frobnicate: a.txt\n*** End Patch", "a file header ('*** Add File:'"),
        ("*** Begin Patch\n*** Delete File: \n*** End Patch", "needs a path"),
        ("   ", "needs patch"),
    ],
)
async def test_malformed_patches_are_refused(
    ctx: ToolContext, tmp_path: Path, patch_text: str, expected: str
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    result = await call(ctx, mode="patch", patch=patch_text)
    assert expected in result["error"]
    assert snapshot(tmp_path) == {"a.txt": b"a\n"}


async def test_a_hunk_that_misses_says_where_its_first_line_is(
    ctx: ToolContext, tmp_path: Path
) -> None:
    (tmp_path / "a.py").write_text("def f():\n    x = 1\n    return x\n")
    result = await call(
        ctx,
        patch="*** Begin Patch\n*** Update File: a.py\n def f():\n-    x = 2\n+    x = 3\n"
        "*** End Patch",
    )
    assert "hunk 1" in result["error"]
    assert "'def f():' is at line 1" in result["error"]


# -- attacks: headers that climb out of the working directory (issue #11) -------------


@pytest.mark.parametrize(
    "header",
    [
        "*** Add File: ../outside.py\n+x",
        "*** Add File: ../../../tmp/outside.py\n+x",
        "*** Add File: sub/../../outside.py\n+x",
        "*** Update File: ../victim.txt\n-victim\n+owned",
        "*** Delete File: ../victim.txt",
        "*** Update File: inside.txt\n*** Move to: ../moved.txt\n-inside\n+moved",
        "*** Move File: inside.txt -> ../moved.txt",
        "*** Move File: ../victim.txt -> stolen.txt",
        "***Delete File: ../victim.txt",
        "*** Move File: inside.txt -> {outside}/moved.txt",
        "*** Add File: {outside}/absolute.py\n+x",
        "*** Delete File: {outside}/victim.txt",
    ],
)
async def test_patch_headers_never_leave_the_working_directory(
    env: LocalEnvironment, tmp_path: Path, header: str
) -> None:
    work = tmp_path / "a" / "b" / "work"  # ../../../tmp is still under tmp_path
    (work / "sub").mkdir(parents=True)
    (work / "inside.txt").write_text("inside\n")
    (work.parent / "victim.txt").write_text("victim\n")
    ctx = ToolContext(task_id="t", environment=env, cwd=str(work))  # no workspace root
    before = snapshot(tmp_path)
    text = "*** Begin Patch\n" + header.format(outside=work.parent) + "\n*** End Patch\n"
    result = await call(ctx, patch=text)
    assert result["refused"] is True
    assert "outside the working directory" in result["error"]
    assert snapshot(tmp_path) == before


async def test_patch_headers_may_name_absolute_paths_inside_the_working_directory(
    ctx: ToolContext, tmp_path: Path
) -> None:
    text = f"*** Begin Patch\n*** Add File: {tmp_path}/sub/./new.txt\n+x\n*** End Patch\n"
    result = await call(ctx, patch=text)
    assert result["status"] == "ok"
    assert (tmp_path / "sub" / "new.txt").read_text() == "x\n"


# -- any text: a list of operations or a PatchError, nothing else -----------------------

_PIECES = st.sampled_from(
    [
        "*** Begin Patch",
        "*** End Patch",
        "*** Add File: a.txt",
        "*** Update File: a.txt",
        "*** Delete File: a.txt",
        "*** Move File: a.txt -> b.txt",
        "*** Move to: c.txt",
        "*** End of File",
        "***Update File:",
        "@@",
        "@@ a @@",
        "@@ -1,2 +1,2 @@ a",
        "\\ No newline at end of file",
        " a",
        "-a",
        "+a",
        "a",
        "",
        "\r",
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_PIECES | st.text(max_size=8), max_size=14),
    st.lists(st.sampled_from(["a", " a", "a ", "b", "", "\ufeffa", "a\r"]), max_size=8),
)
def test_any_text_parses_or_is_refused_and_hunks_fit_or_are_refused(
    pieces: list[str], file_lines: list[str]
) -> None:
    text = "\n".join(file_lines)
    try:
        operations = parse_patch("\n".join(pieces))
    except PatchError:
        return
    for operation in operations:
        try:
            result = apply_hunks(text, operation.hunks)
        except PatchError:
            continue
        assert isinstance(result, str)
