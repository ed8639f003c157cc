"""Dangerous-command detection for the terminal tool, and the policy that asks a human.

:func:`detect_dangerous` reads a shell command the way a shell would and checks it against
:data:`DANGEROUS_PATTERNS`, a table of regexes that each carry a short reason.
:class:`ApprovalPolicy` (:mod:`~hermes_sandbox.tools.approval_policy`, re-exported here)
turns the findings into a decision: allowed by the permanent allowlist, approved earlier
in the session, or put to the host's approval callback; with no callback a dangerous
command is refused. docs/security.md ("Approval") has the whole
account; in short:

- Each simple command of each chain is read with quotes removed, ``{a,b}`` lists and
  ``$IFS`` expanded into words, abbreviated long options spelled out (``--recur`` is
  ``--recursive``, as GNU getopt reads it), and wrappers looked through by their own
  options (sudo, env, nice, timeout, xargs, flock, strace, unshare, setpriv, systemd-run,
  chrt...: :mod:`~hermes_sandbox.tools.wrappers`). Nested code is read too: ``sh -c``,
  ``eval``, ``ssh HOST CMD``, ``script -c``, ``parallel``, ``$(...)``, ``find -exec``,
  text piped into a shell.
- Path arguments are resolved lexically (``/tmp/../`` is ``/``); writes to the paths that
  write_file refuses (:mod:`~hermes_sandbox.tools.protected_paths`) are flagged.
- Arguments are data (``echo "rm -rf /"`` passes), except SQL text and fork bombs.
- Not analysed: code given to other interpreters (``python -c``), values of variables
  (``rm -rf "$DIR"/``), relative paths against an unknown working directory, scripts
  downloaded and run later. A net for accidents, not a sandbox.
- An allowlist ``re:`` entry must match, in full, every normalised form of a flagged
  command: one form per path operand (:func:`_command_forms`), so ``re:rm -rf /tmp/.*``
  does not allow ``rm -rf /tmp/x /``; no regex allows a command holding ``$VAR``,
  ``$(...)`` or backticks. Exact entries are compared with the whitespace-collapsed text.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from hermes_sandbox.redaction import strip_ansi
from hermes_sandbox.tools.approval_policy import AlwaysCallback as AlwaysCallback
from hermes_sandbox.tools.approval_policy import Approval as Approval
from hermes_sandbox.tools.approval_policy import ApprovalAnswer as ApprovalAnswer
from hermes_sandbox.tools.approval_policy import ApprovalCallback as ApprovalCallback
from hermes_sandbox.tools.approval_policy import ApprovalPolicy as ApprovalPolicy
from hermes_sandbox.tools.command_rules import ARG as _ARG
from hermes_sandbox.tools.command_rules import BLOCK_DEVICE as _BLOCK_DEVICE
from hermes_sandbox.tools.command_rules import DOWNLOADERS as _DOWNLOADERS
from hermes_sandbox.tools.command_rules import END as _END
from hermes_sandbox.tools.command_rules import INTERPRETERS as _INTERPRETERS
from hermes_sandbox.tools.command_rules import RECURSIVE_FLAG as _RECURSIVE_FLAG
from hermes_sandbox.tools.command_rules import SHELLS as _SHELLS
from hermes_sandbox.tools.command_rules import WRITE_REDIRECT as _WRITE_REDIRECT
from hermes_sandbox.tools.command_rules import DangerousPattern
from hermes_sandbox.tools.command_rules import command as _command
from hermes_sandbox.tools.command_rules import has as _has
from hermes_sandbox.tools.command_rules import redirect as _redirect
from hermes_sandbox.tools.command_rules import rx as _rx
from hermes_sandbox.tools.command_rules import script as _script
from hermes_sandbox.tools.protected_paths import (
    HOME_DIRS,
    PROTECTED_HOME_ENTRIES,
    PROTECTED_SYSTEM_DIRS,
)
from hermes_sandbox.tools.routine_patterns import ROUTINE_PATTERNS, SUBCOMMAND_OPTIONS
from hermes_sandbox.tools.shell_words import (
    SimpleCommand,
    expand_words,
    normalise_command,
    normalise_path,
    parse,
)
from hermes_sandbox.tools.wrappers import (
    LONG_OPTIONS,
    WRAPPERS,
    Wrapper,
    expand_long_option,
    read_options,
    shell_quote,
    unwrap,
)

MAX_NESTING = 8  # deeper nesting of sh -c / $(...) is refused as too complex to check
MAX_CHECKED_CHARS = 1_000_000  # longer commands are refused as too long to check


@dataclass(frozen=True, slots=True)
class Finding:
    """A pattern that matched: its key and reason, and the text it matched in.

    ``unit`` is the normalised source of the simple command, pipeline or whole command
    the pattern matched; exact allowlist entries are compared with it. ``forms`` are what
    ``re:`` entries must all match (see :func:`_command_forms`); empty when no regex may
    allow the finding (an expansion the text does not show, or too many forms).
    """

    key: str
    reason: str
    unit: str
    forms: tuple[str, ...] = ()


# -- building blocks of the table ------------------------------------------------------

# An argument that names everything, a home, a top-level directory, or a second-level
# one under /usr, /var, /home and the like...
_BROAD_ABSOLUTE = (
    r"(?:/\*?"
    r"|/[^/ ]+(?:/\*)?"
    r"|/(?:usr|var|home|Users|opt|srv|snap|boot|etc|lib|lib32|lib64|libx32|root)/[^/ ]+(?:/\*)?"
    r"|~[\w.-]*(?:/\*)?|~[\w.-]*/\.[^/ ]+"
    r"|\$HOME(?:/\*)?|\$\{HOME\}(?:/\*)?|\$HOME/\.[^/ ]+|\$\{HOME\}/\.[^/ ]+"
    # ~ or a variable, then "..": above a directory whose depth the text does not show
    r"|(?:~[\w.-]*|\$\w+|\$\{\w+\})/\.\.(?:/\S*)?)"
)
# ...or the current or parent directory, or everything in one.
_BROAD_RELATIVE = r"(?:\*|\.\*|\.(?:/\*)?|\.\.(?:/\.\.)*(?:/\*)?)"
_BROAD_PATH = rf"(?:{_BROAD_ABSOLUTE}|{_BROAD_RELATIVE})"
# find tests that narrow what is deleted: "find . -name '*.pyc' -delete" is routine.
_FIND_NARROWING = (
    r"-(?:i?name|i?path|i?wholename|i?regex|newer\w*|[acm](?:time|min)|size|empty|user"
    r"|group|perm|inum|links|samefile|i?lname)"
)
_SYSTEM_BINARIES = r"/(?:etc|boot|bin|sbin|lib|lib32|lib64|libx32|usr/bin|usr/sbin|usr/lib)"
_IN_PLACE = r"(?:-[a-zA-Z]*i\S*|--in-place\S*)"  # sed -i, -i.bak, perl -pi
# /etc, or its macOS mirror /private/etc (where /etc is a symlink to it)
_ETC = r"(?:/private)?/etc"
_SEARCH_TOOLS = _rx(r"grep|egrep|fgrep|rg|ag|ack|git")


def _sql(key: str, regex: str, reason: str) -> DangerousPattern:
    return DangerousPattern(
        key, reason, "text", _rx(regex, re.IGNORECASE), unless_programs=_SEARCH_TOOLS
    )


_DELETES = r"(?:-delete|-exec(?:dir)? (?:\S*/)?rm)\b"


def _protected_paths() -> str:
    """A regex for a path write_file refuses (tools/protected_paths.py, one list for both):
    an entry of a home (``~/.ssh``, ``$HOME/.bashrc``, ``/root/.netrc``...) or a system
    directory. /etc and /dev are left to their own patterns (block devices only: writing
    to /dev/null is routine)."""
    home_dirs = [re.escape(d).replace(r"\*", "[^/ ]+") for d in HOME_DIRS]
    homes = "|".join([r"~[\w.-]*", r"\$HOME", r"\$\{HOME\}", *home_dirs])
    entries = "|".join(re.escape(e) for e in PROTECTED_HOME_ENTRIES)
    systems = "|".join(re.escape(d) for d in PROTECTED_SYSTEM_DIRS if d not in ("/etc", "/dev"))
    # $HERMES_HOME is Hermes Agent's ~/.hermes
    hermes = "|".join(
        re.escape(e.removeprefix(".hermes/"))
        for e in PROTECTED_HOME_ENTRIES
        if e.startswith(".hermes/")
    )
    hermes_home = rf"|(?:\$HERMES_HOME|\$\{{HERMES_HOME\}})/(?:{hermes})" if hermes else ""
    return rf"(?:(?:{homes})/(?:{entries})|{systems}{hermes_home})(?:/\S*)?"


_PROTECTED = _protected_paths()
_WRITES_PROTECTED = (
    "writes to a file that holds credentials or shell start-up code, or into a protected "
    "system directory (the file tools refuse the same paths)"
)

DANGEROUS_PATTERNS: tuple[DangerousPattern, ...] = (
    # -- deleting ---------------------------------------------------------------------
    _command(
        "rm-recursive-broad",
        "rm",
        rf"^{_has(_RECURSIVE_FLAG)}{_has(_BROAD_PATH)}",
        "recursively deletes a broad path (the root, a home, a top-level or system "
        "directory, the current or parent directory, or everything in one)",
    ),
    _command(
        "rm-no-preserve-root",
        "rm",
        rf"{_ARG}--no-preserve-root{_END}",
        "deletes with --no-preserve-root",
    ),
    _command(
        "rm-system-files",
        "rm|unlink|shred|rmdir",
        rf"{_ARG}{_SYSTEM_BINARIES}(?:/|{_END})",
        "deletes files of the operating system (/etc, /boot, /bin, /sbin, /lib, /usr/bin...)",
    ),
    _command(
        "find-delete-broad",
        "find",
        rf"^(?:-[HLP] )*{_BROAD_ABSOLUTE} (?:.* )?{_DELETES}",
        "deletes files found under the root, a home, or a top-level or system directory",
    ),
    _command(
        "find-delete-everything",
        "find",
        rf"^(?!.* {_FIND_NARROWING}{_END})(?:-[HLP] )*{_BROAD_RELATIVE} (?:.* )?{_DELETES}",
        "deletes everything under the current or parent directory",
    ),
    # -- disks ------------------------------------------------------------------------
    _command(
        "mkfs",
        r"mkfs(?:\.\w+)?|mke2fs|mkswap|mkdosfs|mkntfs",
        "",
        "creates a filesystem, erasing what the device held",
    ),
    _command(
        "disk-tool",
        "fdisk|sfdisk|cfdisk|gdisk|sgdisk|parted|wipefs|shred|blkdiscard",
        rf"^(?!.*{_ARG}-l{_END}).*{_ARG}/dev/",
        "repartitions or wipes a disk device",
    ),
    _command(
        "dd-to-device",
        "dd",
        rf"{_ARG}of=/dev/(?!(?:null|zero|full|stdout|stderr|tty|fd/\d+){_END})",
        "writes raw data to a device with dd",
    ),
    _redirect(
        "redirect-to-block-device",
        rf"{_WRITE_REDIRECT}{_BLOCK_DEVICE}",
        "writes to a block device through a redirection",
    ),
    _command(
        "copy-to-block-device",
        "tee|cp|pv|cat",
        rf"{_ARG}{_BLOCK_DEVICE}",
        "writes to a block device",
    ),
    # -- databases --------------------------------------------------------------------
    _sql(
        "sql-drop",
        r"\bdrop\s+(?:table|database|schema)\b",
        "drops a database, schema or table (SQL DROP)",
    ),
    _sql(
        "sql-delete-all",
        r"\bdelete\s+from\s+[\\\"`\[]*[\w.$-]+[\\\"`\]]*(?![^;'\"]*\bwhere\b)",
        "deletes every row of a table (SQL DELETE FROM without WHERE)",
    ),
    _sql(
        "sql-truncate",
        # TRUNCATE TABLE t, or TRUNCATE t with nothing but SQL after it ("truncate the
        # log" is prose)
        r"\btruncate\s+(?:table\b|only\b|[\w\"`\[][\w.\"`\]]*\s*(?:[;,'\"]|$|cascade\b"
        r"|restrict\b|restart\b|continue\b))",
        "empties a table (SQL TRUNCATE)",
    ),
    # -- system configuration ---------------------------------------------------------
    _redirect(
        "etc-redirect",
        rf"{_WRITE_REDIRECT}{_ETC}(?:/|$)",
        "writes a file under /etc through a redirection",
    ),
    _command("etc-tee", "tee", rf"{_ARG}{_ETC}(?:/|{_END})", "writes a file under /etc with tee"),
    _command(
        "etc-edit-in-place",
        "sed|perl|ruby",
        rf"^{_has(_IN_PLACE)}.*{_ARG}{_ETC}/",
        "edits a file under /etc in place",
    ),
    _command(
        "etc-copy-into",
        "cp|install|rsync|ln",
        rf"{_ARG}(?:-t |--target-directory=){_ETC}(?:/|{_END})|{_ARG}{_ETC}(?:/\S*)?$",
        "copies, moves or links a file into /etc",
    ),
    _command(
        "etc-modify",
        "mv|rm|unlink|shred|truncate|touch|mkdir|rmdir|chmod|chown|chgrp|chattr|setfacl|dd",
        rf"{_ARG}(?:of=)?{_ETC}(?:/|{_END})",
        "moves, deletes or changes a file under /etc",
    ),
    _command(
        "accounts",
        "useradd|userdel|usermod|groupadd|groupdel|groupmod|chpasswd|visudo",
        "",
        "changes system accounts or sudo rights",
    ),
    # -- what write_file refuses, written from the terminal ---------------------------
    _redirect("protected-redirect", rf"{_WRITE_REDIRECT}{_PROTECTED}$", _WRITES_PROTECTED),
    _command("protected-tee", "tee|truncate", rf"{_ARG}{_PROTECTED}{_END}", _WRITES_PROTECTED),
    _command(
        "protected-copy-into",
        "cp|install|ln|rsync",
        rf"{_ARG}(?:-t ?|--target-directory[= ]){_PROTECTED}{_END}|{_ARG}{_PROTECTED}$",
        _WRITES_PROTECTED,
    ),
    _command("protected-move", "mv", rf"{_ARG}{_PROTECTED}{_END}", _WRITES_PROTECTED),
    _command(
        "protected-edit-in-place",
        "sed|perl|ruby",
        rf"^{_has(_IN_PLACE)}.*{_ARG}{_PROTECTED}{_END}",
        _WRITES_PROTECTED,
    ),
    _command("protected-dd", "dd", rf"{_ARG}of={_PROTECTED}{_END}", _WRITES_PROTECTED),
    _command(
        "crontab-remove",
        "crontab",
        rf"{_ARG}-[a-zA-Z]*r[a-zA-Z]*{_END}",
        "removes every cron job of a user",
    ),
    # -- running downloaded code ------------------------------------------------------
    DangerousPattern(
        "download-pipe-shell",
        "pipes a download straight into a shell or interpreter",
        "pipeline",
        # a downloader, maybe more stages, then an interpreter given only options:
        # it runs what it reads ("python3 -m json.tool" has an operand, and passes)
        _rx(
            rf"(?:^|\| ){_DOWNLOADERS}(?: [^|]*)? \|(?: [^|]*\|)*? {_INTERPRETERS}"
            r"(?: [-+][\w-]*)*(?: --(?: [^|]*)?)?(?: \||$)"
        ),
    ),
    _command(
        "download-substitution-shell",
        rf"{_INTERPRETERS}|source|\.|eval",
        rf"(?:<\(|\$\(|`)\s*(?:\S*/)?{_DOWNLOADERS}\b",
        "runs a download in a shell or interpreter (<(curl ...), $(curl ...))",
    ),
    _redirect(
        "download-redirect-shell",
        rf"^{_INTERPRETERS} (?:<|<<<) .*(?:<\(|\$\(|`)\s*(?:\S*/)?{_DOWNLOADERS}\b",
        "feeds a download into a shell or interpreter",
    ),
    # -- processes and services -------------------------------------------------------
    _script(
        "fork-bomb",
        r"(?<![^\s;&|(){}])(?P<f>[^\s(){}|&;<>]++)\s*\(\s*\)\s*\{[^}]*?(?<![\w:.-])(?P=f)\s*\|\s*&?\s*"
        r"(?P=f)\s*&",
        "is a fork bomb",
    ),
    _script(
        "fork-bomb-function",
        r"\bfunction\s+(?P<f>[^\s(){}|&;<>]++)\s*(?:\(\s*\))?\s*\{[^}]*?(?<![\w:.-])"
        r"(?P=f)\s*\|\s*&?\s*(?P=f)\s*&",
        "is a fork bomb",
    ),
    _script(
        "fork-loop",
        r"\bfork\s+while\s+fork\b|while\s+(?:True|1)\s*:\s*os\.fork\(\)",
        "forks in an endless loop",
    ),
    _command(
        "kill-all",
        "kill",
        rf"^(?:(?:-s|-n|--signal) \S+ |-\S+ )+?(?:-- )?-1{_END}|^-- -1{_END}",
        "signals every process (kill ... -1)",
    ),
    _command("killall5", "killall5", "", "signals every process (killall5)"),
    _command(
        "kill-user-processes",
        "pkill|killall",
        rf"{_ARG}(?:-u|-U|--euid|--uid|--user)(?:[ =]|$)",
        "kills every process of a user",
    ),
    _command(
        "systemctl-stop",
        "systemctl",
        rf"{_ARG}(?:stop|restart|try-restart|reload-or-restart|try-reload-or-restart|disable"
        r"|mask|kill|isolate|halt|poweroff|reboot|kexec|suspend|hibernate|rescue|emergency"
        rf"|daemon-reexec){_END}",
        "stops, restarts or disables a system service, or changes the system state",
    ),
    _command(
        "service-stop",
        "service|rc-service|invoke-rc.d",
        rf"^(?:-\S+ )*\S+ (?:stop|restart|force-reload|force-stop|zap){_END}",
        "stops or restarts a system service",
    ),
    _command(
        "shutdown",
        "shutdown|reboot|halt|poweroff|kexec",
        "",
        "shuts down or reboots the machine",
    ),
    _command(
        "init-runlevel",
        "init|telinit",
        rf"^[06]{_END}",
        "shuts down or reboots the machine (runlevel 0 or 6)",
    ),
    # -- permissions ------------------------------------------------------------------
    _command(
        "chmod-recursive-broad",
        "chmod|chown|chgrp",
        rf"^{_has(_RECURSIVE_FLAG)}{_has(_BROAD_PATH)}",
        "recursively changes permissions or owners of a broad path",
    ),
    *ROUTINE_PATTERNS,
)
"""The table: every pattern with its key (used in session approvals) and reason."""


# -- reading a command ---------------------------------------------------------------

_SHELL_NAMES = re.compile(_SHELLS)

_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_SSH_VALUE_OPTIONS = frozenset("BbcDEeFIiJLlmOoPpQRSWw")
_WATCH = Wrapper(frozenset({"-n", "--interval", "-q", "--equexit"}))


@dataclass(slots=True)
class _Invocation:
    """A simple command with its wrappers removed."""

    program: str
    args: list[str]  # normalised
    raw_args: list[str]  # as the shell passes them (quotes removed)
    at: int | None = None  # index of the program among the words; None if a shell runs it

    @property
    def args_text(self) -> str:
        return " ".join(self.args)

    @property
    def text(self) -> str:
        return f"{self.program} {self.args_text}".strip()


def _invocation(words: list[str]) -> _Invocation | None:
    argv = unwrap(words)
    if not argv:
        return None
    at: int | None = len(words) - len(argv)
    if words[at:] != argv:
        at = None  # env -S or a wrapper's -c made the words the program sees
    program, raw = argv[0], argv[1:]
    if program.startswith("/etc/init.d/"):
        program, raw = "service", [posixpath.basename(program), *raw]
    name = posixpath.basename(program)
    before_subcommand = SUBCOMMAND_OPTIONS.get(name)
    lead = 0 if before_subcommand is None else read_options(raw, 0, before_subcommand).end
    longs = LONG_OPTIONS.get(name)
    if longs:
        end = raw.index("--") if "--" in raw else len(raw)
        raw = [expand_long_option(a, longs) for a in raw[:end]] + raw[end:]
    # the table reads a subcommand's arguments; nested code may hide in the options
    return _Invocation(name, [normalise_path(a) for a in raw[lead:]], raw, at)


# -- the forms an allowlist regex must match ------------------------------------------

MAX_ALLOWLIST_FORMS = 64  # a command read as more forms than this is left to a human
# Programs whose operands are all paths after the first N (chmod's mode, chown's owner).
_PATH_OPERANDS = {
    **dict.fromkeys(("rm", "rmdir", "unlink", "shred", "tee", "truncate", "touch", "mkdir"), 0),
    **dict.fromkeys(("cp", "mv", "ln", "install", "rsync"), 0),
    **dict.fromkeys(("chmod", "chown", "chgrp"), 1),
}
_GLOB = re.compile(r"[*?[]")


def _is_path(word: str) -> bool:
    return "/" in word or word.startswith("~") or word in (".", "..") or bool(_GLOB.search(word))


def _command_forms(
    words: Sequence[tuple[str, bool]], invocation: _Invocation | None
) -> list[str] | None:
    """The forms of one simple command that a ``re:`` entry must all match, or None when
    a word holds an expansion whose value the text does not show.

    Each word is normalised (quotes removed, paths resolved lexically). Each path operand
    of the program gets a form of its own, with the other path operands left out, so a
    regex's ``.*`` can never stretch over a second path: ``rm -rf /tmp/x /`` reads as
    ``rm -rf /tmp/x`` and ``rm -rf /``.
    """
    if any(expands for _, expands in words):
        return None
    rendered = [normalise_path(text) for text, _ in words]
    at = invocation.at if invocation is not None and invocation.at is not None else 0
    leading = _PATH_OPERANDS.get(invocation.program if invocation else "")
    paths: list[int] = []
    options = True
    operand = 0
    for index in range(at + 1, len(rendered)):
        word = rendered[index]
        if options and word == "--":
            options = False
            continue
        if options and word.startswith("-") and word != "-":
            continue
        if (leading is not None and operand >= leading) or _is_path(word):
            paths.append(index)
        operand += 1
    if len(paths) <= 1:
        return [" ".join(rendered)]
    if len(paths) > MAX_ALLOWLIST_FORMS:
        return None
    others = set(paths)
    return [
        " ".join(w for i, w in enumerate(rendered) if i not in others or i == keep)
        for keep in paths
    ]


def _shell_code(invocation: _Invocation) -> tuple[str | None, bool]:
    """For a shell: (the -c string or None, whether it reads its script from stdin)."""
    args = invocation.raw_args
    has_c = False
    reads_stdin = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg in _SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if arg == "-" or not (arg.startswith("-") or arg.startswith("+")):
            break
        if not arg.startswith("--"):
            has_c = has_c or "c" in arg[1:]
            reads_stdin = reads_stdin or "s" in arg[1:]
        i += 1
    operand = args[i] if i < len(args) else None
    if has_c:
        return operand, False
    return None, reads_stdin or operand is None or operand == "-"


def _nested_code(invocation: _Invocation) -> list[str]:
    """Shell code that ``invocation`` runs from its arguments: sh -c, su -c, eval..."""
    program, args = invocation.program, invocation.raw_args
    if _SHELL_NAMES.fullmatch(program):
        code, _ = _shell_code(invocation)
        return [code] if code is not None else []
    if program in ("su", "runuser"):
        found = []
        for i, arg in enumerate(args):
            if arg in ("-c", "--command") and i + 1 < len(args):
                found.append(args[i + 1])
            elif arg.startswith("--command="):
                found.append(arg.partition("=")[2])
        return found
    if program == "eval":
        return [" ".join(args)] if args else []
    if program == "git":
        # "git -c alias.x='!CMD' x": an alias starting with "!" is shell code
        return [
            value.partition("=!")[2]
            for option, value in itertools.pairwise(args)
            if option == "-c" and value.startswith("alias.") and "=!" in value
        ]
    if program == "hermes":
        # what Hermes's CLI runs or schedules: "hermes run CMD", "hermes cron create W CMD"
        if args[:1] == ["run"] and len(args) > 1:
            return [" ".join(args[1:])]
        if args[:2] in (["cron", "create"], ["cron", "add"]) and len(args) > 3:
            return [args[-1]]
        return []
    if program == "watch":
        rest = args[read_options(args, 0, _WATCH).end :]
        return [" ".join(rest)] if rest else []
    if program == "ssh":
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "--":
            flag = args[i]
            i += 2 if len(flag) == 2 and flag[1] in _SSH_VALUE_OPTIONS else 1
        if i < len(args) and args[i] == "--":
            i += 1
        rest = args[i + 1 :]  # args[i] is the host
        return [" ".join(rest)] if rest else []
    if program == "find":
        found = []
        current: list[str] | None = None
        for arg in args:
            if current is None:
                if arg in ("-exec", "-execdir", "-ok", "-okdir"):
                    current = []
            elif arg in (";", "+"):
                found.append(" ".join(shell_quote(a) for a in current))
                current = None
            else:
                current.append(arg)
        if current:
            found.append(" ".join(shell_quote(a) for a in current))
        return found
    return []


def _wrapper_layers(words: list[str], program: str) -> list[tuple[str, str]]:
    """Each wrapper among ``words`` (those before the program), as (name, ``"ITS OPTIONS
    => PROGRAM"``): ``sudo -S -u bob xargs rm`` gives ("sudo", "-S -u bob => rm") and
    ("xargs", " => rm")."""
    layers = []
    for index, word in enumerate(words):
        name = posixpath.basename(word)
        spec = WRAPPERS.get(name)
        if spec is None:
            continue
        end = read_options(words, index + 1, spec).end
        options = [expand_long_option(w, spec.long_options) for w in words[index + 1 : end]]
        layers.append((name, f"{' '.join(options)} => {program}"))
    return layers


def _pipeline_forms(pipeline: list[SimpleCommand]) -> list[str] | None:
    """Each combination of its stages' forms, joined by `` | ``; None if a stage has none."""
    combined = [""]
    for command in pipeline:
        words = expand_words(command.words)
        stage = _command_forms(words, _invocation([text for text, _ in words]))
        if stage is None or len(combined) * len(stage) > MAX_ALLOWLIST_FORMS:
            return None
        combined = [
            f"{before} | {form}" if before else form for before in combined for form in stage
        ]
    return combined


def _reads_code(invocation: _Invocation) -> bool:
    """Whether ``invocation`` runs what it reads on stdin: ``sh``/``sh -s``, or ``ssh
    HOST`` with no command (the remote shell reads it)."""
    if _SHELL_NAMES.fullmatch(invocation.program):
        return _shell_code(invocation)[1]
    return invocation.program == "ssh" and not _nested_code(invocation)


def _echoed_text(invocation: _Invocation, command: SimpleCommand) -> str | None:
    """What ``echo``/``printf`` writes, roughly, or the here-document ``cat`` writes;
    None for other programs."""
    if invocation.program == "cat" and not invocation.args:
        bodies = [t.body for _, t in command.redirects if t.body is not None]
        return "\n".join(bodies) if bodies else None
    if invocation.program == "echo":
        args = invocation.raw_args
        while args and re.fullmatch(r"-[neE]+", args[0]):
            args = args[1:]
        return " ".join(args)
    if invocation.program == "printf":
        return " ".join(invocation.raw_args)
    return None


class _Detector:
    """One detection pass: walks the command and its nested code, collecting findings."""

    def __init__(self, patterns: Sequence[DangerousPattern]) -> None:
        self.by_scope: dict[str, list[DangerousPattern]] = {}
        for pattern in patterns:
            self.by_scope.setdefault(pattern.scope, []).append(pattern)
        self._for_program: dict[str, tuple[list[DangerousPattern], list[DangerousPattern]]] = {}
        # (key, unit) -> (reason, forms so far; None once no regex may allow it)
        self.found: dict[tuple[str, str], tuple[str, list[str] | None]] = {}

    def add(self, key: str, reason: str, unit: str, forms: list[str] | None) -> None:
        """Record a finding; the same (key, unit) found again adds its forms."""
        known = self.found.get((key, unit))
        if known is not None:
            before = known[1]
            if before is None or forms is None:
                forms = None
            else:
                forms = before + [f for f in forms if f not in before]
        if forms is not None and len(forms) > MAX_ALLOWLIST_FORMS:
            forms = None
        self.found[(key, unit)] = (reason, forms)

    def findings(self) -> list[Finding]:
        return [
            Finding(key, reason, unit, tuple(forms or ()))
            for (key, unit), (reason, forms) in self.found.items()
        ]

    def for_program(self, program: str) -> tuple[list[DangerousPattern], list[DangerousPattern]]:
        """The command-scope and text-scope patterns that apply to ``program``."""
        cached = self._for_program.get(program)
        if cached is None:
            command = [
                p
                for p in self.by_scope.get("command", ())
                if p.programs is None or p.programs.fullmatch(program)
            ]
            text = [
                p
                for p in self.by_scope.get("text", ())
                if p.unless_programs is None or not p.unless_programs.fullmatch(program)
            ]
            cached = self._for_program[program] = (command, text)
        return cached

    def run(self, text: str, depth: int = 0) -> None:
        if depth > MAX_NESTING:
            self.add(
                "too-complex",
                f"nests shell code more than {MAX_NESTING} levels deep, too deep to check",
                normalise_command(text),
                None,
            )
            return
        if depth == 0:
            whole = normalise_command(text)
            for pattern in self.by_scope.get("script", ()):
                if pattern.regex.search(whole):
                    self.add(pattern.key, pattern.reason, whole, [whole])
        for pipeline in parse(text):
            invocations = [self.simple(text, command, depth) for command in pipeline]
            if len(pipeline) > 1:
                self.pipeline(text, pipeline, invocations, depth)

    def simple(self, text: str, command: SimpleCommand, depth: int) -> _Invocation | None:
        unit = normalise_command(text[command.start : command.end])
        for word in command.words:
            for sub in word.substitutions:
                self.run(sub, depth + 1)
        for _, target in command.redirects:
            for sub in target.substitutions:
                self.run(sub, depth + 1)
        words = expand_words(command.words)
        invocation = _invocation([text for text, _ in words])
        program = invocation.program if invocation else ""
        command_patterns, text_patterns = self.for_program(program)
        cache: list[list[str] | None] = []  # the command's forms, once first needed

        def forms() -> list[str] | None:
            if not cache:
                cache.append(_command_forms(words, invocation))
            return cache[0]

        # a here-document is text the program reads: SQL fed to mysql <<EOF counts
        texts = [unit, *(t.body for _, t in command.redirects if t.body is not None)]
        for pattern in text_patterns:
            if any(pattern.regex.search(text) for text in texts):
                self.add(pattern.key, pattern.reason, unit, forms())
        argv = [text for text, _ in words]
        if invocation is not None and invocation.at is not None:
            argv = argv[: invocation.at]  # the wrappers before the program, not its arguments
        for name, rendered in _wrapper_layers(argv, program):
            for pattern in self.by_scope.get("wrapper", ()):
                wraps = pattern.programs is not None and pattern.programs.fullmatch(name)
                if wraps and pattern.regex.search(rendered):
                    self.add(pattern.key, pattern.reason, unit, forms())
        if invocation is not None:
            args_text = invocation.args_text
            for pattern in command_patterns:
                if pattern.regex.search(args_text):
                    self.add(pattern.key, pattern.reason, unit, forms())
        for operator, target in command.redirects:
            path = normalise_path(target.text)
            rendered = f"{program} {operator} {path}"
            for pattern in self.by_scope.get("redirect", ()):
                if pattern.regex.search(rendered):
                    found = None if target.expands else forms()
                    with_target = (
                        None if found is None else [f"{f} {operator} {path}" for f in found]
                    )
                    self.add(pattern.key, pattern.reason, unit, with_target)
        if invocation is None:
            return None
        for code in _nested_code(invocation):
            self.run(code, depth + 1)
        if _reads_code(invocation):
            for operator, target in command.redirects:
                if operator == "<<<":
                    self.run(target.text, depth + 1)
                elif target.body is not None:
                    self.run(target.body, depth + 1)
        return invocation

    def pipeline(
        self,
        text: str,
        pipeline: list[SimpleCommand],
        invocations: list[_Invocation | None],
        depth: int,
    ) -> None:
        unit = normalise_command(text[pipeline[0].start : pipeline[-1].end])
        rendered = " | ".join(inv.text if inv else "" for inv in invocations)
        for pattern in self.by_scope.get("pipeline", ()):
            if pattern.regex.search(rendered):
                self.add(pattern.key, pattern.reason, unit, _pipeline_forms(pipeline))
        carried: str | None = None  # text echoed into the pipe, passed on through cat
        for command, stage in zip(pipeline, invocations, strict=True):
            if stage is not None and carried is not None and _reads_code(stage):
                self.run(carried, depth + 1)
            if stage is None:
                carried = None
            elif stage.program == "cat" and not stage.args and carried is not None:
                continue
            else:
                carried = _echoed_text(stage, command)


def detect_dangerous(
    command: str, patterns: Sequence[DangerousPattern] = DANGEROUS_PATTERNS
) -> list[Finding]:
    """Every dangerous thing ``command`` does, by the patterns; [] when none.

    Pure computation, about 30 us per simple command: call it in a worker thread for
    very long commands.
    """
    if len(command) > MAX_CHECKED_CHARS:
        return [
            Finding(
                "too-long",
                f"is over {MAX_CHECKED_CHARS:,} characters, too long to check",
                normalise_command(command[:200]) + " ...",
            )
        ]
    detector = _Detector(patterns)
    detector.run(command)
    for reading in _other_readings(command):
        detector.run(reading)
    return detector.findings()


def _other_readings(command: str) -> list[str]:
    """Other ways to read ``command``, each checked too: as it looks on a terminal (escape
    sequences and NUL bytes gone, look-alike letters such as fullwidth ``ｒｍ`` folded),
    and with its line continuations joined first (``$\\<newline>'...'`` is ``$'...'``)."""
    displayed = unicodedata.normalize("NFKC", strip_ansi(command).replace("\x00", ""))
    joined = command.replace("\\\n", "")
    return list(dict.fromkeys(r for r in (displayed, joined) if r != command))
