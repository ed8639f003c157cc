"""The policy that decides whether a dangerous terminal command may run, and asks a human.

:class:`ApprovalPolicy` holds the permanent allowlist and what was approved in the
session; :mod:`~hermes_sandbox.tools.approval` reads a command and says what in it is
dangerous. A policy is built for every run (the command line builds one from the config
file's allowlist), and most runs never call the terminal tool: the detector, its table
of patterns and the shell-word reader are imported at the first command checked (or the
first exact allowlist entry read), not with the policy.
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

import anyio.to_thread

from hermes_sandbox.allowlist import ALLOWLIST_REGEX_PREFIX
from hermes_sandbox.threads import tool_limiter

if TYPE_CHECKING:
    from hermes_sandbox.tools.approval import Finding
    from hermes_sandbox.tools.command_rules import DangerousPattern

log = logging.getLogger("hermes_sandbox.tools.approval")

_CHECK_IN_THREAD_CHARS = 4_096  # longer commands are checked in a worker thread


def _normalise(command: str) -> str:
    from hermes_sandbox.tools.shell_words import normalise_command

    return normalise_command(command)


class Approval(StrEnum):
    """What a human answered. ``ONCE`` allows this call only; ``SESSION`` the same
    command for the policy's lifetime; ``ALWAYS`` adds it to the permanent allowlist."""

    ONCE = "once"
    SESSION = "session"
    ALWAYS = "always"
    DENY = "deny"


ApprovalAnswer = Approval | str | bool | None
# Typed loosely on purpose: whatever comes back is checked, and anything that is not an
# ApprovalAnswer (or an awaitable of one) counts as a refusal.
ApprovalCallback = Callable[[str, list[str]], object]
AlwaysCallback = Callable[[str], object]

_HOW_TO_ALLOW = (
    "A human must approve it when asked, or add it to the command allowlist in the "
    "hermes-sandbox config file. Do not try to get around this check; tell the user what "
    "you wanted to run and why."
)


def _parse_answer(value: object) -> Approval | None:
    if value is True:
        return Approval.ONCE
    if value is False or value is None:
        return Approval.DENY
    if isinstance(value, str):
        try:
            return Approval(value.strip().lower())
        except ValueError:
            return None
    return None


