"""Programs that run another command, read the way each of them reads its own options.

The approval check (:mod:`hermes_sandbox.tools.approval`) looks at the command a wrapper
chain finally runs: ``sudo -u bob nice -n 5 flock /tmp/l rm -rf /`` runs ``rm -rf /``.
:func:`unwrap` finds it. Each wrapper is described by :class:`Wrapper`: its options that
take a value (so the value is not taken for the command), its long options (GNU getopt
accepts any unambiguous prefix: ``--sig`` is ``--signal``, see :func:`expand_long_option`),
and the operands that come before the command (``timeout DURATION``). A few wrappers run
their command through a shell (``flock FILE -c CMD``, ``script -c CMD``, GNU ``parallel``);
:func:`unwrap` turns those into ``sh -c CMD`` so the shell code is read like any other.
:data:`LONG_OPTIONS` lists the long options of the programs the approval table reads
options of (rm, chmod, sed, cp...), so their abbreviations are spelled out too.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Words that may come before a command without being it: shell keywords and X=Y.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "do", "while", "until", "time"})
MAX_PARALLEL_JOBS = 64  # parallel's ::: values read as jobs; more are not read


def expand_long_option(arg: str, known: Iterable[str]) -> str:
    """``arg`` with an abbreviated long option spelled out, as GNU getopt reads it.

    ``--recur`` is ``--recursive`` when no other of the ``known`` long options starts
    with ``--recur``; a value after ``=`` is kept. Exact, unknown and ambiguous options
    (which getopt refuses) come back as they are.
    """
    if not arg.startswith("--") or arg == "--":
        return arg
    name, eq, value = arg.partition("=")
    known = tuple(known)
    if name in known:
        return arg
    matches = [option for option in known if option.startswith(name)]
    return matches[0] + eq + value if len(matches) == 1 else arg


@dataclass(frozen=True, slots=True)
class Wrapper:
    """How one wrapper's command line reads, up to the command it runs."""

    values: frozenset[str] = frozenset()  # options that take a value: "-u", "--user"
    flags: frozenset[str] = frozenset()  # long options that take none (for abbreviations)
    positional: int = 0  # operands before the command: timeout's DURATION
    shell: frozenset[str] = frozenset()  # options whose value is shell code: "-c"

    @property
    def long_options(self) -> frozenset[str]:
        return frozenset(o for o in self.values | self.flags | self.shell if o.startswith("--"))


def _w(values: str = "", flags: str = "", positional: int = 0, shell: str = "") -> Wrapper:
    return Wrapper(
        frozenset(values.split()), frozenset(flags.split()), positional, frozenset(shell.split())
    )


