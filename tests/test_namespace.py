"""One import namespace: hermes-sandbox installs only ``hermes_sandbox``, so it lives beside
hermes-agent (which ships its own top-level ``tools``), beside PyPI's ``tools`` package,
and beside a user's own ``tools.py`` or ``environments/``.

The wheel is built from this checkout; the neighbours come from PyPI into fresh virtual
environments (CI reaches PyPI, so there these tests fail rather than skip without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from conftest import fresh_venv

# Building the venv (hermes-agent from PyPI) counts against the first test using it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Run in a fresh directory, so the repository's own folders are never on sys.path.
SCRIPT = textwrap.dedent(
    """\
    from hermes_tools import terminal, read_file
    print(terminal("echo from-the-sandbox")["output"].strip())
    print(read_file("notes.txt")["content"].strip())
    """
)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.py").write_text(SCRIPT)
    (job / "notes.txt").write_text("notes beside the script\n")
    return job


def _run_cli(python: Path, job: Path, *args: str) -> dict:
    done = subprocess.run(
        [str(python.parent / "hermes-sandbox"), "run", "job.py", "--json", *args],
        cwd=job,
        stdin=subprocess.DEVNULL,  # piped stdin would be the script's, read to its end
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_wheel_installs_only_hermes_sandbox(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = {name.split("/")[0] for name in names}
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
    dist_info = next(name for name in top if name.endswith(".dist-info"))
    assert top == {"hermes_sandbox", dist_info}
    assert dist_info.startswith("hermes_sandbox-")
    assert b"hermes-sandbox = hermes_sandbox.cli:console_main" in entry_points
    # the layers are inside the one package
    for layer in ("environments", "rpc", "stubs", "tools"):
        assert f"hermes_sandbox/{layer}/__init__.py" in names


def test_beside_hermes_agent_both_keep_working(hermes_agent_python: Path, job_dir: Path) -> None:
    python = hermes_agent_python
    result = _run_cli(python, job_dir)
    assert result["status"] == "success", result
    assert result["output"] == "from-the-sandbox\nnotes beside the script\n"

    # In one process: hermes-agent's tools.registry is its own, and its tools register
    # there; ours run from hermes_sandbox, their registry a different object.
    probe = textwrap.dedent(
        """\
        import json, sys
        import tools.registry as theirs
        theirs.discover_builtin_tools()
        import hermes_sandbox
        from hermes_sandbox import execute_code, registry as ours
        result = execute_code(
            "from hermes_tools import terminal\\nprint(terminal('echo ok')['output'], end='')",
            tools=["terminal"], timeout=60,
        )
        print(json.dumps({
            "theirs_file": theirs.__file__,
            "theirs_tools": len(theirs.registry.get_all_tool_names()),
            "theirs_has_terminal": "terminal" in theirs.registry.get_all_tool_names(),
            "distinct": theirs.registry is not ours,
            "ours_file": hermes_sandbox.__file__,
            "status": result.status, "output": result.output,
        }))
        """
    )
    done = subprocess.run(
        [str(python), "-c", probe], cwd=job_dir, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    site = str(python.parent.parent / "lib")
    assert seen["theirs_file"].startswith(site) and seen["theirs_file"].endswith(
        os.path.join("tools", "registry.py")
    )
    assert seen["theirs_has_terminal"] and seen["theirs_tools"] > 10
    assert seen["distinct"]
    assert seen["ours_file"].startswith(site)
    assert (seen["status"], seen["output"]) == ("success", "ok\n")


def test_beside_the_pypi_tools_package(
    tmp_path_factory: pytest.TempPathFactory, wheel: Path, job_dir: Path
) -> None:
    python = fresh_venv(tmp_path_factory.mktemp("venv") / "tools", wheel, "tools")
    result = _run_cli(python, job_dir)
    assert result["status"] == "success", result
    done = subprocess.run(
        [str(python), "-c", "import tools, hermes_sandbox; print(tools.__file__)"],
        cwd=job_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "site-packages" in done.stdout  # PyPI's tools, untouched


def test_a_users_own_tools_py_and_environments_dir(job_dir: Path) -> None:
    """From a directory holding the user's tools.py, environments/, rpc.py and sandbox.py
    (the names our folders have in the repository), the CLI and the API work: nothing of
    ours is looked up by those names."""
    (job_dir / "tools.py").write_text("MARK = 'the user tools.py'\nBLOCKED_TOOLS = None\n")
    (job_dir / "environments").mkdir()
    (job_dir / "environments" / "__init__.py").write_text("raise ImportError('user env')\n")
    (job_dir / "rpc.py").write_text("raise ImportError('user rpc')\n")
    (job_dir / "sandbox.py").write_text("raise ImportError('user sandbox')\n")

    result = _run_cli(Path(sys.executable), job_dir)
    assert result["status"] == "success", result
    assert result["output"] == "from-the-sandbox\nnotes beside the script\n"

    probe = (
        "import tools\n"
        "from hermes_sandbox import execute_code\n"
        "r = execute_code(open('job.py').read(), timeout=60)\n"
        "print(r.status); print(r.output); print(tools.MARK)\n"
    )
    # python -c puts the current directory first on sys.path: the user's modules shadow
    # any top-level names we might have had.
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=job_dir, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "success\nfrom-the-sandbox\nnotes beside the script\n\nthe user tools.py\n"
    ), done.stdout
