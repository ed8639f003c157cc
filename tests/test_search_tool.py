"""Tests for search_files: real trees in tmp_path, searched through real LocalEnvironments.

Every case runs once per engine. The python engine runs in an environment whose PATH
has no ``rg``; the rg engine in one that has it, and there each call is also made on the
python engine and the two results must be equal. Without ripgrep installed the rg cases
are skipped with the reason; install it with ``apt-get install -y ripgrep``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import hermes_sandbox.tools.search_tool as search_tool
from hermes_sandbox.environments.base import CommandResult
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools.registry import ToolContext, registry

pytestmark = pytest.mark.anyio

RG = shutil.which("rg")
NO_RG = "ripgrep (rg) is not installed, so the rg engine is not tested: apt-get install -y ripgrep"
PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"

Search = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def no_rg_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A process environment whose PATH holds no rg (an empty directory)."""
    return {**os.environ, "PATH": str(tmp_path_factory.mktemp("empty-path"))}


async def call(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(await registry.adispatch("search_files", args, ctx))


@pytest.fixture(params=["python", "rg"])
async def search(
    request: pytest.FixtureRequest, anyio_backend: str, tmp_path: Path, no_rg_env: dict[str, str]
) -> AsyncIterator[Search]:
    """``await search(**args)``: search_files in tmp_path on this case's engine.

    On the rg engine the same call also runs on the python engine, and must agree.
    """
    engine = request.param
    if engine == "rg" and RG is None:
        pytest.skip(NO_RG)
    async with LocalEnvironment(env=no_rg_env) as python_env, LocalEnvironment() as rg_env:
        python_ctx = ToolContext(task_id="t", environment=python_env, cwd=str(tmp_path))
        rg_ctx = ToolContext(task_id="t", environment=rg_env, cwd=str(tmp_path))
        assert await search_tool.ripgrep_path(python_env) is None
        if engine == "rg":
            assert await search_tool.ripgrep_path(rg_env) is not None

        async def run(**args: Any) -> dict[str, Any]:
            by_python = await call(python_ctx, args)
            if engine == "python":
                return by_python
            by_rg = await call(rg_ctx, args)
            assert by_rg == by_python, f"the engines disagree on {args}"
            return by_rg

        yield run


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def test_registered_in_the_file_toolset() -> None:
    entry = registry.get("search_files")
    assert entry is not None and entry.toolset == "file"
    assert entry.handler is search_tool.search_files


# -- content --------------------------------------------------------------------------


async def test_content_matches_are_sorted_by_path_then_line(search: Search, tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "b.py": "x = 1\nfoo()\n",
            "a/z.py": "foo\nbar\nfoo bar\n",
            "a-c.txt": "foo",
            "none.txt": "nothing here\n",
        },
    )
    result = await search(pattern="foo")
    # "a/z.py" sorts before "a-c.txt": paths compare component by component.
    assert result == {
        "matches": [
            {"path": "a/z.py", "line": 1, "text": "foo"},
            {"path": "a/z.py", "line": 3, "text": "foo bar"},
            {"path": "a-c.txt", "line": 1, "text": "foo"},
            {"path": "b.py", "line": 2, "text": "foo()"},
        ],
        "total": 4,
        "truncated": False,
    }


async def test_output_modes(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"one.txt": "hit\nhit\nmiss\n", "two/three.txt": "hit\n", "four.txt": "x\n"})
    listed = await search(pattern="hit", output_mode="files_with_matches")
    assert listed == {"matches": ["one.txt", "two/three.txt"], "total": 2, "truncated": False}
    counted = await search(pattern="hit", output_mode="count")
    assert counted["matches"] == [
        {"path": "one.txt", "count": 2},
        {"path": "two/three.txt", "count": 1},
    ]
    assert counted["total"] == 2