WRAPPERS: dict[str, Wrapper] = {
    "sudo": _w(
        "-u -g -h -p -C -D -r -t -T -U -R --user --group --host --prompt --chdir --role "
        "--type --other-user --close-from --command-timeout --chroot",
        "--askpass --background --bell --edit --help --login --non-interactive "
        "--preserve-env --preserve-groups --remove-timestamp --reset-timestamp --shell "
        "--stdin --version --validate --list",
    ),
    "doas": _w("-u -C"),
    "pkexec": _w("--user", "--disable-internal-agent --keep-cwd --help --version"),
    "runuser": _w(
        "-u -g -G -s -w --user --group --supp-group --shell --whitelist-environment",
        "--login --preserve-environment --pty --help --version",
    ),
    "command": _w(),
    "builtin": _w(),
    "exec": _w("-a"),
    "nohup": _w("", "--help --version"),
    "setsid": _w("", "--ctty --fork --wait --help --version"),
    "time": _w("-f -o --format --output", "--append --portability --verbose --quiet --help"),
    "nice": _w("-n --adjustment", "--help --version"),
    "ionice": _w(
        "-c -n -p -P -u --class --classdata --pid --pgid --uid", "--ignore --help --version"
    ),
    "timeout": _w(
        "-s -k --signal --kill-after", "--foreground --preserve-status --verbose --help", 1
    ),
    "stdbuf": _w("-i -o -e --input --output --error", "--help --version"),
    "unbuffer": _w(),
    "chroot": _w("--userspec --groups", "--skip-chdir --help --version", 1),
    "taskset": _w("", "--all-tasks --pid --cpu-list --help --version", 1),
    "busybox": _w(),
    "xargs": _w(
        "-a -d -E -I -L -n -P -s --arg-file --delimiter --max-args --max-procs --max-lines "
        "--replace --process-slot-var --max-chars --eof",
        "--null --interactive --verbose --no-run-if-empty --show-limits --exit --open-tty "
        "--help --version",
    ),
    "flock": _w(
        "-w -E --wait --timeout --conflict-exit-code",
        "--shared --exclusive --unlock --nonblock --nb --close --no-fork --verbose --help "
        "--version",
        1,
        "-c --command",
    ),
    "strace": _w(
        "-e -o -p -s -u -E -a -b -I -O -S -X -P -U --trace --trace-fds --output --attach "
        "--string-limit --user --env --columns --detach-on --interruptible --overhead "
        "--summary-sort-by --const-print-style --trace-path --signal --status --quiet "
        "--silence --decode-fds --decode-pids --secontext --summary-columns --syscall-limit "
        "--argv0 --inject --fault --abbrev --verbose --raw --read --write --kvm "
        "--absolute-timestamps --timestamps",
        "--follow-forks --output-separately --summary-only --summary --summary-wall-clock "
        "--seccomp-bpf --debug --daemonize --no-abbrev --relative-timestamps --syscall-times "
        "--stack-trace --instruction-pointer --kill-on-exit --successful-only "
        "--failed-only --help --version",
    ),
    "unshare": _w(
        "-S -G -R -w -l --setuid --setgid --root --wd --map-user --map-group --map-users "
        "--map-groups --propagation --setgroups --monotonic --boottime --load-interp",
        "--mount --uts --ipc --net --pid --user --cgroup --time --fork --mount-proc "
        "--map-root-user --map-current-user --map-auto --map-subids --kill-child "
        "--keep-caps --help --version",
    ),
    "setpriv": _w(
        "--ambient-caps --inh-caps --bounding-set --ruid --euid --rgid --egid --reuid "
        "--regid --groups --securebits --pdeathsig --selinux-label --apparmor-profile "
        "--landlock-access --landlock-rule",
        "--dump --nnp --no-new-privs --clear-groups --keep-groups --init-groups "
        "--reset-env --help --version",
    ),
    "systemd-run": _w(
        "-u -p -E -M -H -C --unit --property --description --slice --uid --gid --nice "
        "--working-directory --setenv --on-active --on-boot --on-startup --on-unit-active "
        "--on-unit-inactive --on-calendar --timer-property --path-property "
        "--socket-property --machine --host --service-type --capsule",
        "--user --system --scope --no-block --wait --remain-after-exit --send-sighup --pty "
        "--pipe --quiet --collect --shell --same-dir --no-ask-password --on-clock-change "
        "--on-timezone-change --slice-inherit --expand-environment --ignore-failure "
        "--background --help --version",
    ),
    "chrt": _w(
        "-T -P -D --sched-runtime --sched-period --sched-deadline",
        "--all-tasks --batch --deadline --fifo --idle --other --rr --reset-on-fork --max "
        "--pid --verbose --help --version",
        1,
    ),
    "ltrace": _w(
        "-a -A -D -e -F -l -n -o -p -s -u -w -x -b -L --align --indent --library --output",
        "--demangle --help --version --no-signals",
    ),
    "nsenter": _w(
        "-t -S -G --target --setuid --setgid --env",
        "--all --mount --uts --ipc --net --pid --cgroup --user --time --user-parent "
        "--preserve-credentials --keep-caps --root --wd --wdns --no-fork --follow-context "
        "--help --version",
    ),
    "prlimit": _w("-p -o --pid --output", "--noheadings --raw --verbose --help --version"),
    "setarch": _w(
        "",
        "--verbose --addr-no-randomize --fdpic-funcptrs --mmap-page-zero --addr-compat-layout "
        "--read-implies-exec --32bit --short-inode --whole-seconds --sticky-timeouts "
        "--3gb --4gb --uname-2.6 --list --show --help --version",
    ),
    "fakeroot": _w("-l -s -i -b --lib --faked", "--unknown-is-real --help --version"),
}
"""Every wrapper :func:`unwrap` looks through, by program base name."""

_ENV = _w(
    "-u -C -S -a --unset --chdir --split-string --argv0",
    "--ignore-environment --null --block-signal --default-signal --ignore-signal "
    "--list-signal-handling --debug --help --version",
)
_SCRIPT = _w(
    "-E -I -O -B -T -m -o --echo --log-in --log-out --log-io --log-timing "
    "--logging-format --output-limit",
    "--append --return --flush --force --quiet --timing --help --version",
    0,
    "-c --command",
)
_PARALLEL = _w(
    "-a -d -E -I -j -L -l -n -N -P -S -s -X --arg-file --delimiter --eof --replace --jobs "
    "--max-procs --max-lines --max-args --max-replace-args --sshlogin --max-chars --colsep "
    "--results --res --joblog --tmpdir --timeout --retries --delay --basefile --workdir "
    "--env --memfree --load --nice --tag-string --tagstring --return --transfer-file "
    "--ssh --halt --termseq --sshloginfile --arg-sep --arg-file-sep --shebang-wrap",
    "--null --keep-order --group --ungroup --line-buffer --tag --verbose --dry-run --eta "
    "--progress --bar --quote --no-run-if-empty --pipe --pipepart --shuf --xapply --link "
    "--halt-on-error --help --version",
)
_PARALLEL_SEPARATORS = (":::", "::::", ":::+", "::::+")
_PARALLEL_REPLACEMENT = re.compile(r"\{(?:\.|/|//|/\.|#|%|\d+)?\}")


