"""The janitor: removes a run's container (and the directory made to share with it) if
the runner dies without doing so.

A small host process, started by :class:`DockerEnvironment` for each container it
creates and does not keep, as ``python -E -s janitor.py ENGINE CONTAINER [DIRECTORY]``.
Its stdin is a pipe whose other end only the runner holds: ``done`` on it means the
runner removed the container itself; its end without ``done`` means the runner is
gone, and the janitor removes the container (forcefully, with its volumes) and the
directory. Runs as a plain file, in a new session: nothing a terminal or the runner's
process group receives reaches it.
"""

from __future__ import annotations

import os
import shutil
import sys


def _wait_for_runner() -> bool:
    """Read stdin to its end; whether the runner said it is done."""
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said = (said + chunk)[-16:]
    return said.endswith(b"done")


def main(args: list[str]) -> int:
    engine, container = args[0], args[1]
    directory = args[2] if len(args) > 2 else ""
    if _wait_for_runner():
        return 0
    try:
        import docker

        client = docker.from_env(environment={**os.environ, "DOCKER_HOST": engine})
        try:
            client.api.remove_container(container, force=True, v=True)
        finally:
            client.close()
    except Exception as exc:  # gone already, or no engine: the reaper takes it later
        print(f"hermes-sandbox janitor: could not remove {container[:12]}: {exc}", file=sys.stderr)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
