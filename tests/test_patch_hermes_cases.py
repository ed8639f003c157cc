"""Hermes Agent's own V4A patch test cases, ported to this project's patch tool (issue #15).

Each test names the reference case it ports (``tests/tools/test_patch_parser.py`` and
``tests/tools/test_file_tools.py`` in NousResearch/hermes-agent) and keeps what it
asserts, through the patch tool as a script calls it, on real files. The reference checks
its parser's operations and a fake ``file_ops``; here the same patch is applied and the
files and the result are checked. Where this project deliberately differs, the test is
named ``test_differs_...``, asserts this project's behaviour, and the difference is listed
in docs/compatibility.md ("V4A patches"). The cases at the end are the ones issue #15
names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from patching import call, snapshot, v4a

from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools.registry import ToolContext

pytestmark = pytest.mark.anyio

BOM = "\ufeff"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def ctx(anyio_backend: str, tmp_path: Path) -> AsyncIterator[ToolContext]:
    async with LocalEnvironment() as environment:
        yield ToolContext(task_id="hermes-cases", environment=environment, cwd=str(tmp_path))


def put(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


async def applied(ctx: ToolContext, patch: str) -> dict[str, object]:
    result = await call(ctx, mode="patch", patch=patch)
    assert result.get("status") == "ok", result
    return result


async def refused(ctx: ToolContext, root: Path, patch: str) -> str:
    """The error of a patch that must change nothing."""
    before = snapshot(root)
    result = await call(ctx, mode="patch", patch=patch)
    assert "error" in result, result
    assert snapshot(root) == before
    return str(result["error"])


# -- TestParseUpdateFile, TestParseAddFile, TestParseDeleteFile, TestParseMoveFile ------


async def test_basic_update(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseUpdateFile::test_basic_update: '@@ def greet @@' is the hint 'def greet'."""
    put(tmp_path, {"src/main.py": 'def greet():\n    print("hello")\n'})
    await applied(
        ctx,
        v4a(
            """
            *** Begin Patch
            *** Update File: src/main.py
            @@ def greet @@
             def greet():
            -    print("hello")
            +    print("hi")
            *** End Patch
            """
        ),
    )
    assert (tmp_path / "src/main.py").read_text() == 'def greet():\n    print("hi")\n'


