"""Files into a stage, and the relay's start: the part of the exec helper
(stubs/_exec_helper.py) that the relay's exec needs, so that it alone is compiled there.

Stdlib only (modules even python3-minimal has), Python 3.6+. The host runs it as
``python3 -I -S -c SOURCE relay DIRECTORY SIZE NEW ARGS...``: the bundle of SIZE bytes at
the start of stdin (per file a line ``NAME MODE SIZE``, the name hex-encoded and the
mode octal, then SIZE bytes) written into DIRECTORY (made first, mode 0700, failing if
it exists, when NEW is 1), then the relay written there, ``_hermes_relay.py``, run in
this same interpreter with ARGS (its code as the host compiled it when the bundle holds
it for this Python's bytecode magic, ``_hermes_relay.py.MAGIC.code``, else compiled
here), its stdin the rest: one Python start, not two. The exec helper's source is this
one with _proctree.py's before and its own after (its verbs ``stage`` and ``put`` write
bundles too); a failure is reported as it does.
"""

import errno
import io
import marshal
import os
import stat
import sys


def hexed(text):
    return str(text).encode("utf-8", "surrogateescape").hex()


def fail(exc):
    fields = (
        errno.errorcode.get(exc.errno or 0, ""),
        exc.strerror or str(exc),
        "" if exc.filename is None else exc.filename,
    )
    line = "HERMES-SANDBOX-ERROR " + "\t".join(hexed(f) for f in fields) + "\n"
    os.write(2, line.encode())
    os._exit(125)


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


def read_exactly(stream, size):
    data = stream.read(size)
    if len(data) != size:
        raise OSError(errno.EPIPE, "the bundle ended early")
    return data


def read_fd_exactly(fd, size):
    """``size`` bytes of ``fd``, unbuffered: what follows is another program's input."""
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise OSError(errno.EPIPE, "the bundle ended early")
        data += chunk
    return bytes(data)


def read_bundle(bundle):
    """The bundle's files (from a readable binary stream), as (name, mode, data)."""
    while True:
        header = bundle.readline()
        if not header:
            return
        name, mode, size = header.split()
        name = bytes.fromhex(name.decode()).decode("utf-8", "surrogateescape")
        if "/" in name or name in ("", ".", ".."):
            raise OSError(errno.EINVAL, "not a file name", name)
        yield name, int(mode, 8), read_exactly(bundle, int(size))


def write_bundle(directory, bundle):
    """Write the bundle's files (a readable binary stream) into ``directory``: each
    made anew under a fresh name, then renamed over its own (a name that is a symlink
    is replaced, never followed)."""
    for name, mode, data in read_bundle(bundle):
        path = os.path.join(directory, name)
        fresh = os.path.join(directory, ".new-" + os.urandom(8).hex())
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(fresh, flags, mode)
        try:
            os.fchmod(fd, mode)  # not narrowed by the umask
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(fresh, path)
        except BaseException:
            try:
                os.unlink(fresh)
            except OSError:
                pass
            raise


RELAY_FILE = "_hermes_relay.py"
CODEC_FILE = "_hermes_msgpack.py"


def code_name(path):
    """The name of the relay's code as the host compiled it, staged beside ``path``
    under this Python's bytecode magic number; None if this Python has none."""
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", None)
    return path + "." + magic.hex() + ".code" if magic else None


def relay_code(path, read):
    """The relay's code: as the host compiled it when there is some for this Python,
    else compiled here from its source; ``read(name)`` gives a staged file's bytes,
    raising OSError if there is none."""
    compiled = code_name(path)
    if compiled is not None:
        try:
            return marshal.loads(read(compiled))
        except (OSError, EOFError, ValueError, TypeError):
            pass
    return compile(read(path), path, "exec")


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def name_process(name):
    """What ps shows this process as, where _proctree.py's source came before this one
    (a standby's): a standby and the relay it became are told apart by name."""
    namer = globals().get("set_name")
    if namer is not None:
        namer(name)


def load_relay(code, path):
    """The relay module's namespace, its code run but not its main (a standby's)."""
    namespace = {"__name__": "_hermes_relay", "__file__": path, "__builtins__": __builtins__}
    exec(code, namespace)
    return namespace


