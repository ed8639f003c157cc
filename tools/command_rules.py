"""The row type of the dangerous-command table, and the pieces its rows are built from.

:mod:`~hermes_sandbox.tools.approval` owns the table and reads commands against it;
:mod:`~hermes_sandbox.tools.routine_patterns` adds the routine families. Both build their
rows from here, so a regex fragment (an argument boundary, a block device) is written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

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
    regex: Regex
    programs: Regex | None = None  # command/wrapper scope: fullmatch on program
    unless_programs: Regex | None = None  # text scope: skip these programs
    session: SessionScope = "command"


class LazyPattern:
    """A regular expression compiled at its first use, then used as the compiled one.

    The table holds a few hundred; compiling them all cost ~100 ms of every start-up,
    also of the runs that never read a command against them. Two threads that use one
    first may both compile it; both get the same pattern.
    """

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern, self.flags)
        return compiled

    def __getattr__(self, name: str) -> Any:  # search, fullmatch, finditer, ...
        return getattr(self.compiled, name)

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r}, {self.flags!r})"


Regex = re.Pattern[str] | LazyPattern


def rx(pattern: str, flags: int = 0) -> LazyPattern:
    return LazyPattern(pattern, flags)


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