async def test_multiple_hunks(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseUpdateFile::test_multiple_hunks: hints that name no line are only hints."""
    put(tmp_path, {"f.py": "a\nb\nx\ny\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: f.py\n@@ first @@\n a\n-b\n+c\n"
        "@@ second @@\n x\n-y\n+z\n*** End Patch",
    )
    assert (tmp_path / "f.py").read_text() == "a\nc\nx\nz\n"


async def test_add_file(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseAddFile::test_add_file."""
    result = await applied(
        ctx,
        '*** Begin Patch\n*** Add File: new/module.py\n+import os\n+\n+print("hello")\n'
        "*** End Patch",
    )
    assert result["files"] == [{"path": str(tmp_path / "new/module.py"), "action": "add"}]
    lines = (tmp_path / "new/module.py").read_text().splitlines()
    assert lines[0] == "import os" and lines[2] == 'print("hello")'


async def test_delete_file(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseDeleteFile::test_delete_file."""
    put(tmp_path, {"old/stuff.py": "x = 1\n"})
    result = await applied(ctx, "*** Begin Patch\n*** Delete File: old/stuff.py\n*** End Patch")
    assert result["files"] == [{"path": str(tmp_path / "old/stuff.py"), "action": "delete"}]
    assert not (tmp_path / "old/stuff.py").exists()


async def test_move_file(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseMoveFile::test_move_file: '*** Move File: old -> new'."""
    put(tmp_path, {"old/path.py": "x = 1\n"})
    result = await applied(
        ctx, "*** Begin Patch\n*** Move File: old/path.py -> new/path.py\n*** End Patch"
    )
    assert result["files"] == [
        {
            "path": str(tmp_path / "old/path.py"),
            "action": "update",
            "moved_to": str(tmp_path / "new/path.py"),
        }
    ]
    assert snapshot(tmp_path) == {"new/path.py": b"x = 1\n"}
    assert "old/path.py renamed to new/path.py unchanged" in str(result["diff"])


# -- TestBoundaryMarkersInContent --------------------------------------------------------


async def test_end_patch_marker_in_add_content_does_not_truncate(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestBoundaryMarkersInContent::test_end_patch_marker_in_add_content_does_not_truncate."""
    await applied(
        ctx,
        "*** Begin Patch\n*** Add File: notes.md\n+doc line one\n+*** End Patch\n"
        "+content after the marker mention\n*** End Patch",
    )
    assert (tmp_path / "notes.md").read_text() == (
        "doc line one\n*** End Patch\ncontent after the marker mention\n"
    )


async def test_begin_patch_marker_in_content_does_not_discard_operations(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestBoundaryMarkersInContent::test_begin_patch_marker_in_content_does_not_discard_..."""
    result = await applied(
        ctx,
        "*** Begin Patch\n*** Add File: first.md\n+first file content\n"
        "*** Add File: second.md\n+*** Begin Patch\n+second file content\n*** End Patch",
    )
    assert [f["path"] for f in result["files"]] == [  # type: ignore[attr-defined]
        str(tmp_path / "first.md"),
        str(tmp_path / "second.md"),
    ]
    assert (tmp_path / "second.md").read_text() == "*** Begin Patch\nsecond file content\n"


async def test_context_line_end_patch_marker_does_not_truncate(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestBoundaryMarkersInContent::test_context_line_end_patch_marker_does_not_truncate."""
    put(tmp_path, {"guide.md": "# section\nold line\n*** End Patch\nlast\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: guide.md\n@@ section @@\n old line\n"
        " *** End Patch\n+new line\n*** End Patch",
    )
    assert (tmp_path / "guide.md").read_text() == (
        "# section\nold line\n*** End Patch\nnew line\nlast\n"
    )


# -- TestParseInvalidPatch -----------------------------------------------------------------


async def test_empty_patch_returns_empty_ops(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseInvalidPatch::test_empty_patch_returns_empty_ops: the parser's [] is, at
    the tool, an error (Hermes's patch tool: "requires non-empty 'patch' content")."""
    put(tmp_path, {"a.txt": "a\n"})
    assert "needs patch" in await refused(ctx, tmp_path, "")


async def test_no_begin_marker_still_parses(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseInvalidPatch::test_no_begin_marker_still_parses."""
    put(tmp_path, {"f.py": "line1\nold\n"})
    await applied(ctx, "*** Update File: f.py\n line1\n-old\n+new\n*** End Patch")
    assert (tmp_path / "f.py").read_text() == "line1\nnew\n"


async def test_multiple_operations(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseInvalidPatch::test_multiple_operations."""
    put(tmp_path, {"b.py": "gone\n", "c.py": "keep\nremove\n"})
    result = await applied(
        ctx,
        "*** Begin Patch\n*** Add File: a.py\n+content_a\n*** Delete File: b.py\n"
        "*** Update File: c.py\n keep\n-remove\n+add\n*** End Patch",
    )
    assert [f["action"] for f in result["files"]] == ["add", "delete", "update"]  # type: ignore[attr-defined]
    assert snapshot(tmp_path) == {"a.py": b"content_a\n", "c.py": b"keep\nadd\n"}


# -- TestApplyUpdate ------------------------------------------------------------------------

_PIPES = 'def run():\n    cmd = "echo a | sed s/a/b/"\n    result = 1\n    return result'


async def test_preserves_non_prefix_pipe_characters_in_unmodified_lines(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestApplyUpdate::test_preserves_non_prefix_pipe_characters_in_unmodified_lines."""
    put(tmp_path, {"sample.py": _PIPES})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: sample.py\n@@ result @@\n     result = 1\n"
        "-    return result\n+    return result + 1\n*** End Patch",
    )
    assert (tmp_path / "sample.py").read_text() == _PIPES + " + 1"


async def test_differs_pure_context_update_is_an_error_not_a_noop(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestApplyUpdate::test_pure_context_update_reports_noop_without_writing (hermes-agent
    0.19): Hermes answered success with noop=True. Deliberate difference: an update that
    changes nothing is an error here (as in Hermes's later "Patch contains no changes"),
    and nothing is written either way."""
    put(tmp_path, {"sample.py": "def run():\n    return 1\n"})
    error = await refused(
        ctx,
        tmp_path,
        "*** Begin Patch\n*** Update File: sample.py\n@@ def run @@\n def run():\n"
        "     return 1\n*** End Patch",
    )
    assert "changes nothing" in error


# -- TestAdditionOnlyHunks ------------------------------------------------------------------


async def test_addition_only_hunk_with_context_hint(ctx: ToolContext, tmp_path: Path) -> None:
    """TestAdditionOnlyHunks::test_addition_only_hunk_with_context_hint."""
    put(tmp_path, {"src/app.py": "def main():\n    pass\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: src/app.py\n@@ def main @@\n+def helper():\n"
        "+    return 42\n*** End Patch",
    )
    written = (tmp_path / "src/app.py").read_text()
    assert written == "def main():\ndef helper():\n    return 42\n    pass\n"


async def test_addition_only_hunk_without_context_hint(ctx: ToolContext, tmp_path: Path) -> None:
    """TestAdditionOnlyHunks::test_addition_only_hunk_without_context_hint."""
    put(tmp_path, {"src/app.py": "existing = True\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: src/app.py\n+def new_func():\n+    return True\n"
        "*** End Patch",
    )
    written = (tmp_path / "src/app.py").read_text()
    assert written.endswith("def new_func():\n    return True\n")
    assert "existing = True" in written


# -- TestReadFileRaw: files over 2,000 lines, lines over 2,000 characters --------------------


async def test_apply_update_file_over_2000_lines(ctx: ToolContext, tmp_path: Path) -> None:
    """TestReadFileRaw::test_apply_update_file_over_2000_lines."""
    lines = [f"line_{i}" for i in range(1, 2501)]
    lines[2200] = "old_value"
    put(tmp_path, {"big.py": "\n".join(lines)})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: big.py\n@@ marker_at_2200 @@\n line_2200\n"
        "-old_value\n+new_value\n*** End Patch",
    )
    written = (tmp_path / "big.py").read_text()
    assert len(written.split("\n")) == 2500
    assert "new_value" in written and "old_value" not in written


async def test_apply_update_preserves_long_lines(ctx: ToolContext, tmp_path: Path) -> None:
    """TestReadFileRaw::test_apply_update_preserves_long_lines."""
    long_line = "x" * 3000
    put(tmp_path, {"wide.py": f"def short_func():\n    return 1\n{long_line}\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: wide.py\n@@ short_func @@\n def short_func():\n"
        "-    return 1\n+    return 2\n*** End Patch",
    )
    written = (tmp_path / "wide.py").read_text()
    assert written == f"def short_func():\n    return 2\n{long_line}\n"
    assert "... [truncated]" not in written


# -- TestValidationPhase --------------------------------------------------------------------


async def test_validation_failure_writes_nothing(ctx: ToolContext, tmp_path: Path) -> None:
    """TestValidationPhase::test_validation_failure_writes_nothing."""
    put(tmp_path, {"a.py": "def good():\n    return 1\n", "b.py": "completely different\n"})
    error = await refused(
        ctx,
        tmp_path,
        "*** Begin Patch\n*** Update File: a.py\n def good():\n-    return 1\n+    return 2\n"
        "*** Update File: b.py\n THIS LINE DOES NOT EXIST\n-    old\n+    new\n*** End Patch",
    )
    assert "not applied" in error and "no file was changed" in error


async def test_all_valid_operations_applied(ctx: ToolContext, tmp_path: Path) -> None:
    """TestValidationPhase::test_all_valid_operations_applied (hermes-agent 0.19)."""
    put(tmp_path, {"a.py": "def foo():\n    return 1\n", "b.py": "def bar():\n    pass\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: a.py\n def foo():\n-    return 1\n+    return 2\n"
        "*** Update File: b.py\n def bar():\n-    pass\n+    return True\n*** End Patch",
    )
    assert snapshot(tmp_path) == {
        "a.py": b"def foo():\n    return 2\n",
        "b.py": b"def bar():\n    return True\n",
    }


async def test_validation_error_identifies_hunk_number(ctx: ToolContext, tmp_path: Path) -> None:
    """TestValidationPhase::test_validation_error_identifies_hunk_number."""
    put(tmp_path, {"a.py": "first = 1\n"})
    error = await refused(
        ctx,
        tmp_path,
        "*** Begin Patch\n*** Update File: a.py\n@@ first @@\n-first = 1\n+first = 2\n"
        "@@ missing @@\n-does_not_exist = 1\n+does_not_exist = 2\n*** End Patch",
    )
    assert "hunk 2" in error.lower()


async def test_add_onto_existing_file_fails_and_preserves_contents(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestValidationPhase::test_add_onto_existing_file_fails_and_preserves_contents."""
    put(tmp_path, {"exists.py": "def keep_me():\n    return 1\n"})
    error = await refused(
        ctx, tmp_path, "*** Begin Patch\n*** Add File: exists.py\n+brand new\n+content\n"
    )
    assert "already exists" in error and "no file was changed" in error


async def test_differs_delete_then_add_same_path_ends_the_file_with_a_newline(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestValidationPhase::test_delete_then_add_same_path_still_validates: the delete
    frees the path for the add. Deliberate difference: an added file ends with a newline
    here (Hermes writes "fresh = True" without one)."""
    put(tmp_path, {"rewrite.py": "old = True\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Delete File: rewrite.py\n*** Add File: rewrite.py\n"
        "+fresh = True\n*** End Patch",
    )
    assert (tmp_path / "rewrite.py").read_text() == "fresh = True\n"


# -- TestApplyDelete ------------------------------------------------------------------------


async def test_delete_diff_contains_removed_lines(ctx: ToolContext, tmp_path: Path) -> None:
    """TestApplyDelete::test_delete_diff_contains_removed_lines."""
    put(tmp_path, {"old/stuff.py": "def old_func():\n    return 42\n"})
    result = await applied(ctx, "*** Begin Patch\n*** Delete File: old/stuff.py\n*** End Patch")
    diff = str(result["diff"])
    assert "-def old_func():" in diff and "-    return 42" in diff and "/dev/null" in diff
    assert not (tmp_path / "old/stuff.py").exists()


async def test_delete_diff_fallback_on_empty_file(ctx: ToolContext, tmp_path: Path) -> None:
    """TestApplyDelete::test_delete_diff_fallback_on_empty_file (and issue #15: it once said
    "renamed to None unchanged")."""
    put(tmp_path, {"empty.py": ""})
    result = await applied(ctx, "*** Begin Patch\n*** Delete File: empty.py\n*** End Patch")
    assert result["diff"] == "Deleted empty file empty.py"
    assert not (tmp_path / "empty.py").exists()


# -- TestCountOccurrences -------------------------------------------------------------------


async def test_count_occurrences_anchor_counterpart(ctx: ToolContext, tmp_path: Path) -> None:
    """TestCountOccurrences::test_basic checks Hermes's substring counter for hints
    ("aa" is twice in "aaa"). Here an @@ line is matched against whole lines, best fit
    first, so "aa" names the line "aa" once and is not ambiguous."""
    put(tmp_path, {"f.txt": "aaa\naa\nb\n"})
    await applied(ctx, "*** Begin Patch\n*** Update File: f.txt\n@@ aa @@\n+x\n*** End Patch")
    assert (tmp_path / "f.txt").read_text() == "aaa\naa\nx\nb\n"
    error = await refused(ctx, tmp_path, "*** Update File: f.txt\n@@ xyz @@\n+y\n")
    assert "'xyz' was not found" in error


# -- TestParseErrorSignalling ---------------------------------------------------------------


async def test_update_with_no_hunks_returns_error(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseErrorSignalling::test_update_with_no_hunks_returns_error."""
    put(tmp_path, {"foo.py": "x\n"})
    assert "has no hunks" in await refused(
        ctx, tmp_path, "*** Begin Patch\n*** Update File: foo.py\n*** End Patch"
    )


async def test_move_without_destination_returns_error(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseErrorSignalling::test_move_without_destination_returns_error (0.19)."""
    put(tmp_path, {"src/foo.py": "x\n"})
    assert "old/path -> new/path" in await refused(
        ctx, tmp_path, "*** Begin Patch\n*** Move File: src/foo.py\n*** End Patch"
    )


async def test_valid_patch_returns_no_error(ctx: ToolContext, tmp_path: Path) -> None:
    """TestParseErrorSignalling::test_valid_patch_returns_no_error."""
    put(tmp_path, {"f.py": "ctx\nold\n"})
    await applied(ctx, "*** Begin Patch\n*** Update File: f.py\n ctx\n-old\n+new\n*** End Patch")
    assert (tmp_path / "f.py").read_text() == "ctx\nnew\n"


# -- TestV4ALspDiagnosticsPropagation -------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "files"),
    [
        (  # test_lsp_diagnostics_propagated_from_write_file_on_add
            "*** Begin Patch\n*** Add File: foo.ts\n+const x: number = 1\n*** End Patch",
            {"foo.ts": b"const x: number = 1\n"},
        ),
        (  # test_lsp_diagnostics_propagated_from_write_file_on_update
            "*** Begin Patch\n*** Update File: bar.ts\n-old\n+new\n*** End Patch",
            {"bar.ts": b"ctx\nnew\nctx\n"},
        ),
        (  # test_lsp_diagnostics_none_when_no_blocks_emitted
            "*** Begin Patch\n*** Add File: foo.py\n+x = 1\n*** End Patch",
            {"foo.py": b"x = 1\n"},
        ),
        (  # test_lsp_diagnostics_combined_across_multiple_files
            "*** Begin Patch\n*** Add File: a.ts\n+const a = 1\n*** Add File: b.ts\n"
            "+const b = 2\n*** End Patch",
            {"a.ts": b"const a = 1\n", "b.ts": b"const b = 2\n"},
        ),
    ],
)
async def test_differs_no_lsp_diagnostics(
    ctx: ToolContext, tmp_path: Path, patch: str, files: dict[str, bytes]
) -> None:
    """TestV4ALspDiagnosticsPropagation (4 cases): Hermes passes its LSP layer's
    diagnostics through. Deliberate difference: there is no LSP or lint layer here; the
    same patches apply and the result has no lsp_diagnostics."""
    put(tmp_path, {"bar.ts": "ctx\nold\nctx\n"} if "bar.ts" in files else {})
    result = await applied(ctx, patch)
    assert "lsp_diagnostics" not in result and "lint" not in result
    assert snapshot(tmp_path) == files


# -- TestDuckTypedWriteFileCompat -------------------------------------------------------------


class RecordingWrites(LocalEnvironment):
    """A local environment that records its writes, and raises ``failure`` if set."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__()
        self.failure = failure
        self.writes: list[str] = []

    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        self.writes.append(path)
        if self.failure is not None:
            raise self.failure
        await super().write_bytes(path, data, make_parents=make_parents, mode=mode)


_X_PATCH = "*** Begin Patch\n*** Update File: f.py\n@@\n-x = 1\n+x = 2\n*** End Patch"


async def test_two_arg_write_file_still_supported(tmp_path: Path) -> None:
    """TestDuckTypedWriteFileCompat::test_two_arg_write_file_still_supported: one write."""
    put(tmp_path, {"f.py": "x = 1\n"})
    async with RecordingWrites() as env:
        ctx = ToolContext(task_id="t", environment=env, cwd=str(tmp_path))
        await applied(ctx, _X_PATCH)
    assert (tmp_path / "f.py").read_text() == "x = 2\n"
    assert env.writes == [str(tmp_path / "f.py")]


async def test_internal_typeerror_not_silently_retried(tmp_path: Path) -> None:
    """TestDuckTypedWriteFileCompat::test_internal_typeerror_not_silently_retried."""
    put(tmp_path, {"f.py": "x = 1\n"})
    async with RecordingWrites(TypeError("bug inside a write")) as env:
        ctx = ToolContext(task_id="t", environment=env, cwd=str(tmp_path))
        result = await call(ctx, patch=_X_PATCH)
    assert "bug inside" in result["error"]
    assert env.writes == [str(tmp_path / "f.py")]
    assert (tmp_path / "f.py").read_text() == "x = 1\n"


# -- TestMoveThenUpdateSameFile ---------------------------------------------------------------


async def test_move_then_update_destination(ctx: ToolContext, tmp_path: Path) -> None:
    """TestMoveThenUpdateSameFile::test_move_then_update_destination."""
    put(tmp_path, {"a.py": "x = 1\nkeep = 2\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Move File: a.py -> b.py\n*** Update File: b.py\n@@\n"
        "-x = 1\n+x = 42\n*** End Patch\n",
    )
    assert snapshot(tmp_path) == {"b.py": b"x = 42\nkeep = 2\n"}


async def test_move_onto_existing_destination_still_rejected(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestMoveThenUpdateSameFile::test_move_onto_existing_destination_still_rejected."""
    put(tmp_path, {"a.py": "1\n", "b.py": "2\n"})
    error = await refused(ctx, tmp_path, "*** Begin Patch\n*** Move File: a.py -> b.py\n")
    assert "already exists" in error


# -- TestCodexGrammarMarkers ------------------------------------------------------------------


async def test_end_of_file_marker_is_not_hunk_content(ctx: ToolContext, tmp_path: Path) -> None:
    """TestCodexGrammarMarkers::test_end_of_file_marker_is_not_hunk_content."""
    put(tmp_path, {"f.py": "def f():\n    return 1\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: f.py\n@@\n def f():\n-    return 1\n"
        "+    return 2\n*** End of File\n*** End Patch\n",
    )
    assert (tmp_path / "f.py").read_text() == "def f():\n    return 2\n"


async def test_differs_move_to_renames_and_edits(ctx: ToolContext, tmp_path: Path) -> None:
    """TestCodexGrammarMarkers::test_move_to_is_rejected_instead_of_silently_dropped:
    Hermes now refuses '*** Move to:' (it once edited the file and skipped the rename).
    Deliberate difference: here it is supported, as in the codex grammar it comes from:
    the file is edited and renamed, both or neither."""
    put(tmp_path, {"old.py": "x = 1\n"})
    result = await applied(
        ctx,
        "*** Begin Patch\n*** Update File: old.py\n*** Move to: new.py\n@@\n-x = 1\n+x = 2\n"
        "*** End Patch\n",
    )
    assert result["files"] == [
        {"path": str(tmp_path / "old.py"), "action": "update", "moved_to": str(tmp_path / "new.py")}
    ]
    assert snapshot(tmp_path) == {"new.py": b"x = 2\n"}


async def test_marker_text_inside_content_is_untouched(ctx: ToolContext, tmp_path: Path) -> None:
    """TestCodexGrammarMarkers::test_marker_text_inside_content_is_untouched."""
    await applied(
        ctx,
        "*** Begin Patch\n*** Add File: notes.md\n+*** End of File\n+*** Move to: elsewhere\n"
        "*** End Patch\n",
    )
    assert (tmp_path / "notes.md").read_text() == "*** End of File\n*** Move to: elsewhere\n"


# -- TestCrlfPatchBody, TestV4ABomRoundTrip ---------------------------------------------------


async def test_crlf_body_applied_to_lf_file(ctx: ToolContext, tmp_path: Path) -> None:
    """TestCrlfPatchBody::test_crlf_body_applied_to_lf_file."""
    put(tmp_path, {"f.py": "def f():\n    x = 1\n    return x\n"})
    await applied(
        ctx,
        "*** Begin Patch\r\n*** Update File: f.py\r\n@@\r\n-    x = 1\r\n+    x = 2\r\n"
        "*** End Patch\r\n",
    )
    assert (tmp_path / "f.py").read_bytes() == b"def f():\n    x = 2\n    return x\n"


async def test_update_preserves_bom(ctx: ToolContext, tmp_path: Path) -> None:
    """TestV4ABomRoundTrip::test_update_preserves_bom."""
    put(tmp_path, {"bom_config.py": BOM + "setting = 'old'\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: bom_config.py\n@@ setting @@\n-setting = 'old'\n"
        "+setting = 'new'\n*** End Patch",
    )
    assert (tmp_path / "bom_config.py").read_bytes() == BOM.encode() + b"setting = 'new'\n"


async def test_update_no_bom_when_original_had_none(ctx: ToolContext, tmp_path: Path) -> None:
    """TestV4ABomRoundTrip::test_update_no_bom_when_original_had_none."""
    put(tmp_path, {"plain.py": "print('hello')\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: plain.py\n@@ print @@\n-print('hello')\n"
        "+print('world')\n*** End Patch",
    )
    assert (tmp_path / "plain.py").read_bytes() == b"print('world')\n"


# -- tests/tools/test_file_tools.py: TestPatchHandler, TestPatchSensitivePathExtraction -------


@pytest.mark.parametrize(
    "patch",
    [  # test_patch_v4a_rejects_traversal_in_update_header / _in_add_header
        "*** Begin Patch\n*** Update File: ../../../etc/shadow\n@@ -1,3 +1,3 @@\n-old\n+new\n",
        "*** Begin Patch\n*** Add File: ../../../tmp/dropped.py\n+print('pwned')\n",
    ],
)
async def test_patch_v4a_rejects_traversal(ctx: ToolContext, tmp_path: Path, patch: str) -> None:
    """TestPatchHandler::test_patch_v4a_rejects_traversal_in_update_header and
    ..._in_add_header."""
    assert "traversal" in (await refused(ctx, tmp_path, patch + "*** End Patch\n")).lower()


async def test_patch_move_to_sensitive_dst_blocked(ctx: ToolContext, tmp_path: Path) -> None:
    """TestPatchSensitivePathExtraction::test_patch_move_to_sensitive_dst_blocked: both
    ends of a Move File are checked; Hermes says "sensitive", this project refuses any
    header outside the working directory."""
    put(tmp_path, {"work.txt": "x\n"})
    result = await call(
        ctx, patch="*** Begin Patch\n*** Move File: work.txt -> /etc/crontab\n*** End Patch\n"
    )
    assert result["refused"] is True and "/etc/crontab" in result["error"]
    assert snapshot(tmp_path) == {"work.txt": b"x\n"}


async def test_patch_update_no_space_after_asterisks_blocked(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """TestPatchSensitivePathExtraction::test_patch_update_no_space_after_asterisks_blocked:
    '***Update File:' is a header (so its path is checked), not content."""
    result = await call(
        ctx, patch="*** Begin Patch\n***Update File: /etc/resolv.conf\n@@ @@\n-old\n+new\n"
    )
    assert result["refused"] is True and "/etc/resolv.conf" in result["error"]


async def test_patch_move_safe_paths_not_blocked(ctx: ToolContext, tmp_path: Path) -> None:
    """TestPatchSensitivePathExtraction::test_patch_move_safe_paths_not_blocked, with
    absolute paths inside the working directory (issue #11 refuses them elsewhere)."""
    put(tmp_path, {"a.txt": "a\n"})
    await applied(ctx, f"*** Begin Patch\n*** Move File: {tmp_path}/a.txt -> {tmp_path}/b.txt\n")
    assert snapshot(tmp_path) == {"b.txt": b"a\n"}


async def test_unknown_mode_errors(ctx: ToolContext) -> None:
    """TestPatchHandler::test_unknown_mode_errors."""
    assert "mode" in (await call(ctx, mode="invalid_mode"))["error"]


# -- issue #15: patches as Hermes users write them ------------------------------------------


async def test_an_anchor_with_closing_at_signs_names_its_line(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """'@@ def greet @@' does not keep ' @@': '+' lines alone land right after it."""
    put(tmp_path, {"g.py": "def greet():\n    pass\n"})
    await applied(ctx, "*** Begin Patch\n*** Update File: g.py\n@@ def greet @@\n+    '''Hi.'''\n")
    assert (tmp_path / "g.py").read_text() == "def greet():\n    '''Hi.'''\n    pass\n"


async def test_a_first_context_line_may_repeat_the_anchor(ctx: ToolContext, tmp_path: Path) -> None:
    """The hunk is searched from the anchor line, inclusive."""
    put(tmp_path, {"g.py": "import os\n\ndef greet():\n    print('hello')\n"})
    await applied(
        ctx,
        "*** Begin Patch\n*** Update File: g.py\n@@ def greet():\n def greet():\n"
        "-    print('hello')\n+    print('hi')\n*** End Patch",
    )
    assert (tmp_path / "g.py").read_text() == "import os\n\ndef greet():\n    print('hi')\n"


async def test_an_anchor_that_is_not_in_the_file_is_only_a_hint(
    ctx: ToolContext, tmp_path: Path
) -> None:
    put(tmp_path, {"g.py": "a = 1\nb = 2\n"})
    await applied(ctx, "*** Update File: g.py\n@@ class Gone @@\n a = 1\n-b = 2\n+b = 3\n")
    assert (tmp_path / "g.py").read_text() == "a = 1\nb = 3\n"


async def test_a_patch_over_2000_lines_with_pipes_and_long_lines(
    ctx: ToolContext, tmp_path: Path
) -> None:
    rows = [f"| row {i} | {'v' * 50} |" for i in range(3000)]
    put(tmp_path, {"table.md": "\n".join(rows) + "\n"})
    wide = "w" * 5000
    changed = [f"| row {i} | changed | {wide} |" for i in range(2100, 2900)]
    patch = (
        "*** Begin Patch\n*** Add File: new.md\n"
        + "".join(f"+| {i} | {wide} |\n" for i in range(2500))
        + "*** Update File: table.md\n@@ | row 2099 |\n"
        + "".join(f" {row}\n" for row in rows[2090:2100])
        + "".join(f"-{row}\n" for row in rows[2100:2900])
        + "".join(f"+{row}\n" for row in changed)
        + "*** End Patch\n"
    )
    assert patch.count("\n") > 4000
    await applied(ctx, patch)
    assert (tmp_path / "table.md").read_text().split("\n")[2100:2900] == changed
    assert len((tmp_path / "new.md").read_text().splitlines()) == 2500


async def test_hunks_out_of_file_order_apply(ctx: ToolContext, tmp_path: Path) -> None:
    """Hermes places each hunk in the whole file; a hunk before the previous one applies
    where it fits once."""
    put(tmp_path, {"f.py": "a = 1\nb = 2\nc = 3\n"})
    await applied(ctx, "*** Update File: f.py\n-c = 3\n+c = 30\n@@\n-a = 1\n+a = 10\n")
    assert (tmp_path / "f.py").read_text() == "a = 10\nb = 2\nc = 30\n"


async def test_context_lines_without_their_space_and_indentation_drift(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """A context line that lost its leading space is context, as in Hermes; lines whose
    indentation differs from the file's match when nothing matches exactly."""
    put(tmp_path, {"f.py": "def f():\n    if x:\n        return 1\n"})
    await applied(
        ctx, "*** Update File: f.py\ndef f():\n  if x:\n-    return 1\n+        return 2\n"
    )
    assert (tmp_path / "f.py").read_text() == "def f():\n    if x:\n        return 2\n"