def stage_and_run(directory, size, new, args, loaded=None):
    """Write the bundle of ``size`` bytes at the start of stdin into ``directory`` (made
    first, mode 0700, failing if it exists, when ``new``), then run the relay staged
    there in this interpreter; ``loaded``, a standby's (its source, and the namespace
    :func:`load_relay` made of it), is run instead unless the bundle holds another.
    On failure nothing made is left."""
    path = os.path.join(directory, RELAY_FILE)
    # The stage first (the relay's fallback codec, _hermes_msgpack), as for a script run
    # by its path; never the working directory that ``-c`` puts there.
    sys.path[:] = [directory] + [p for p in sys.path if p not in ("", ".")]
    try:
        if new:
            os.mkdir(directory, 0o700)
        try:
            write_bundle(directory, io.BytesIO(read_fd_exactly(0, size)))
            if loaded is not None and os.path.lexists(path) and read_file(path) != loaded[0]:
                loaded = None  # staged by the run, and another relay than the standby's
            code = relay_code(path, read_file) if loaded is None else None
        except BaseException:
            if new:
                remove_tree(directory)
            raise
    except OSError as exc:
        fail(exc)
    sys.argv = [path, *args]
    name_process("hermes-relay")
    if loaded is None:
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    else:
        loaded[1]["main"]()
    raise SystemExit(0)  # the relay is done: nothing after it runs


def relay(directory, size, new, args):
    """The relay's exec: stage, then run the relay staged there (one Python start for
    the stage and the relay, not two)."""
    sys.dont_write_bytecode = True
    stage_and_run(directory, size, new, args)


SPEC_DIGITS = 8


def traced():
    """Whether a process traces this one (TracerPid in /proc/self/status)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"TracerPid:"):
                    return int(line.split()[1]) != 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def standby(size):
    """A relay started before its run is known (the ssh backend keeps one on each
    pooled connection, so a run does not wait for a Python to start): read the
    bundle of ``size`` bytes at the start of stdin, which holds the relay and its
    codec, load both, and say ``ready`` on stdout; then wait for the run. Its spec is
    SPEC_DIGITS hex digits giving its length, then hex-encoded words separated by
    spaces: the working directory, then ``relay``'s DIRECTORY SIZE NEW ARGS...; after
    it, as for ``relay``, the run's bundle and the relay's input. An input that ends
    before the spec (the pool closed) ends the standby, which made nothing."""
    # First: nothing else of this user may trace it, or open its input or memory, from
    # now until its run ends (a script of an earlier run could otherwise wait in it for
    # a later one). The host prepends _proctree.py's source to the standby's.
    forbid_tracing()  # noqa: F821
    sys.dont_write_bytecode = True
    name_process("hermes-standby")
    try:
        files = dict(
            (name, data) for name, _mode, data in read_bundle(io.BytesIO(read_fd_exactly(0, size)))
        )

        def read(name):
            try:
                return files[name]
            except KeyError:
                raise OSError(errno.ENOENT, "not in the standby's bundle", name) from None

        codec = type(sys)(CODEC_FILE[:-3])
        codec.__file__ = CODEC_FILE
        exec(compile(read(CODEC_FILE), CODEC_FILE, "exec"), codec.__dict__)
        sys.modules[codec.__name__] = codec
        loaded = (read(RELAY_FILE), load_relay(relay_code(RELAY_FILE, read), RELAY_FILE))
    except OSError as exc:
        fail(exc)
    if traced():  # attached before it could forbid it: not to be trusted with a run
        os.write(2, b"hermes-standby: traced by another process; not taking runs\n")
        os._exit(1)
    os.write(1, b"ready\n")
    try:
        head = os.read(0, SPEC_DIGITS)
        if not head:
            os._exit(0)
        head += read_fd_exactly(0, SPEC_DIGITS - len(head))
        words = read_fd_exactly(0, int(head, 16)).split()
        cwd, directory, size, new = (bytes.fromhex(w.decode()) for w in words[:4])
        args = [bytes.fromhex(w.decode()).decode("utf-8", "surrogateescape") for w in words[4:]]
        os.chdir(cwd)
    except (OSError, ValueError) as exc:
        fail(exc if isinstance(exc, OSError) else OSError(errno.EINVAL, str(exc)))
    stage_and_run(os.fsdecode(directory), int(size), new == b"1", args, loaded)


if __name__ == "__main__" and sys.argv[1:2] == ["relay"]:
    relay(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:])
elif __name__ == "__main__" and sys.argv[1:2] == ["standby"]:
    standby(int(sys.argv[2]))
