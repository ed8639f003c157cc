"""Hermes Agent's own file-tool cases for read_file, write_file and search_files
(tests/tools/test_file_tools.py and tests/tools/test_file_operations.py in its
repository), run against the tools as registered, on real files in a real
LocalEnvironment (the ``tool_ctx`` fixture, cwd ``workspace``).

The reference drives its shell-based file layer with a mocked terminal; here each case
makes the files it describes and calls the tool. The comment on each case names the
reference test. Cases where this project deliberately differs assert its own behaviour
and end in ``_DIFFERENT``; docs/compatibility.md lists each with the reason. The patch
tool's cases are ported with the V4A ones.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from toolcalls import call_tool

from hermes_sandbox.environments.testing import FakeEnvironment, FakeSettings
from hermes_sandbox.tools import load_builtin_tools, registry
from hermes_sandbox.tools.file_tools import MAX_READ_FILE_BYTES
from hermes_sandbox.tools.registry import ToolContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME is a fresh directory: a write the policy wrongly let through lands there."""
    directory = tmp_path.resolve() / "home"
    directory.mkdir()
    monkeypatch.setenv("HOME", str(directory))
    return directory


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the process umask after a case that changes it."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def schema_default(tool: str, field: str) -> Any:
    load_builtin_tools()
    return registry.get(tool).parameters["properties"][field]["default"]


# -- read_file ---------------------------------------------------------------------------


