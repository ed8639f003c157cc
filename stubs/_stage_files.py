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


def write_bundle(directory, bundle):
    """Write the bundle's files (a readable binary stream) into ``directory``: each
    made anew under a fresh name, then renamed over its own (a name that is a symlink
    is replaced, never followed)."""
    while True:
        header = bundle.readline()
        if not header:
            return
        name, mode, size = header.split()
        name = bytes.fromhex(name.decode()).decode("utf-8", "surrogateescape")
        if "/" in name or name in ("", ".", ".."):
            raise OSError(errno.EINVAL, "not a file name", name)
        data = read_exactly(bundle, int(size))
        path = os.path.join(directory, name)
        fresh = os.path.join(directory, ".new-" + os.urandom(8).hex())
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(fresh, flags, int(mode, 8))
        try:
            os.fchmod(fd, int(mode, 8))  # not narrowed by the umask
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


def compiled(path):
    """The relay's code as the host compiled it, staged beside it under a name with
    this Python's bytecode magic number; None if there is none for this Python."""
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", None)
    if not magic:
        return None
    try:
        with open(path + "." + magic.hex() + ".code", "rb") as f:
            return marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None


def relay(directory, size, new, args):
    """Write the bundle into ``directory`` (made first, mode 0700, failing if it exists,
    when ``new``), then run the relay staged there in this interpreter: the host starts
    one Python for the stage and the relay, not two. On failure nothing made is left."""
    try:
        if new:
            os.mkdir(directory, 0o700)
        try:
            write_bundle(directory, io.BytesIO(read_fd_exactly(0, size)))
            path = os.path.join(directory, RELAY_FILE)
            code = compiled(path)
            if code is None:
                with open(path, "rb") as f:
                    code = compile(f.read(), path, "exec")
        except BaseException:
            if new:
                remove_tree(directory)
            raise
    except OSError as exc:
        fail(exc)
    sys.argv = [path, *args]
    # The stage first (the relay's fallback codec, _hermes_msgpack), as for a script run
    # by its path; never the working directory that ``-c`` puts there.
    sys.path[:] = [directory] + [p for p in sys.path if p not in ("", ".")]
    sys.dont_write_bytecode = True
    exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    raise SystemExit(0)  # the relay is done: nothing after it runs


if __name__ == "__main__" and sys.argv[1:2] == ["relay"]:
    relay(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:])
