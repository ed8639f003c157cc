"""Backends that reach their sandbox only through an exec stream share this.

:class:`HelperEnvironment` is an :class:`~environments.base.Environment` that can do
one thing natively: start a command inside the sandbox with its stdin and stdout as a
byte stream (:meth:`HelperEnvironment._open_exec`; a docker exec, an ssh channel, a
cloud SDK's exec). Everything else (running a shell command under a timeout, killing
what it left behind, reading and writing files, scratch directories) runs a small
stdlib helper program, :data:`HELPER_SOURCE`, with the sandbox's own Python through
that stream, so each backend only writes its lifecycle and its ``_open_exec``.

The helper is run as ``python3 -c HELPER_SOURCE VERB ARGS``. It imports only modules
that even Debian's python3-minimal has (no json, shutil, tempfile), and works on
Python 3.6+. Data goes to stdout. A failed file operation is one line on stderr:
:data:`HELPER_ERROR`, then the errno name, the message and the file name, each
hex-encoded UTF-8, joined by tabs; the host raises the same OSError subclass
(:func:`raise_helper_failure`).

Verbs: ``run TOKEN GRACE CWD COMMAND`` (``/bin/sh -c COMMAND`` in a new session with
``HERMES_SANDBOX_EXEC=TOKEN`` in its environment, stdout and stderr combined; what it
leaves running is killed when it exits), ``kill TOKEN GRACE`` (every process with that
marker, and their sessions), ``stat PATH``, ``read PATH MAX``, ``write PATH PARENTS
MODE`` (data on stdin), ``mkdtemp PREFIX PARENT`` (prints the new directory and the
user's home), ``rmtree PATH``.
"""

from __future__ import annotations

import abc
import dataclasses
import errno as errno_module
import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, cast

import anyio

from hermes_sandbox.environments.base import (
    DEFAULT_MAX_COMMAND_OUTPUT,
    TIMEOUT_EXIT_CODE,
    CommandResult,
    Environment,
    ExecStream,
    FileKind,
    FileStat,
    SandboxProcess,
)
from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.environments.errors import BackendError, EnvironmentFailure, SpawnNotAvailable

log = logging.getLogger(__name__)

HELPER_ERROR = "HERMES-SANDBOX-ERROR "
_DRAIN_SECONDS = 1.0

HELPER_SOURCE = r"""
import errno, os, signal, stat, sys, time

MARK = "HERMES_SANDBOX_EXEC"


def hexed(text):
    return str(text).encode("utf-8", "surrogateescape").hex()


def fail(exc):
    fields = (errno.errorcode.get(exc.errno or 0, ""), exc.strerror or str(exc),
              "" if exc.filename is None else exc.filename)
    line = "HERMES-SANDBOX-ERROR " + "\t".join(hexed(f) for f in fields) + "\n"
    os.write(2, line.encode())
    os._exit(125)


def others():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            yield int(name)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def members(entry, own_sid):
    # The command's processes: those carrying the marker, and every process in a
    # session one of them is in (a child may have scrubbed its environment).
    found, sids = set(), set()
    for pid in others():
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.add(pid)
                    sids.add(os.getsid(pid))
        except OSError:
            pass
    sids.discard(own_sid)
    if sids:
        for pid in others():
            try:
                if os.getsid(pid) in sids:
                    found.add(pid)
            except OSError:
                pass
    return set(pid for pid in found if alive(pid))


def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(token, grace):
    entry = (MARK + "=" + token).encode()
    own = os.getsid(0)
    targets = members(entry, own)
    if targets and grace > 0:
        send(targets, signal.SIGTERM)
        send(targets, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in targets):
            time.sleep(0.01)
    for _ in range(200):  # until nothing is left, however fast they fork
        targets = members(entry, own)
        if not targets:
            return
        send(targets, signal.SIGKILL)
        time.sleep(0.005)


def run(token, grace, cwd, command):
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            fail(exc)
    env = dict(os.environ)
    env[MARK] = token
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(1, 2)
            os.execve("/bin/sh", ["/bin/sh", "-c", command], env)
        except OSError as exc:
            os.write(2, ("cannot run /bin/sh: %s\n" % exc).encode())
        os._exit(127)
    status = os.waitpid(pid, 0)[1]
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    sweep(token, grace)  # what the command left in the background
    sys.exit(code)


def kind_of(mode):
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISCHR, "char_device"), (stat.S_ISBLK, "block_device"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "other"


def remove_tree(path):
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            full = os.path.join(root, name)
            try:
                if os.path.islink(full):
                    os.unlink(full)
                else:
                    os.rmdir(full)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def make_private_dir(prefix, parent):
    while True:
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def main(verb, args):
    if verb == "run":
        return run(args[0], float(args[1]), args[2], args[3])
    if verb == "kill":
        return sweep(args[0], float(args[1]))
    out = sys.stdout.buffer
    try:
        if verb == "stat":
            st = os.stat(args[0])
            real = os.path.realpath(args[0])
            out.write(("%s\t%d\t%s" % (kind_of(st.st_mode), st.st_size, hexed(real))).encode())
        elif verb == "read":
            left = int(args[1])
            with open(args[0], "rb") as f:
                while left != 0:
                    chunk = f.read(65536 if left < 0 else min(65536, left))
                    if not chunk:
                        break
                    out.write(chunk)
                    left -= len(chunk) if left > 0 else 0
        elif verb == "write":
            path, parents, mode = args[0], args[1] == "1", args[2]
            data = sys.stdin.buffer.read()
            if parents:
                parent = os.path.dirname(os.path.abspath(path))
                if not os.path.isdir(parent):
                    os.makedirs(parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(mode or "644", 8))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if mode:
                os.chmod(path, int(mode, 8))
        elif verb == "mkdtemp":
            made = make_private_dir(args[0], args[1])
            out.write((hexed(made) + "\t" + hexed(os.path.expanduser("~"))).encode())
        elif verb == "rmtree":
            remove_tree(args[0])
        else:
            raise SystemExit("unknown verb " + verb)
    except OSError as exc:
        fail(exc)


main(sys.argv[1], sys.argv[2:])
"""