# test_file_tools.py::TestReadFileHandler::test_dispatch_without_limit_uses_schema_default
async def test_read_without_limit_uses_the_schema_default(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    limit = schema_default("read_file", "limit")
    (workspace / "long.txt").write_text("".join(f"{n}\n" for n in range(limit + 100)))
    result = await call_tool(tool_ctx, "read_file", path="long.txt")
    assert result["lines_returned"] == limit
    assert result["truncated"] is True


# test_file_tools.py::TestReadFileHandler::test_exception_returns_error_json and
# TestSearchHandler::test_search_exception_returns_error: the environment failing under
# the tool gives an error result naming the failure, not an exception.
@pytest.mark.parametrize(
    ("tool", "args"), [("read_file", {"path": "f.txt"}), ("search_files", {"pattern": "x"})]
)
async def test_environment_failure_is_an_error_result(tool: str, args: dict[str, Any]) -> None:
    load_builtin_tools()
    async with FakeEnvironment(FakeSettings()) as environment:
        pass  # closed: every operation on it now fails
    ctx = ToolContext(task_id="t", environment=environment, cwd="/")
    result = await call_tool(ctx, tool, **args)
    assert "fake environment is closed" in result["error"]


# test_file_operations.py::TestShellFileOpsHelpers::
# test_normalize_read_pagination_clamps_invalid_values: DIFFERENT. There offset 0,
# negative values and a huge limit are clamped into range; here a value out of range is
# an error naming the field and its bound, so the model learns the real limits. Text that
# is a number is still taken as that number.
@pytest.mark.parametrize(
    ("offset", "limit", "field"),
    [(0, 0, "offset"), (-10, -5, "offset"), ("bad", "bad", "offset"), (2, 0, "limit")],
)
async def test_out_of_range_paging_is_an_error_DIFFERENT(
    tool_ctx: ToolContext, workspace: Path, offset: Any, limit: Any, field: str
) -> None:
    (workspace / "f.txt").write_text("a\nb\n")
    result = await call_tool(tool_ctx, "read_file", path="f.txt", offset=offset, limit=limit)
    assert f"args.{field}" in result["error"]
    ok = await call_tool(tool_ctx, "read_file", path="f.txt", offset="2", limit=999_999)
    assert ok["content"] == "b\n" and ok["offset"] == 2


# test_file_operations.py::TestShellFileOpsHelpers::test_is_likely_binary_by_extension and
# TestByteLayerBinaryDetection (test_nul_byte_is_binary, test_elf_header_is_binary,
# test_read_file_still_blocks_nul_binaries): binary files are refused. Here by their
# bytes, whatever the name says.
@pytest.mark.parametrize(
    ("name", "data"),
    [
        pytest.param(
            "photo.png",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            id="test_is_likely_binary_by_extension[png]",
        ),
        pytest.param(
            "data.db",
            b"SQLite format 3\x00" + b"\x00" * 64,
            id="test_is_likely_binary_by_extension[db]",
        ),
        pytest.param("x.exe", b"MZ\x00\x01text", id="test_nul_byte_is_binary"),
        pytest.param(
            "a.out", b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 8, id="test_elf_header_is_binary"
        ),
    ],
)
async def test_binary_files_are_refused(
    tool_ctx: ToolContext, workspace: Path, name: str, data: bytes
) -> None:
    (workspace / name).write_bytes(data)
    result = await call_tool(tool_ctx, "read_file", path=name)
    assert "error" in result and "content" not in result


# TestByteLayerBinaryDetection (test_latin1_text_stays_read_only,
# test_truncated_garbage_tail_after_invalid_prefix_is_binary) and TestReadNonUtf8IsBinary::
# test_replacement_char_sample_flagged_binary: DIFFERENT. There text that is not valid
# UTF-8 is refused as binary, since read_file's lossy text written back would corrupt
# the file. Here it is read (a latin-1 log is still worth reading), its bad bytes shown as
# U+FFFD, and the result's note says so and that writing it back would change them.
@pytest.mark.parametrize(
    ("name", "data"),
    [
        pytest.param("notes.txt", b"caf\xe9 au lait, plus padding", id="latin1"),
        pytest.param("g.txt", b"\xff\xfe" + b"a" * 10 + b"\xe4", id="garbage-tail"),
        pytest.param("lossy.txt", "caf\xe9 r\xe9sum\xe9\n".encode("latin-1"), id="lossy"),
    ],
)
async def test_non_utf8_text_is_read_with_a_note_DIFFERENT(
    tool_ctx: ToolContext, workspace: Path, name: str, data: bytes
) -> None:
    (workspace / name).write_bytes(data)
    result = await call_tool(tool_ctx, "read_file", path=name)
    assert result["content"] == data.decode("utf-8", "replace")
    assert "not valid UTF-8" in result["note"] and "write_file" in result["note"]


# TestByteLayerBinaryDetection (test_cjk_text_cut_mid_character_is_text,
# test_pure_cjk_text_cut_mid_character_is_text, test_emoji_cut_at_boundary_is_text,
# test_utf8_bom_is_text, test_file_containing_real_replacement_char_is_text,
# test_empty_sample_is_text, test_short_ascii_is_text,
# test_read_file_returns_cjk_content_instead_of_binary_error) and TestReadNonUtf8IsBinary::
# test_plain_utf8_text_not_flagged, test_is_likely_binary_by_extension (its text half):
# UTF-8 text is text, wherever a multibyte character falls.
@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("cjk.txt", "a" * 999 + "中文\n", id="test_cjk_text_cut_mid_character_is_text"),
        pytest.param(
            "pure.txt", "汉字" * 400 + "\n", id="test_pure_cjk_text_cut_mid_character_is_text"
        ),
        pytest.param("emoji.txt", "x" * 998 + "🎉\n", id="test_emoji_cut_at_boundary_is_text"),
        pytest.param("bom.txt", "\ufeffhello\n", id="test_utf8_bom_is_text"),
        pytest.param(
            "fffd.log",
            "log: \ufffd bad byte\n",
            id="test_file_containing_real_replacement_char_is_text",
        ),
        pytest.param("empty.txt", "", id="test_empty_sample_is_text"),
        pytest.param("short.txt", "hello\n", id="test_short_ascii_is_text"),
        pytest.param(
            "notes-中文.txt",
            "汉字测试" * 300 + "\n",
            id="test_read_file_returns_cjk_content_instead_of_binary_error",
        ),
        pytest.param("utf8.txt", "café résumé\nsecond\n", id="test_plain_utf8_text_not_flagged"),
        pytest.param("code.py", "print('ok')\n", id="test_is_likely_binary_by_extension[py]"),
        pytest.param("readme.md", "# Title\n", id="test_is_likely_binary_by_extension[md]"),
    ],
)
async def test_utf8_text_is_read(
    tool_ctx: ToolContext, workspace: Path, name: str, text: str
) -> None:
    (workspace / name).write_text(text, encoding="utf-8")
    result = await call_tool(tool_ctx, "read_file", path=name)
    assert "error" not in result, result
    assert result["content"] == text