def _is_async_callable(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


class ApprovalPolicy:
    """Who may allow a dangerous terminal command, and what has been allowed.

    ``callback(command, reasons)`` asks the host (a human) about a dangerous command; it
    may be a plain function (run in a worker thread, so it may block on a prompt) or a
    coroutine function, and answers ``"once"``, ``"session"``, ``"always"`` or ``"deny"``
    (or an :class:`Approval`; ``True`` means once, ``False``/``None`` deny). Without a
    callback every dangerous command is refused.

    ``allowlist`` holds the permanent entries from the host's config file. An entry is an
    exact command, compared after :func:`normalise_command` with the whole command and
    with each flagged part of it (the simple command, or for a pipe pattern the pipeline,
    as written, wrappers included): ``systemctl restart nginx`` allows that command alone
    and in ``cd /srv && systemctl restart nginx``, but not ``sudo systemctl restart
    nginx``. An entry starting with ``re:`` is a regex that must match, in full, every
    normalised form of a flagged part (:attr:`Finding.forms`): its words with quotes
    removed, braces and ``$IFS`` expanded and paths resolved lexically (``/tmp/../`` is
    ``/``), one form per path operand with the other path operands left out. So
    ``re:rm -rf /tmp/.*`` allows ``rm -rf /tmp/a /tmp/b`` but not ``rm -rf /tmp/x /``,
    ``rm -rf /tmp/../`` or ``rm -rf /tmp/x; rm -rf /``; and no regex allows a command
    whose words hold ``$VAR``, ``$(...)`` or backticks (the text does not show what they
    are): only an exact entry or a human can. A command runs when each of its findings is
    allowed by an entry or an earlier approval.

    A session approval of a routine pattern (``session="pattern"``, see
    :mod:`~hermes_sandbox.tools.routine_patterns`) covers every later command it flags:
    approving ``rm -r build`` allows ``rm -r dist``. For the others it is keyed by (pattern
    key, normalised whole command): approving ``rm -rf ~/old`` for the session allows that
    exact command again, not every broad delete. ``always`` appends the normalised command to
    :attr:`permanent_allowlist` (as an exact entry: a command that itself starts with
    ``re:`` is stored as the escaped regex of itself) and calls ``on_always(entry)`` (sync
    or async) so the host can save it; a failing ``on_always`` is logged, the approval
    stands.

    Safe to share between threads and event loops: state lives behind a lock that is
    never held across an await. Two concurrent calls may both ask the callback.
    """

    def __init__(
        self,
        callback: ApprovalCallback | None = None,
        *,
        allowlist: Iterable[str] = (),
        on_always: AlwaysCallback | None = None,
        patterns: Sequence[DangerousPattern] | None = None,
    ) -> None:
        """Raises ValueError naming an allowlist entry that is empty or a bad regex.

        ``patterns`` defaults to :data:`~hermes_sandbox.tools.approval.DANGEROUS_PATTERNS`,
        read when the first command is checked."""
        self._callback = callback
        self._on_always = on_always
        self._patterns = None if patterns is None else tuple(patterns)
        self._pattern_keys: frozenset[str] | None = None
        self._lock = threading.Lock()
        self._entries: list[str] = []
        self._exact: set[str] = set()
        self._regexes: list[re.Pattern[str]] = []
        self._session: set[tuple[str, str]] = set()
        self._session_patterns: set[str] = set()
        for entry in allowlist:
            self._add_entry(entry)

    def _add_entry(self, entry: str) -> None:
        if not isinstance(entry, str) or not entry.strip():
            raise ValueError(f"allowlist entries must be non-empty strings, got {entry!r}")
        if entry.startswith(ALLOWLIST_REGEX_PREFIX):
            source = entry[len(ALLOWLIST_REGEX_PREFIX) :]
            try:
                regex = re.compile(source)
            except re.error as exc:
                raise ValueError(f"allowlist entry {entry!r} is not a valid regex: {exc}") from exc
            with self._lock:
                if entry not in self._entries:
                    self._entries.append(entry)
                    self._regexes.append(regex)
            return
        normalised = _normalise(entry)
        with self._lock:
            if normalised not in self._exact:
                self._exact.add(normalised)
                self._entries.append(normalised)

    @property
    def permanent_allowlist(self) -> list[str]:
        """The permanent entries: the config's, then those answered ``always``."""
        with self._lock:
            return list(self._entries)

    @property
    def session_approvals(self) -> frozenset[tuple[str, str]]:
        """(pattern key, normalised command) pairs approved for this session."""
        with self._lock:
            return frozenset(self._session)

    @property
    def session_patterns(self) -> frozenset[str]:
        """Keys of the routine patterns approved for this session: every later command
        they flag runs without asking."""
        with self._lock:
            return frozenset(self._session_patterns)

    def _table(self) -> tuple[DangerousPattern, ...]:
        """The patterns checked, and the keys of those approved by pattern for a session."""
        if self._patterns is None:
            from hermes_sandbox.tools.approval import DANGEROUS_PATTERNS

            self._patterns = tuple(DANGEROUS_PATTERNS)
        return self._patterns

    def _by_pattern(self) -> frozenset[str]:
        if self._pattern_keys is None:
            self._pattern_keys = frozenset(p.key for p in self._table() if p.session == "pattern")
        return self._pattern_keys

    def findings(self, command: str) -> list[Finding]:
        """What is dangerous in ``command``, allowed or not."""
        from hermes_sandbox.tools.approval import detect_dangerous

        return detect_dangerous(command, self._table())

    def _allowed(self, finding: Finding, normalised: str) -> bool:
        with self._lock:
            if (finding.key, normalised) in self._session:
                return True
            if finding.key in self._session_patterns:
                return True
            if normalised in self._exact or finding.unit in self._exact:
                return True
            regexes = list(self._regexes)
        # every form must fit some entry: one path operand per form, see _command_forms
        return (
            bool(regexes)
            and bool(finding.forms)
            and all(any(regex.fullmatch(form) for regex in regexes) for form in finding.forms)
        )

    async def check(self, command: str) -> str | None:
        """None if ``command`` may run, else the refusal message for the script.

        Asks the callback when a dangerous part is not yet allowed. Never raises for a
        failing callback: that refuses the command and says why.
        """
        normalised = _normalise(command)
        if len(command) > _CHECK_IN_THREAD_CHARS:
            found = await anyio.to_thread.run_sync(self.findings, command, limiter=tool_limiter())
        else:
            found = self.findings(command)
        pending = [f for f in found if not self._allowed(f, normalised)]
        if not pending:
            return None
        reasons = list(dict.fromkeys(f.reason for f in pending))
        if self._callback is None:
            return _refusal(reasons, "no one can approve dangerous commands in this run")
        try:
            raw = await self._ask(command, reasons)
        except Exception as exc:
            log.warning("approval callback failed for %r", command, exc_info=True)
            return _refusal(reasons, f"asking for approval failed ({type(exc).__name__}: {exc})")
        answer = _parse_answer(raw)
        if answer is None:
            return _refusal(reasons, f"the approval callback gave an unknown answer {raw!r}")
        if answer is Approval.DENY:
            return _refusal(reasons, "the human denied it")
        if answer is Approval.SESSION:
            with self._lock:
                for f in pending:
                    if f.key in self._by_pattern():
                        self._session_patterns.add(f.key)
                    else:
                        self._session.add((f.key, normalised))
        elif answer is Approval.ALWAYS:
            entry = normalised
            if entry.startswith(ALLOWLIST_REGEX_PREFIX):
                # never let a command become a regex: "re:.*|reboot" would allow anything
                entry = ALLOWLIST_REGEX_PREFIX + re.escape(entry)
            self._add_entry(entry)
            with self._lock:
                self._exact.add(normalised)
            await self._persist(entry)
        return None

    async def _ask(self, command: str, reasons: list[str]) -> object:
        callback = self._callback
        assert callback is not None
        if _is_async_callable(callback):
            return await callback(command, list(reasons))  # type: ignore[misc]
        result = await anyio.to_thread.run_sync(
            callback, command, list(reasons), abandon_on_cancel=True, limiter=tool_limiter()
        )
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _persist(self, entry: str) -> None:
        if self._on_always is None:
            return
        try:
            if _is_async_callable(self._on_always):
                await self._on_always(entry)  # type: ignore[misc]
            else:
                result = await anyio.to_thread.run_sync(
                    self._on_always, entry, limiter=tool_limiter()
                )
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.warning("on_always failed to save allowlist entry %r", entry, exc_info=True)


def _refusal(reasons: list[str], why: str) -> str:
    listed = "; ".join(reasons)
    return (
        f"Command refused: it {listed}. Dangerous commands need a human's approval, and "
        f"{why}. {_HOW_TO_ALLOW}"
    )