def unhex(text: str) -> str:
    return bytes.fromhex(text).decode("utf-8", "surrogateescape")


def raise_helper_failure(
    stderr: bytes, code: int, python: str, doing: str, where: str = "in the sandbox"
) -> None:
    """Turn what the helper (or the backend) reported on the exec's stderr into an
    exception. A command's own output, stderr included, never comes this way: the
    helper sends it to stdout, so only the helper, Python and the backend write here."""
    text = stderr.decode("utf-8", "replace").strip()
    for line in text.splitlines():
        if line.startswith(HELPER_ERROR):
            name, message, filename = (unhex(f) for f in line[len(HELPER_ERROR) :].split("\t"))
            number = getattr(errno_module, name, None) or errno_module.EIO
            if not filename:
                raise OSError(number, message)
            raise OSError(number, message, filename)
    if code == 0 or (not text and doing == "run a command"):
        return  # a command's exit code is its own
    hint = f" (is {python!r} installed there?)" if code in (126, 127) else ""
    raise EnvironmentFailure(f"could not {doing} {where}: exit code {code}{hint}: {text[-2000:]}")


class HelperEnvironment(Environment):
    """An environment driven through exec streams and :data:`HELPER_SOURCE`.

    Subclasses implement :meth:`start`, :meth:`aclose`, :attr:`python` and
    :meth:`_open_exec`, and set ``kill_grace``. ``where`` names the place in messages
    ("in the container", "on the remote host"); ``scratch_parent`` is where
    :meth:`make_private_dir` makes its directories.
    """

    where: ClassVar[str] = "in the sandbox"
    can_spawn: ClassVar[bool] = False
    # The backend's settings: a dataclass with ``from_mapping`` (refusing unknown keys),
    # which the constructor takes first. for_run builds it, giving it the run's task_id
    # and python where it has such fields.
    settings_class: ClassVar[Any]
    scratch_parent: str = "/tmp"
    kill_grace: float = 2.0
    _python: str
    _home: str | None = None

    @abc.abstractmethod
    async def _open_exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
    ) -> ExecStream:
        """Start ``argv`` in the sandbox: stdin (if asked) and stdout as the stream,
        stderr kept in its ``stderr_tail``; ``env`` adds to the sandbox's variables."""

    @classmethod
    def for_run(
        cls,
        settings: Mapping[str, Any],
        *,
        env: Mapping[str, str],
        kill_grace: float,
        task_id: str | None,
        python: str | None,
    ) -> Self:
        data = dict(settings)
        fields = {f.name for f in dataclasses.fields(cls.settings_class)}
        if task_id is not None and "task_id" in fields:
            data.setdefault("task_id", task_id)
        if python:
            data["python"] = python
        return cls(cls.settings_class.from_mapping(data), env=env, kill_grace=kill_grace)  # type: ignore[call-arg]

    @property
    def python(self) -> str:
        """The sandbox's interpreter: the settings' ``python``, or the one the run names
        (subclasses set ``_python`` in their constructor)."""
        return self._python

    @property
    def home(self) -> str | None:
        """The sandbox user's home, learnt by :meth:`make_private_dir` (None before)."""
        return self._home

    async def open_exec_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecStream:
        return await self._open_exec(list(argv), env=env, cwd=cwd, stdin=True)

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None
    ) -> SandboxProcess:
        raise SpawnNotAvailable(
            f"the {self.name} backend starts scripts through the relay; use open_exec_stream"
        )

    async def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_COMMAND_OUTPUT,
    ) -> CommandResult:
        """Run ``command`` with /bin/sh in the sandbox, output combined and capped.

        On timeout every process the command started is killed inside the sandbox
        (SIGTERM, then SIGKILL after ``kill_grace``) and the exit code is 124.
        Raises FileNotFoundError (and other OSErrors) for a bad ``cwd``,
        EnvironmentFailure if the helper cannot run (no Python there).
        """
        token = secrets.token_hex(12)
        argv = [
            self.python,
            "-c",
            HELPER_SOURCE,
            "run",
            token,
            str(self.kill_grace),
            cwd or "",
            command,
        ]
        output = HeadTailBuffer(max_output_bytes)
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=False)
        deadline = anyio.move_on_after(timeout)
        finished = False
        exit_code = 0
        try:
            with deadline:
                async for chunk in stream:
                    output.feed(chunk)
                finished = True
            if deadline.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._kill_command(token)
                    with anyio.move_on_after(_DRAIN_SECONDS):
                        async for chunk in stream:  # what was written before the kill
                            output.feed(chunk)
            else:
                exit_code = await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise EnvironmentFailure(
                f"the exec stream broke while running a command {self.where}: {exc}"
            ) from exc
        finally:
            with anyio.CancelScope(shield=True):
                if not finished and not deadline.cancelled_caught:
                    await self._kill_command(token)  # the caller was cancelled
                await stream.aclose()
        text = output.text()
        if deadline.cancelled_caught:
            return CommandResult(text, TIMEOUT_EXIT_CODE, timed_out=True)
        raise_helper_failure(
            stream.stderr_tail, exit_code, self.python, "run a command", self.where
        )
        return CommandResult(text, exit_code)

    async def _kill_command(self, token: str) -> None:
        """Kill, inside the sandbox, every process carrying the command's marker."""
        try:
            await self._helper("kill", token, str(self.kill_grace))
        except (BackendError, OSError) as exc:
            log.warning("could not kill a command's processes: %s", exc)

    async def _helper(self, verb: str, *args: str, data: bytes | None = None) -> bytes:
        """Run the helper in the sandbox; return its stdout, raise what it reports."""
        argv = [self.python, "-c", HELPER_SOURCE, verb, *args]
        stream = await self._open_exec(argv, env=None, cwd=None, stdin=data is not None)
        out = bytearray()
        try:
            if data is not None:
                await stream.send(data)
                await stream.send_eof()
            async for chunk in stream:
                out += chunk
            code = await stream.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise EnvironmentFailure(
                f"the exec stream broke during {verb} {self.where}: {exc}"
            ) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        raise_helper_failure(stream.stderr_tail, code, self.python, verb, self.where)
        return bytes(out)

    # -- files -----------------------------------------------------------------------------

    async def stat(self, path: str) -> FileStat:
        kind, size, real = (await self._helper("stat", path)).decode().split("\t")
        return FileStat(unhex(real), cast(FileKind, kind), int(size))

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await self._helper("read", path, str(-1 if max_bytes is None else max_bytes))

    async def write_bytes(
        self, path: str, data: bytes, *, make_parents: bool = True, mode: int | None = None
    ) -> None:
        mode_text = "" if mode is None else f"{mode:o}"
        await self._helper("write", path, "1" if make_parents else "0", mode_text, data=data)

    async def make_private_dir(self, prefix: str, *, parent: str | None = None) -> str:
        answer = await self._helper("mkdtemp", prefix, parent or self.scratch_parent)
        made, home = answer.decode().split("\t")
        self._home = unhex(home) or None
        return unhex(made)

    async def remove_tree(self, path: str) -> None:
        await self._helper("rmtree", path)


__all__ = [
    "HELPER_ERROR",
    "HELPER_SOURCE",
    "HelperEnvironment",
    "raise_helper_failure",
    "unhex",
]