# -- write_file --------------------------------------------------------------------------


# test_file_tools.py::TestWriteFileHandler::test_missing_content_key_returns_error
async def test_write_without_content_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    result = await call_tool(tool_ctx, "write_file", path="oops.md")
    assert "content" in result["error"]
    assert not (workspace / "oops.md").exists()


# test_file_tools.py::TestWriteFileHandler::test_missing_path_key_returns_error
async def test_write_without_path_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    result = await call_tool(tool_ctx, "write_file", content="hello")
    assert "path" in result["error"]
    assert not (workspace / "hello").exists()


# test_file_tools.py::TestWriteFileHandler::test_explicit_empty_content_is_allowed
async def test_write_empty_content_truncates(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "empty.txt").write_text("old\n")
    result = await call_tool(tool_ctx, "write_file", path="empty.txt", content="")
    assert "error" not in result, result
    assert (workspace / "empty.txt").read_bytes() == b""


# test_file_tools.py::TestWriteFileHandler::test_non_string_content_returns_error
async def test_write_non_string_content_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    result = await call_tool(tool_ctx, "write_file", path="x.txt", content={"nested": "dict"})
    assert "content" in result["error"] and "string" in result["error"]
    assert not (workspace / "x.txt").exists()


# test_file_tools.py::TestWriteFileHandler::
# test_permission_error_returns_error_json_without_error_log: a write the file system
# refuses is an error result (a parent that is a file: even root cannot write there).
async def test_write_the_system_refuses_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "plain").write_text("x")
    result = await call_tool(tool_ctx, "write_file", path="plain/out.txt", content="data")
    assert "error" in result and "refused" not in result, result
    assert (workspace / "plain").read_text() == "x"


# test_file_tools.py::TestWriteFileHandler::test_rejects_read_file_line_numbered_content:
# DIFFERENT. There content that looks like read_file's "N|line" display is refused, since
# its read_file numbers lines. Here read_file returns the file's text as it is, so such
# content is the caller's own data (a table, a log) and is written unchanged.
async def test_line_numbered_looking_content_is_written_DIFFERENT(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    content = " 1|setting: new_value\n 2|other: thing\n"
    result = await call_tool(tool_ctx, "write_file", path="config.yaml", content=content)
    assert "error" not in result, result
    assert (workspace / "config.yaml").read_text() == content
    read = await call_tool(tool_ctx, "read_file", path="config.yaml")
    assert read["content"] == content  # what read_file returns has no line numbers added


# test_file_tools.py::TestSensitivePathCheck::test_system_path_still_blocked
async def test_system_path_is_refused(tool_ctx: ToolContext) -> None:
    before = Path("/etc/passwd").read_bytes()  # noqa: ASYNC240 - a small local file
    result = await call_tool(tool_ctx, "write_file", path="/etc/passwd", content="evil")
    assert result.get("refused") is True and "/etc" in result["error"]
    assert Path("/etc/passwd").read_bytes() == before  # noqa: ASYNC240


# test_file_tools.py::TestSensitivePathCheck::test_normal_file_not_blocked
async def test_normal_file_is_written(tool_ctx: ToolContext, workspace: Path) -> None:
    result = await call_tool(tool_ctx, "write_file", path="other.txt", content="hello")
    assert "error" not in result, result
    assert (workspace / "other.txt").read_text() == "hello"


# test_file_operations.py::TestIsWriteDenied (test_ssh_authorized_keys_denied,
# test_netrc_denied, test_credential_config_files_denied, test_aws_prefix_denied) and
# TestShellFileOpsWriteDenied::test_write_file_denied_path: credential files in the home
# directory are refused.
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("~/.ssh/authorized_keys", id="test_ssh_authorized_keys_denied"),
        pytest.param("~/.netrc", id="test_netrc_denied"),
        pytest.param("~/.pgpass", id="test_credential_config_files_denied[.pgpass]"),
        pytest.param("~/.npmrc", id="test_credential_config_files_denied[.npmrc]"),
        pytest.param("~/.pypirc", id="test_credential_config_files_denied[.pypirc]"),
        pytest.param("~/.aws/credentials", id="test_aws_prefix_denied"),
    ],
)
async def test_credential_files_are_refused(tool_ctx: ToolContext, home: Path, path: str) -> None:
    result = await call_tool(tool_ctx, "write_file", path=path, content="evil key")
    assert result.get("refused") is True, result
    assert not (home / path[2:]).exists()