async def test_context_lines(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"f.txt": "1\n2\nhit a\n4\nhit b\n6\n7\n8\nhit c\n"})
    result = await search(pattern="hit", context=2)
    assert result["matches"] == [
        {
            "path": "f.txt",
            "line": 3,
            "text": "hit a",
            "before": ["1", "2"],
            "after": ["4", "hit b"],
        },
        {
            "path": "f.txt",
            "line": 5,
            "text": "hit b",
            "before": ["hit a", "4"],
            "after": ["6", "7"],
        },
        {"path": "f.txt", "line": 9, "text": "hit c", "before": ["7", "8"], "after": []},
    ]


async def test_case_insensitive_unicode(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"fr.txt": "L'ÉCOLE est là\nl'école\nécolier\n"})
    exact = await search(pattern="école")
    assert [m["line"] for m in exact["matches"]] == [2]
    folded = await search(pattern="école", case_insensitive=True)
    assert [m["line"] for m in folded["matches"]] == [1, 2]


async def test_unicode_content_and_file_names(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"日本/データ.txt": "値 = 42 🎌\n", "café.md": "crème brûlée\n"})
    result = await search(pattern=r"\d+ 🎌|brûl")
    assert result["matches"] == [
        {"path": "café.md", "line": 1, "text": "crème brûlée"},
        {"path": "日本/データ.txt", "line": 1, "text": "値 = 42 🎌"},
    ]


async def test_crlf_lines_match_at_their_end(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"win.txt": b"foo\r\nbar foo\r\nfoo bar\r\n"})
    result = await search(pattern="foo$")
    assert result["matches"] == [
        {"path": "win.txt", "line": 1, "text": "foo"},
        {"path": "win.txt", "line": 2, "text": "bar foo"},
    ]


async def test_text_that_is_not_utf8(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"latin1.txt": b"caf\xe9 ok\n"})
    result = await search(pattern="ok")
    assert result["matches"] == [{"path": "latin1.txt", "line": 1, "text": "caf\ufffd ok"}]


async def test_long_lines_are_cut(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"min.js": "x" * 2000 + "needle\n"})
    (match,) = (await search(pattern="needle"))["matches"]
    assert match["text"] == "x" * search_tool.MAX_LINE_CHARS + "…"


async def test_regexes_only_python_reads(search: Search, tmp_path: Path) -> None:
    # Look-behind and back-references: rg's engine refuses them; the result is the same.
    write(tmp_path, {"f.txt": "foobar\nbarbar\nxbar\n"})
    behind = await search(pattern="(?<=foo)bar")
    assert [m["line"] for m in behind["matches"]] == [1]
    repeated = await search(pattern=r"(bar)\1")
    assert [m["line"] for m in repeated["matches"]] == [2]


# -- what is searched -----------------------------------------------------------------


async def test_skips_excluded_dirs_binaries_and_symlinks(search: Search, tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "keep.txt": "needle\n",
            ".hidden/also.txt": "needle\n",
            ".env": "needle\n",
            "deep/node_modules": "needle\n",  # a file with that name is searched
            ".git/config": "needle\n",
            "node_modules/pkg/index.js": "needle\n",
            "deep/node_modules_x/ok.js": "needle\n",
            "deep/er/node_modules/pkg/index.js": "needle\n",
            "__pycache__/m.txt": "needle\n",
            ".venv/lib/site.txt": "needle\n",
            "image.png": b"\x89PNG\r\n\x1a\n\0\0needle\n",
            # A NUL far into a file still makes it binary, even after a match.
            "late.bin": b"needle\n" + b"text line\n" * 20_000 + b"\0",
        },
    )
    (tmp_path / "link.txt").symlink_to(tmp_path / "keep.txt")
    (tmp_path / "linkdir").symlink_to(tmp_path / "deep", target_is_directory=True)
    result = await search(pattern="needle", output_mode="files_with_matches")
    assert result["matches"] == [
        ".env",
        ".hidden/also.txt",
        "deep/node_modules",
        "deep/node_modules_x/ok.js",
        "keep.txt",
    ]
    # Listing by name: binary files are listed; excluded dirs and symlinks still are not.
    listed = await search(pattern="*", target="files")
    assert listed["matches"] == [
        ".env",
        ".hidden/also.txt",
        "deep/node_modules",
        "deep/node_modules_x/ok.js",
        "image.png",
        "keep.txt",
        "late.bin",
    ]


