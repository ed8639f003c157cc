"""The row type of the dangerous-command table, and the pieces its rows are built from.

:mod:`~hermes_sandbox.tools.approval` owns the table and reads commands against it;
:mod:`~hermes_sandbox.tools.routine_patterns` adds the routine families. Both build their
rows from here, so a regex fragment (an argument boundary, a block device) is written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scope = Literal["command", "redirect", "pipeline", "text", "script", "wrapper"]
SessionScope = Literal["command", "pattern"]


@dataclass(frozen=True, slots=True)
class DangerousPattern:
    """One row of the table: what to look for, where, and why it is dangerous.

    Where (``scope``): ``command`` searches the arguments of a simple command (normalised,
    joined by one space) whose program's base name fully matches ``programs``;
    ``wrapper`` searches ``"OPTIONS => PROGRAM"`` for each wrapper (sudo, xargs...) whose
    name fully matches ``programs``, its own options only; ``redirect`` searches
    ``"PROGRAM OP TARGET"`` for each redirection; ``pipeline`` the stages of a pipeline,
    each ``"PROGRAM ARGS"``, joined by ``" | "``; ``text`` the source text of each simple
    command, quotes kept; ``script`` the whole command, normalised.

    What a session approval covers (``session``): ``command`` the same command again,
    ``pattern`` every later command this pattern flags.
    """

    key: str
    reason: str
    scope: Scope
    regex: re.Pattern[str]
    programs: re.Pattern[str] | None = None  # command/wrapper scope: fullmatch on program
    unless_programs: re.Pattern[str] | None = None  # text scope: skip these programs
    session: SessionScope = "command"


def rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


ARG = r"(?:^| )"  # the start of an argument
END = r"(?: |$)"  # the end of one


def has(argument: str) -> str:
    """A lookahead: some argument is ``argument``. Use after ``^``, so it runs once."""
    return rf"(?=.*{ARG}{argument}{END})"


RECURSIVE_FLAG = r"(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)"
BLOCK_DEVICE = (
    r"/dev/(?:sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk|rdisk\d|dm-\d|md\d"
    r"|mapper/|loop\d|sr\d|mtdblock|nbd\d|zd\d)"
)
WRITE_REDIRECT = r"(?:^| )(?:>|>>|>\||&>|&>>|<>) "
SHELLS = r"(?:sh|bash|dash|zsh|ksh|mksh|ash|fish)"
INTERPRETERS = r"(?:sh|bash|dash|zsh|ksh|mksh|ash|fish|python[\d.]*|perl|ruby|node|php)"
DOWNLOADERS = r"(?:curl|wget|fetch|aria2c|http|https)"


def command(
    key: str,
    programs: str,
    regex: str,
    reason: str,
    *,
    flags: int = 0,
    session: SessionScope = "command",
) -> DangerousPattern:
    return DangerousPattern(
        key, reason, "command", rx(regex, flags), programs=rx(programs), session=session
    )


def redirect(
    key: str, regex: str, reason: str, *, session: SessionScope = "command"
) -> DangerousPattern:
    return DangerousPattern(key, reason, "redirect", rx(regex), session=session)


def script(
    key: str, regex: str, reason: str, *, session: SessionScope = "command"
) -> DangerousPattern:
    return DangerousPattern(key, reason, "script", rx(regex), session=session)