# test_file_operations.py::TestAtomicWriteNewFilePermissions::
# test_new_file_gets_umask_default_permissions
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
async def test_new_file_gets_the_umask_default_mode(
    tool_ctx: ToolContext, workspace: Path, umask: None, mask: int
) -> None:
    os.umask(mask)
    result = await call_tool(tool_ctx, "write_file", path="new_file.txt", content="test content\n")
    assert "error" not in result, result
    assert (workspace / "new_file.txt").read_text() == "test content\n"
    assert stat.S_IMODE((workspace / "new_file.txt").stat().st_mode) == 0o666 & ~mask


# test_file_operations.py::TestAtomicWriteNewFilePermissions::
# test_overwrite_still_preserves_existing_mode
async def test_overwrite_keeps_the_mode(tool_ctx: ToolContext, workspace: Path) -> None:
    script = workspace / "existing.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    result = await call_tool(
        tool_ctx, "write_file", path="existing.sh", content="#!/bin/sh\necho updated\n"
    )
    assert "error" not in result, result
    assert script.read_text() == "#!/bin/sh\necho updated\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


# test_file_operations.py::TestAtomicWriteThroughSymlink::
# test_write_follows_symlink_and_preserves_link
async def test_write_through_a_symlink_keeps_the_link(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    real, link = workspace / "real.txt", workspace / "link.txt"
    real.write_text("original\n")
    link.symlink_to(real)
    result = await call_tool(tool_ctx, "write_file", path="link.txt", content="newcontent\n")
    assert "error" not in result, result
    assert link.is_symlink() and os.path.realpath(link) == str(real)  # noqa: ASYNC240
    assert real.read_text() == "newcontent\n"


# test_file_operations.py::TestAtomicWriteThroughSymlink::
# test_write_through_broken_symlink_falls_back
async def test_write_through_a_dangling_symlink_creates_the_target(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    target, link = workspace / "target.txt", workspace / "broken.lnk"
    link.symlink_to(target)
    result = await call_tool(tool_ctx, "write_file", path="broken.lnk", content="data\n")
    assert "error" not in result, result
    assert target.read_text() == "data\n"


# -- search_files ------------------------------------------------------------------------


# test_file_operations.py::TestSearchPathValidation::test_search_nonexistent_path_returns_error
async def test_search_of_a_missing_path_is_an_error(tool_ctx: ToolContext) -> None:
    result = await call_tool(tool_ctx, "search_files", pattern="pattern", path="/nonexistent/path")
    assert "not found" in result["error"].lower()


# test_file_tools.py::TestSearchHints::test_truncated_hint_with_nonzero_offset: a cut
# result says where the next page starts.
async def test_truncated_search_gives_the_next_offset(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "a.py").write_text("foo\n" * 150)
    result = await call_tool(tool_ctx, "search_files", pattern="foo", offset=50, limit=50)
    assert result["truncated"] is True
    assert result["next_offset"] == 100
    assert len(result["matches"]) == 50


def hidden_tree(root: Path) -> tuple[set[str], set[str]]:
    """Visible and hidden .log files under ``root``, as paths relative to it."""
    visible = {"agent.log", "nested/visible.log"}
    hidden = {".hidden/secret.log", "nested/.secret.log"}
    for name in visible | hidden:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    return visible, hidden


# test_file_operations.py::TestSearchFilesFallbackHiddenPaths::
# test_hidden_root_with_hidden_ancestor_includes_files and
# test_normal_root_still_excludes_hidden_descendants: DIFFERENT. There hidden files below
# the searched directory are left out. Here they are searched (as the schema says), since
# what an agent looks for is often hidden (.env.example, .github/workflows); the bulky
# directories (.git, node_modules, __pycache__, .venv) are left out instead.
@pytest.mark.parametrize("root", [".hermes/logs", "repo"], ids=["hidden-ancestor", "normal-root"])
async def test_hidden_files_are_searched_DIFFERENT(
    tool_ctx: ToolContext, workspace: Path, root: str
) -> None:
    visible, hidden = hidden_tree(workspace / root)
    (workspace / root / ".git").mkdir()
    (workspace / root / ".git" / "objects.log").write_text("x")
    result = await call_tool(tool_ctx, "search_files", pattern="*.log", target="files", path=root)
    assert set(result["matches"]) == {f"{root}/{name}" for name in visible | hidden}


# test_file_operations.py::TestSearchPathValidation::test_search_rg_error_exit_code: a search
# the engine cannot run is an error result, not an empty list of matches.
async def test_failed_search_is_an_error(tool_ctx: ToolContext, workspace: Path) -> None:
    (workspace / "a.py").write_text("(\n")
    result = await call_tool(tool_ctx, "search_files", pattern="(")
    assert "error" in result and "matches" not in result


# test_file_operations.py::TestShellFileOpsHelpers::test_read_file_raw_rejects_oversized_file
async def test_oversized_file_is_refused(tool_ctx: ToolContext, workspace: Path) -> None:
    with open(workspace / "big.log", "wb") as f:  # noqa: ASYNC230 - a sparse file, no data written
        f.truncate(MAX_READ_FILE_BYTES + 1)
    result = await call_tool(tool_ctx, "read_file", path="big.log")
    assert f"{MAX_READ_FILE_BYTES + 1:,} bytes" in result["error"] and "limit" in result["error"]


# test_file_tools.py::TestNotFoundCache (test_write_invalidates_read_negative_cache,
# test_out_of_band_creation_defeats_cached_miss,
# test_out_of_band_creation_defeats_cached_search_miss): a path that was missing is found
# as soon as it exists, whoever made it. (Here nothing caches a miss at all.)
async def test_a_file_made_after_a_miss_is_read(tool_ctx: ToolContext, workspace: Path) -> None:
    missing = await call_tool(tool_ctx, "read_file", path="later.txt")
    assert "File not found" in missing["error"]
    await call_tool(tool_ctx, "write_file", path="later.txt", content="after write\n")
    assert (await call_tool(tool_ctx, "read_file", path="later.txt"))["content"] == "after write\n"
    assert "File not found" in (await call_tool(tool_ctx, "read_file", path="oob.txt"))["error"]
    (workspace / "oob.txt").write_text("real content\n")
    assert (await call_tool(tool_ctx, "read_file", path="oob.txt"))["content"] == "real content\n"


async def test_a_directory_made_after_a_miss_is_searched(
    tool_ctx: ToolContext, workspace: Path
) -> None:
    missing = await call_tool(tool_ctx, "search_files", pattern="hi", path="later-dir")
    assert "not found" in missing["error"].lower()
    (workspace / "later-dir").mkdir()
    (workspace / "later-dir" / "x.txt").write_text("hi\n")
    found = await call_tool(tool_ctx, "search_files", pattern="hi", path="later-dir")
    assert found["total"] == 1