async def test_a_directory_inside_an_excluded_one_can_be_searched(
    search: Search, tmp_path: Path
) -> None:
    write(tmp_path, {"node_modules/pkg/index.js": "needle\n"})
    result = await search(pattern="needle", path="node_modules/pkg")
    assert result["matches"] == [{"path": "node_modules/pkg/index.js", "line": 1, "text": "needle"}]


async def test_big_files_are_skipped_while_walking(search: Search, tmp_path: Path) -> None:
    big = b"needle\n" + b"x" * search_tool.MAX_FILESIZE
    write(tmp_path, {"big.log": big, "small.log": "needle\n"})
    walked = await search(pattern="needle")
    assert [m["path"] for m in walked["matches"]] == ["small.log"]
    named = await search(pattern="needle", path="big.log")
    assert named["matches"] == [{"path": "big.log", "line": 1, "text": "needle"}]


async def test_searching_one_file(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"sub/one.txt": "a\nneedle\n", "sub/bin.dat": b"needle\0"})
    result = await search(pattern="needle", path="sub/one.txt", context=1)
    assert result["matches"] == [
        {"path": "sub/one.txt", "line": 2, "text": "needle", "before": ["a"], "after": []}
    ]
    assert (await search(pattern="needle", path="sub/bin.dat"))["matches"] == []
    assert (await search(pattern="*.txt", target="files", path="sub/one.txt"))["matches"] == [
        "sub/one.txt"
    ]


async def test_paths_with_spaces_and_quotes(search: Search, tmp_path: Path) -> None:
    folder = 'it\'s a "quoted" $dir'
    write(tmp_path, {f"{folder}/my file.txt": "needle\n", f"{folder}/`x`;rm.txt": "needle\n"})
    result = await search(pattern="needle", path=folder, output_mode="files_with_matches")
    assert result["matches"] == [f"{folder}/`x`;rm.txt", f"{folder}/my file.txt"]
    by_name = await search(pattern="my file.*", target="files")
    assert by_name["matches"] == [f"{folder}/my file.txt"]


async def test_an_absolute_path_gives_absolute_results(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"d/f.txt": "needle\n"})
    result = await search(pattern="needle", path=str(tmp_path / "d"))
    assert result["matches"][0]["path"] == str(tmp_path / "d" / "f.txt")


# -- globs ----------------------------------------------------------------------------

TREE = {
    "setup.py": "needle\n",
    "README.md": "needle\n",
    "src/app.py": "needle\n",
    "src/app.min.js": "needle\n",
    "src/pkg/test_app.py": "needle\n",
    "src/pkg/data.json": "needle\n",
    "tests/test_x.py": "needle\n",
    "tests/a.py": "needle\n",
    "docs/b.txt": "needle\n",
}


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        (
            "*.py",
            ["setup.py", "src/app.py", "src/pkg/test_app.py", "tests/a.py", "tests/test_x.py"],
        ),
        ("test_*.py", ["src/pkg/test_app.py", "tests/test_x.py"]),
        ("src/*.py", ["src/app.py"]),
        ("src/**/*.py", ["src/app.py", "src/pkg/test_app.py"]),
        ("**/test_*.py", ["src/pkg/test_app.py", "tests/test_x.py"]),
        ("*.{md,json}", ["README.md", "src/pkg/data.json"]),
        ("[ab].*", ["docs/b.txt", "tests/a.py"]),
        ("?.py", ["tests/a.py"]),
        ("src/**", ["src/app.min.js", "src/app.py", "src/pkg/data.json", "src/pkg/test_app.py"]),
        ("/setup.py", ["setup.py"]),
        ("nothing*", []),
    ],
)
async def test_file_globs(search: Search, tmp_path: Path, glob: str, expected: list[str]) -> None:
    write(tmp_path, TREE)
    by_name = await search(pattern=glob, target="files")
    assert by_name == {"matches": expected, "total": len(expected), "truncated": False}
    filtered = await search(pattern="needle", file_glob=glob, output_mode="files_with_matches")
    assert filtered["matches"] == expected


