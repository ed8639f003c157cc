"""read_file and write_file through the registry, on real files in a real LocalEnvironment:
paging, what is refused (binary, devices, FIFOs, directories, size), writing, and the
path policy as the tools apply it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

import hermes_sandbox.tools.file_tools  # noqa: F401 - registers read_file and write_file
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools.file_tools import MAX_READ_FILE_BYTES, MAX_RETURNED_CHARS
from hermes_sandbox.tools.registry import ToolContext, registry


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def call(tool_ctx: ToolContext, tool: str, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(10):  # nothing here may hang (FIFOs, devices)
        result = json.loads(await registry.adispatch(tool, args, tool_ctx))
    assert isinstance(result, dict)
    return result


def sparse_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: costs no disk


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def numbered(count: int) -> str:
    return "".join(f"line {n}\n" for n in range(1, count + 1))


# -- read_file: paging ----------------------------------------------------------------


@pytest.mark.anyio
async def test_read_whole_small_file(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text(numbered(3))
    result = await call(tool_ctx, "read_file", path="f.txt")
    assert result == {
        "path": str(workspace / "f.txt"),
        "content": numbered(3),
        "total_lines": 3,
        "offset": 1,
        "lines_returned": 3,
        "truncated": False,
    }


@pytest.mark.anyio
async def test_offset_and_limit_are_one_indexed(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text(numbered(10))
    result = await call(tool_ctx, "read_file", path="f.txt", offset=3, limit=2)
    assert result["content"] == "line 3\nline 4\n"
    assert result["offset"] == 3
    assert result["lines_returned"] == 2
    assert result["total_lines"] == 10
    assert result["truncated"] is True
    assert result["next_offset"] == 5
    last = await call(tool_ctx, "read_file", path="f.txt", offset=10, limit=5)
    assert last["content"] == "line 10\n"
    assert last["truncated"] is False
    assert "next_offset" not in last


@pytest.mark.anyio
async def test_paging_with_next_offset_reads_everything_once(
    tool_ctx: ToolContext, workspace: Path
):
    text = numbered(23)
    (workspace / "f.txt").write_text(text)
    pages: list[str] = []
    offset = 1
    while True:
        page = await call(tool_ctx, "read_file", path="f.txt", offset=offset, limit=5)
        pages.append(page["content"])
        if not page["truncated"]:
            break
        offset = page["next_offset"]
    assert "".join(pages) == text
    assert len(pages) == 5


@pytest.mark.anyio
async def test_default_limit_and_past_the_end(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text(numbered(600))
    first = await call(tool_ctx, "read_file", path="f.txt")
    assert first["lines_returned"] == 500
    assert first["next_offset"] == 501
    beyond = await call(tool_ctx, "read_file", path="f.txt", offset=700)
    assert beyond["content"] == ""
    assert beyond["lines_returned"] == 0
    assert beyond["total_lines"] == 600
    assert beyond["truncated"] is False


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [{"offset": 0}, {"limit": 0}, {"offset": -3}, {"offset": "x"}])
async def test_bad_offset_or_limit_is_an_error(
    tool_ctx: ToolContext, workspace: Path, bad: dict
) -> None:
    (workspace / "f.txt").write_text("x\n")
    result = await call(tool_ctx, "read_file", path="f.txt", **bad)
    assert "error" in result


@pytest.mark.anyio
async def test_lines_are_counted_at_newlines_only(tool_ctx: ToolContext, workspace: Path) -> None:
    # form feeds, \x1c and U+2028 are not line breaks for grep -n or sed, nor here
    (workspace / "f.txt").write_text("a\fb\nc\x1cd\u2028e\nno newline at the end")
    result = await call(tool_ctx, "read_file", path="f.txt", offset=2)
    assert result["total_lines"] == 3
    assert result["content"] == "c\x1cd\u2028e\nno newline at the end"
    empty = await call(tool_ctx, "read_file", path=str(workspace / "f.txt"), limit=1)
    assert empty["content"] == "a\fb\n"
    (workspace / "empty.txt").write_text("")
    assert (await call(tool_ctx, "read_file", path="empty.txt"))["total_lines"] == 0


@pytest.mark.anyio
async def test_invalid_utf8_is_replaced_not_refused(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    result = await call(tool_ctx, "read_file", path="latin1.txt")
    assert result["content"] == "caf\ufffd\n"
    assert "not valid UTF-8" in result["note"]
    (workspace / "utf8.txt").write_text("café \ufffd\n")  # a real U+FFFD is text, no note
    assert "note" not in await call(tool_ctx, "read_file", path="utf8.txt")


# -- read_file: the size guard --------------------------------------------------------


@pytest.mark.anyio
async def test_one_call_returns_at_most_the_size_guard(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    line = "x" * 99 + "\n"
    (workspace / "big.txt").write_text(line * 3000)  # 300,000 characters
    result = await call(tool_ctx, "read_file", path="big.txt", limit=3000)
    assert len(result["content"]) <= MAX_RETURNED_CHARS
    assert result["lines_returned"] == MAX_RETURNED_CHARS // 100
    assert result["truncated"] is True
    assert result["next_offset"] == result["lines_returned"] + 1
    assert result["total_lines"] == 3000


@pytest.mark.anyio
async def test_an_overlong_line_is_cut_and_says_so(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "long.txt").write_text("y" * 250_000 + "\nshort\n")
    result = await call(tool_ctx, "read_file", path="long.txt")
    assert result["content"] == "y" * MAX_RETURNED_CHARS
    assert result["lines_returned"] == 1
    assert result["next_offset"] == 2
    assert "line 1 is longer than 100,000 characters" in result["note"]


@pytest.mark.anyio
async def test_files_over_the_read_limit_are_refused(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    sparse_file(workspace / "huge.log", MAX_READ_FILE_BYTES + 1)
    result = await call(tool_ctx, "read_file", path="huge.log")
    assert "over read_file's" in result["error"]


# -- read_file: what is not a text file ----------------------------------------------


@pytest.mark.anyio
async def test_binary_file_is_refused(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    result = await call(tool_ctx, "read_file", path="blob.bin")
    assert "looks like a binary file" in result["error"]


@pytest.mark.anyio
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/random", "/dev/urandom", "/dev/null"])
async def test_devices_are_refused(tool_ctx: ToolContext, device: str) -> None:
    result = await call(tool_ctx, "read_file", path=device)
    assert "is a character device; read_file reads regular files only" in result["error"]


@pytest.mark.anyio
async def test_fifo_is_refused_without_hanging(tool_ctx: ToolContext, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")  # nobody writes to it: opening it would block forever
    result = await call(tool_ctx, "read_file", path="pipe")
    assert "is a named pipe" in result["error"]
    write = await call(tool_ctx, "write_file", path="pipe", content="x")
    assert "it is a named pipe" in write["error"]


@pytest.mark.anyio
async def test_directory_and_missing_file(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    directory = await call(tool_ctx, "read_file", path="sub")
    assert "is a directory, not a file" in directory["error"]
    missing = await call(tool_ctx, "read_file", path="nope.txt")
    assert missing == {"error": "File not found: nope.txt"}
    broken = workspace / "broken"
    broken.symlink_to(workspace / "gone")
    assert (await call(tool_ctx, "read_file", path="broken"))["error"] == "File not found: broken"


@pytest.mark.anyio
async def test_read_through_a_symlink_reports_the_real_path(tool_ctx: ToolContext, workspace: Path):
    (workspace / "real.txt").write_text("hi\n")
    (workspace / "alias.txt").symlink_to("real.txt")
    result = await call(tool_ctx, "read_file", path="alias.txt")
    assert result["content"] == "hi\n"
    assert result["path"] == str(workspace / "real.txt")


# -- write_file -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_write_creates_parent_directories(tool_ctx: ToolContext, workspace: Path) -> None:
    result = await call(tool_ctx, "write_file", path="a/b/c/new.txt", content="héllo\n")
    assert result == {
        "status": "ok",
        "path": str(workspace / "a/b/c/new.txt"),
        "bytes_written": len("héllo\n".encode()),
        "dirs_created": True,
    }
    assert (workspace / "a/b/c/new.txt").read_text() == "héllo\n"


@pytest.mark.anyio
async def test_dirs_created_only_when_a_parent_was_missing(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "there").mkdir()
    assert (await call(tool_ctx, "write_file", path="there/new.txt", content="x"))[
        "dirs_created"
    ] is False
    assert (await call(tool_ctx, "write_file", path="top.txt", content="x"))[
        "dirs_created"
    ] is False
    assert (await call(tool_ctx, "write_file", path="there/new.txt", content="y"))[
        "dirs_created"
    ] is False  # an existing file
    assert (await call(tool_ctx, "write_file", path="there/sub/new.txt", content="x"))[
        "dirs_created"
    ] is True


@pytest.mark.anyio
async def test_write_overwrites_the_whole_file(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text("a much longer original content\n" * 10)
    await call(tool_ctx, "write_file", path="f.txt", content="short")
    assert (workspace / "f.txt").read_text() == "short"
    await call(tool_ctx, "write_file", path="f.txt", content="")
    assert (workspace / "f.txt").read_text() == ""


@pytest.mark.anyio
async def test_write_to_a_directory_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    result = await call(tool_ctx, "write_file", path="sub", content="x")
    assert result == {"error": "sub is a directory; give a file path"}


@pytest.mark.anyio
async def test_write_through_a_symlink_changes_its_target(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "real.txt").write_text("old")
    (workspace / "alias.txt").symlink_to("real.txt")
    result = await call(tool_ctx, "write_file", path="alias.txt", content="new")
    assert result["path"] == str(workspace / "real.txt")
    assert (workspace / "real.txt").read_text() == "new"
    assert (workspace / "alias.txt").is_symlink()


@pytest.mark.anyio
async def test_write_under_etc_is_refused(tool_ctx: ToolContext) -> None:
    result = await call(tool_ctx, "write_file", path="/etc/hermes-test.conf", content="x")
    assert result["refused"] is True
    assert "under /etc, a protected system directory" in result["error"]
    assert "hermes-test.conf" not in listing(Path("/etc"))


@pytest.mark.anyio
async def test_write_through_a_dangling_symlink(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "trap.conf").symlink_to("/etc/hermes-sandbox-test-trap.conf")
    refused = await call(tool_ctx, "write_file", path="trap.conf", content="x")
    assert "under /etc" in refused["error"]
    assert "hermes-sandbox-test-trap.conf" not in listing(Path("/etc"))
    (workspace / "later.txt").symlink_to("sub/later.txt")
    written = await call(tool_ctx, "write_file", path="later.txt", content="made")
    assert written["path"] == str(workspace / "sub" / "later.txt")
    assert (workspace / "later.txt").read_text() == "made"


# -- the workspace, as the tools apply it ---------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path.resolve() / "outside"
    directory.mkdir()
    return directory


@pytest.fixture
def confined(tool_env: LocalEnvironment, workspace: Path, outside: Path) -> ToolContext:
    (outside / "secret.txt").write_text("secret\n")
    (workspace / "link_out").symlink_to(outside / "secret.txt")
    (workspace / "dir_out").symlink_to(outside)
    (workspace / "inside.txt").write_text("in\n")
    return ToolContext(
        task_id="t", environment=tool_env, cwd=str(workspace), workspace_root=str(workspace)
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", ["link_out", "dir_out/secret.txt", "../outside/secret.txt", "/etc/hostname"]
)
async def test_read_file_refuses_escapes(confined: ToolContext, path: str) -> None:
    result = await call(confined, "read_file", path=path)
    assert result["refused"] is True
    assert "outside the workspace" in result["error"]
    assert "secret" not in result.get("content", "")


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["link_out", "dir_out/new.txt", "../outside/new.txt"])
async def test_write_file_refuses_escapes(confined: ToolContext, outside: Path, path: str):
    result = await call(confined, "write_file", path=path, content="pwned")
    assert result["refused"] is True
    assert "outside the workspace" in result["error"]
    assert listing(outside) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret\n"


@pytest.mark.anyio
async def test_workspace_allows_its_own_files(confined: ToolContext, workspace: Path) -> None:
    assert (await call(confined, "read_file", path="inside.txt"))["content"] == "in\n"
    assert (await call(confined, "write_file", path="new/x.txt", content="ok"))["status"] == "ok"
    assert (workspace / "new/x.txt").read_text() == "ok"


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_the_local_runtime_never_blocks_opening_a_fifo(
    tool_env: LocalEnvironment, tmp_path: Path
) -> None:
    """A path that became a named pipe after the tools checked it: read_bytes and
    write_bytes refuse it at once and say what it is, where a plain open() waited for
    the pipe's other end forever."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with anyio.fail_after(5):
        with pytest.raises(OSError, match=r"named pipe.*regular files only"):
            await tool_env.read_bytes(str(pipe))
        with pytest.raises(OSError, match=r"named pipe.*regular files only"):
            await tool_env.write_bytes(str(pipe), b"x")
        reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # now a reader waits
        try:
            with pytest.raises(OSError, match=r"named pipe.*regular files only"):
                await tool_env.write_bytes(str(pipe), b"x")
        finally:
            os.close(reader)
        with pytest.raises(OSError, match="character device"):
            await tool_env.read_bytes("/dev/null")
        (tmp_path / "plain").write_text("still read\n")
        assert await tool_env.read_bytes(str(tmp_path / "plain")) == b"still read\n"
        await tool_env.write_bytes(str(tmp_path / "plain"), b"still written\n")
        assert (tmp_path / "plain").read_bytes() == b"still written\n"