def shell_quote(word: str) -> str:
    """``word`` as one shell word (left bare when it has nothing a shell would read)."""
    if word and re.fullmatch(r"[\w@%+=:,./~{}*$-]+", word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


@dataclass(slots=True)
class _Options:
    """Where a wrapper's options end, and the shell code one of them gave."""

    end: int
    code: str | None = None


def read_options(args: list[str], i: int, spec: Wrapper, *, permute: bool = False) -> _Options:
    """Read the options of ``spec`` in ``args`` from ``i``: short bundles (``-fo FILE``),
    abbreviated long options, values attached or separate. Stops at the first operand
    (or reads past operands when ``permute``, as GNU getopt does for ``script``)."""
    longs = spec.long_options
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return _Options(i + 1)
        if not arg.startswith("-") or arg == "-":
            if permute:
                i += 1
                continue
            return _Options(i)
        if arg.startswith("--"):
            name, eq, value = expand_long_option(arg, longs).partition("=")
            takes = name in spec.values or name in spec.shell
            if name in spec.shell:
                code = value if eq else (args[i + 1] if i + 1 < len(args) else "")
                return _Options(len(args), code)
            i += 2 if takes and not eq else 1
            continue
        consumed = 1
        for j in range(1, len(arg)):
            letter = "-" + arg[j]
            if letter in spec.shell:
                attached = arg[j + 1 :]
                code = attached or (args[i + 1] if i + 1 < len(args) else "")
                return _Options(len(args), code)
            if letter in spec.values:
                consumed = 1 if j + 1 < len(arg) else 2
                break
        i += consumed
    return _Options(i)


def _as_shell(code: str | None) -> list[str]:
    return ["sh", "-c", code] if code else []


def _unwrap_flock(args: list[str], i: int) -> int | list[str]:
    spec = WRAPPERS["flock"]
    options = read_options(args, i, spec)
    if options.code is not None:
        return _as_shell(options.code)
    start = options.end + spec.positional  # after the lock file
    if args[start : start + 1] in (["-c"], ["--command"]):
        return _as_shell(args[start + 1] if start + 1 < len(args) else None)
    return start


def _unwrap_setarch(args: list[str], i: int) -> int | list[str]:
    # setarch ARCH [options] [program]: the architecture comes before the options
    return read_options(args, i + 1, WRAPPERS["setarch"]).end


def _unwrap_script(args: list[str], i: int) -> int | list[str]:
    # script runs a shell unless -c gives a command; options may follow the log file
    return _as_shell(read_options(args, i, _SCRIPT, permute=True).code)


def _unwrap_parallel(args: list[str], i: int) -> int | list[str]:
    rest = args[read_options(args, i, _PARALLEL).end :]
    cut = next((k for k, a in enumerate(rest) if a in _PARALLEL_SEPARATORS), len(rest))
    code = " ".join(rest[:cut])  # parallel hands its command to a shell
    values: list[str] = []
    source = None
    for arg in rest[cut:]:
        if arg in _PARALLEL_SEPARATORS:
            source = arg
        elif source in (":::", ":::+"):  # :::: names files of values, unread here
            values.append(arg)
    if not values:
        return _as_shell(code)
    jobs = []
    for value in values[:MAX_PARALLEL_JOBS]:
        if not code:
            jobs.append(value)  # no command: each value is one
        elif _PARALLEL_REPLACEMENT.search(code):
            jobs.append(_PARALLEL_REPLACEMENT.sub(shell_quote(value).replace("\\", "\\\\"), code))
        else:
            jobs.append(f"{code} {shell_quote(value)}")
    return _as_shell("\n".join(jobs))


# Wrappers read by a function of (args, index after the name): the index of the command
# they run, or the shell command (["sh", "-c", CODE]) they run instead.
_SPECIAL: dict[str, Callable[[list[str], int], int | list[str]]] = {
    "flock": _unwrap_flock,
    "script": _unwrap_script,
    "parallel": _unwrap_parallel,
    "setarch": _unwrap_setarch,
}


def _skip_env(args: list[str], i: int) -> tuple[list[str], int]:
    """``env``'s options and X=Y words from ``i``; ``-S`` splits its string into words."""
    longs = _ENV.long_options
    while i < len(args):
        arg = expand_long_option(args[i], longs)
        if arg in ("-S", "--split-string") and i + 1 < len(args):
            args = args[: i + 1] + args[i + 1].split() + args[i + 2 :]
            i += 1
        elif arg.startswith("--split-string="):
            args = args[:i] + arg.partition("=")[2].split() + args[i + 1 :]
        elif arg.startswith("-S") and len(arg) > 2 and not arg.startswith("--"):
            args = args[:i] + arg[2:].split() + args[i + 1 :]
        elif arg == "--":
            return args, i + 1
        elif arg in _ENV.values:
            i += 2
        elif (arg.startswith("-") and arg != "-") or ASSIGNMENT.match(arg):
            i += 1
        else:
            break
    return args, i


def unwrap(args: list[str]) -> list[str]:
    """The command a wrapper chain runs: ``sudo env X=1 nice rm -rf /`` -> ``rm -rf /``.

    Wrappers that run a shell (``flock F -c CMD``, ``script -c CMD``, ``parallel``) come
    back as ``["sh", "-c", CMD]``. ``command -v NAME`` and wrappers given no command come
    back empty: they run nothing.
    """
    i = 0
    while i < len(args):
        word = args[i]
        name = posixpath.basename(word)
        if word in KEYWORDS or ASSIGNMENT.match(word):
            i += 1
        elif name == "env":
            args, i = _skip_env(args, i + 1)
        elif name == "command" and i + 1 < len(args) and args[i + 1] in ("-v", "-V"):
            return []  # only looks the name up
        elif name in _SPECIAL:
            found = _SPECIAL[name](args, i + 1)
            if isinstance(found, list):
                return found
            i = found
        elif name in WRAPPERS:
            spec = WRAPPERS[name]
            i = read_options(args, i + 1, spec).end + spec.positional
        else:
            break
    return args[i:]


# The long options of the programs the table reads options of, so that an abbreviation
# reads as the option it is to GNU getopt: "rm --recur /" is "rm --recursive /".
_CHOWN_LONG = (
    "--changes --dereference --no-dereference --from --no-preserve-root --preserve-root "
    "--quiet --silent --reference --recursive --verbose --help --version"
)
_COPY_LONG = (
    "--backup --force --interactive --no-clobber --strip-trailing-slashes --suffix "
    "--target-directory --no-target-directory --update --verbose --context --debug --help "
    "--version"
)
LONG_OPTIONS: dict[str, tuple[str, ...]] = {
    name: tuple(options.split())
    for names, options in (
        (
            "rm",
            "--force --interactive --one-file-system --no-preserve-root --preserve-root "
            "--recursive --dir --verbose --help --version",
        ),
        (
            "chmod",
            "--changes --silent --quiet --verbose --no-preserve-root --preserve-root "
            "--reference --recursive --help --version",
        ),
        ("chown chgrp", _CHOWN_LONG),
        (
            "sed",
            "--quiet --silent --debug --expression --file --follow-symlinks --in-place "
            "--line-length --null-data --zero-terminated --posix --regexp-extended "
            "--separate --sandbox --unbuffered --help --version",
        ),
        (
            "cp",
            _COPY_LONG + " --archive --attributes-only --copy-contents --dereference --link "
            "--no-dereference --preserve --no-preserve --parents --recursive --reflink "
            "--remove-destination --sparse --symbolic-link --one-file-system "
            "--keep-directory-symlink",
        ),
        ("mv", _COPY_LONG + " --exchange --no-copy"),
        (
            "install",
            _COPY_LONG + " --compare --directory --group --mode --owner --preserve-timestamps "
            "--strip --strip-program --preserve-context",
        ),
        (
            "ln",
            _COPY_LONG + " --directory --logical --no-dereference --physical --relative --symbolic",
        ),
        ("tee", "--append --ignore-interrupts --output-error --help --version"),
        ("truncate", "--no-create --io-blocks --reference --size --help --version"),
        (
            "shred",
            "--force --iterations --random-source --size --remove --verbose --exact --zero "
            "--help --version",
        ),
        (
            "pkill",
            "--signal --count --euid --uid --group --parent --ns --nslist --session "
            "--terminal --full --ignore-case --newest --oldest --older --pidfile "
            "--logpidfile --runstates --echo --inverse --exact --cgroup --lightweight "
            "--delimiter --list-name --list-full --require-handler --queue --env --help "
            "--version",
        ),
        (
            "killall",
            "--exact --ignore-case --process-group --younger-than --older-than "
            "--interactive --quiet --regexp --signal --user --verbose --wait --ns --context "
            "--help --version",
        ),
        ("kill", "--signal --list --table --queue --timeout --verbose --help --version"),
    )
    for name in names.split()
}
