"""The Python API passes a run's approval policy and workspace root through to the tools."""

from __future__ import annotations

import json

from hermes_sandbox import execute_code
from hermes_sandbox.tools.approval import ApprovalPolicy

# Flagged by the approval table (SQL DROP text), harmless: it appends to ran.log.
FLAGGED = r"printf '%s\n' 'DROP TABLE a' >> ran.log"
SCRIPT = f"""\
import json
from hermes_tools import terminal
print(json.dumps(terminal({FLAGGED!r})))
"""


def test_approval_reaches_the_terminal_tool(tmp_path):
    asked: list[tuple[str, list[str]]] = []

    def human(command: str, reasons: list[str]) -> str:
        asked.append((command, reasons))
        return "session"

    policy = ApprovalPolicy(human)
    for _ in range(2):  # one policy shared by two runs: the session approval carries over
        result = execute_code(SCRIPT, cwd=str(tmp_path), timeout=30, approval=policy)
        assert result.status == "success", result.output
        assert json.loads(result.output)["exit_code"] == 0
    assert asked == [(FLAGGED, ["drops a database, schema or table (SQL DROP)"])]
    assert (tmp_path / "ran.log").read_text() == "DROP TABLE a\nDROP TABLE a\n"


def test_without_approval_a_flagged_command_is_refused(tmp_path):
    result = execute_code(SCRIPT, cwd=str(tmp_path), timeout=30)
    assert json.loads(result.output)["approval_required"] is True
    assert not (tmp_path / "ran.log").exists()


def test_workspace_root_reaches_the_file_tools(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret.txt").write_text("no\n")
    script = (
        "import json\nfrom hermes_tools import read_file\n"
        f"print(json.dumps(read_file({str(tmp_path / 'secret.txt')!r})))\n"
    )
    result = execute_code(
        script, cwd=str(tmp_path), timeout=30, workspace_root=str(tmp_path / "ws")
    )
    assert "outside the workspace" in json.loads(result.output)["error"]