async def test_a_negated_file_glob_excludes(search: Search, tmp_path: Path) -> None:
    write(tmp_path, TREE)
    result = await search(pattern="needle", path="src", file_glob="!*.min.js")
    assert [m["path"] for m in result["matches"]] == [
        "src/app.py",
        "src/pkg/data.json",
        "src/pkg/test_app.py",
    ]


async def test_file_names_ignoring_case(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {"Makefile": "", "docs/MAKEFILE.old": "", "makefile.am": ""})
    result = await search(pattern="makefile*", target="files", case_insensitive=True)
    assert result["matches"] == ["Makefile", "docs/MAKEFILE.old", "makefile.am"]


# -- paging ---------------------------------------------------------------------------


async def test_paging(search: Search, tmp_path: Path) -> None:
    write(tmp_path, {f"f{i}.txt": "hit\n" for i in range(7)})
    first = await search(pattern="hit", limit=3)
    assert [m["path"] for m in first["matches"]] == ["f0.txt", "f1.txt", "f2.txt"]
    assert first["total"] == 7 and first["truncated"] is True and first["next_offset"] == 3
    last = await search(pattern="hit", limit=3, offset=6)
    assert [m["path"] for m in last["matches"]] == ["f6.txt"]
    assert last["truncated"] is False and "next_offset" not in last
    beyond = await search(pattern="hit", limit=3, offset=50)
    assert beyond == {"matches": [], "total": 7, "truncated": False}


async def test_a_page_stops_early_when_it_gets_big(search: Search, tmp_path: Path) -> None:
    line = "hit " + "y" * 600 + "\n"
    write(tmp_path, {"big.txt": line * 400})
    result = await search(pattern="hit", limit=400)
    returned = len(result["matches"])
    assert 0 < returned < 400
    assert result["truncated"] is True and result["next_offset"] == returned
    assert len(json.dumps(result)) < search_tool.MAX_PAGE_CHARS * 1.1


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"pattern": "foo("}, "missing ), unterminated subpattern at position 3"),
        ({"pattern": "[[:alpha:]]"}, "invalid regular expression"),
        ({"pattern": ""}, "non-empty"),
        ({"pattern": "x", "path": "nowhere"}, "Path not found: nowhere"),
        ({"pattern": "x", "target": "everything"}, "target"),
        ({"pattern": "x", "output_mode": "lines"}, "output_mode"),
        ({"pattern": "x", "context": 99}, "context"),
        ({"pattern": "x", "limit": 0}, "limit"),
        ({"pattern": "x", "offset": -1}, "offset"),
    ],
)
async def test_errors(search: Search, tmp_path: Path, args: dict[str, Any], expected: str) -> None:
    write(tmp_path, {"f.txt": "x\n"})
    result = await search(**args)
    assert expected in result["error"]


async def test_reads_outside_the_workspace_are_refused(tmp_path: Path) -> None:
    write(tmp_path, {"work/f.txt": "x\n", "secret.txt": "x\n"})
    async with LocalEnvironment() as env:
        ctx = ToolContext(
            task_id="t",
            environment=env,
            cwd=str(tmp_path / "work"),
            workspace_root=str(tmp_path / "work"),
        )
        refused = await call(ctx, {"pattern": "x", "path": ".."})
        assert refused["refused"] is True and "outside the workspace" in refused["error"]
        allowed = await call(ctx, {"pattern": "x"})
        assert allowed["matches"] == [{"path": "f.txt", "line": 1, "text": "x"}]


