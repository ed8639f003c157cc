"""The persistent interpreter: run in the sandbox like a script, it asks the host for
its next cell and runs each in one globals dict (stdlib only, Python 3.8+ like the client).

It asks with the reserved request ``__kernel__`` over the run's own RPC connection (the
one ``hermes_tools`` opens, authenticated like any tool call), so it works on every
transport. The request carries the previous cell's outcome; the reply is the next cell
(``{"code": ..., "cwd": ...}``) or anything else to end. A cell's output goes through
the process's real file descriptors 1 and 2 (so subprocesses' output is the cell's
too) and is ended, on each, by the marker the host gave in HERMES_KERNEL_MARKER; the
host strips it. ``sys.exit`` in a cell ends the process, as in a script.
"""

import linecache
import os
import sys
import traceback

import hermes_tools

_MARKER = os.environ.pop("HERMES_KERNEL_MARKER", "").encode("ascii")


def _write_all(fd, data):
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _end_of_cell():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _write_all(1, _MARKER)
    _write_all(2, _MARKER)


def _run(code, number, namespace):
    name = "<cell %d>" % number
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        exec(compile(code, name, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:  # the cell's error (KeyboardInterrupt too) is reported
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return {"ok": False, "error": traceback.format_exception_only(type(exc), exc)[-1].strip()}
    return {"ok": True}


def main():
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    outcome = {"ready": True}
    number = 0
    while True:
        cell = hermes_tools._call("__kernel__", {"outcome": outcome})
        if not isinstance(cell, dict) or not isinstance(cell.get("code"), str):
            return
        number += 1
        if cell.get("cwd"):
            os.chdir(cell["cwd"])
        try:
            outcome = _run(cell["code"], number, namespace)
        finally:
            _end_of_cell()


if __name__ == "__main__":
    main()