# -- engines --------------------------------------------------------------------------


class CountingEnvironment(LocalEnvironment):
    """A local environment that records the commands it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []

    async def execute(self, command: str, **kwargs: Any) -> CommandResult:
        self.commands.append(command)
        return await super().execute(command, **kwargs)


async def test_ripgrep_is_looked_for_once_per_environment(tmp_path: Path) -> None:
    write(tmp_path, {"f.txt": "x\n"})
    async with CountingEnvironment() as env:
        ctx = ToolContext(task_id="t", environment=env, cwd=str(tmp_path))
        for _ in range(3):
            assert (await call(ctx, {"pattern": "x"}))["total"] == 1
        assert env.commands.count("command -v rg") == 1
        assert len(env.commands) == 4  # one probe, then one command per search


@pytest.mark.skipif(not os.path.exists(PYTHON38), reason=f"no Python 3.8 at {PYTHON38}")
async def test_the_search_program_runs_on_python_38(
    tmp_path: Path, no_rg_env: dict[str, str]
) -> None:
    write(tmp_path, {"a/b.py": "hit\nmiss\n", "c.txt": "hit\n"})
    async with LocalEnvironment(env=no_rg_env, python=PYTHON38) as env:
        ctx = ToolContext(task_id="t", environment=env, cwd=str(tmp_path))
        result = await call(ctx, {"pattern": "hit", "context": 1, "file_glob": "*.{py,txt}"})
        assert [m["path"] for m in result["matches"]] == ["a/b.py", "c.txt"]
        assert (await call(ctx, {"pattern": "*.py", "target": "files"}))["matches"] == ["a/b.py"]


@pytest.mark.skipif(RG is None, reason=NO_RG)
async def test_engines_agree_on_a_messy_tree(tmp_path: Path, no_rg_env: dict[str, str]) -> None:
    write(
        tmp_path,
        {
            "a.py": "import os\nimport sys\n\ndef main():\n    return os.getcwd()\n",
            "A.PY": "IMPORT OS\n",
            "b/c.txt": "tab\there\ntrailing \nimport this\n",
            "b/d/e.md": "# Import\nimport\n" * 30,
            "crlf.txt": b"import a\r\nimport b\r\n",
            "bom.txt": b"\xef\xbb\xbfimport bom\n",
            "mixed.bin": b"import x\n\0",
            "no-newline.txt": "import end",
            "empty.txt": "",
            ".dot/import.txt": "import dotted\n",
            "ünï/cödé.py": "import ünïcode\n",
        },
    )
    patterns = ["import", r"^\s*import \w+$", "(?i)IMPORT", r"os\.", "^$"]
    options = [
        {},
        {"case_insensitive": True},
        {"context": 1},
        {"output_mode": "count"},
        {"output_mode": "files_with_matches", "file_glob": "*.py"},
        {"file_glob": "b/**", "limit": 5, "offset": 3},
    ]
    async with LocalEnvironment(env=no_rg_env) as python_env, LocalEnvironment() as rg_env:
        contexts = [
            ToolContext(task_id="t", environment=e, cwd=str(tmp_path)) for e in (python_env, rg_env)
        ]
        for pattern, extra in itertools.product(patterns, options):
            args = {"pattern": pattern, **extra}
            by_python, by_rg = [await call(c, args) for c in contexts]
            assert "error" not in by_python, args
            assert by_rg == by_python, args
        for glob in ["*", "*.py", "**/*.txt", "*.{py,PY}", "b/*"]:
            args = {"pattern": glob, "target": "files"}
            by_python, by_rg = [await call(c, args) for c in contexts]
            assert by_rg == by_python, args
