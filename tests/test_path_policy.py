"""tools/path_policy.py against a real filesystem: real symlinks, a real FIFO and a real
Unix socket, resolved through a real LocalEnvironment.

Layout built by the ``tree`` fixture (all under tmp_path)::

    ws/                 the workspace root
        inside.txt
        a/
        link_in    -> inside.txt
        link_out   -> ../outside/secret.txt
        dir_out    -> ../outside
        etc_link   -> /etc
        hosts_link -> /etc/hosts
    outside/
        secret.txt
    ws_alias -> ws      a symlinked way to name the workspace
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

import hermes_sandbox.tools.path_policy as path_policy
from hermes_sandbox.environments.base import CommandResult, FileStat
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.tools.path_policy import (
    PathRefused,
    check_read,
    check_write,
    protected_reason,
    resolve_for_write,
    resolve_path,
)
from hermes_sandbox.tools.registry import ToolContext


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Tree:
    root: Path
    ws: Path
    outside: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root = tmp_path.resolve()
    ws = root / "ws"
    outside = root / "outside"
    (ws / "a").mkdir(parents=True)
    outside.mkdir()
    (ws / "inside.txt").write_text("in\n")
    (outside / "secret.txt").write_text("secret\n")
    (ws / "link_in").symlink_to("inside.txt")
    (ws / "link_out").symlink_to("../outside/secret.txt")
    (ws / "dir_out").symlink_to("../outside")
    (ws / "etc_link").symlink_to("/etc")
    (ws / "hosts_link").symlink_to("/etc/hosts")
    (root / "ws_alias").symlink_to("ws")
    return Tree(root, ws, outside)


@pytest.fixture
async def env() -> AsyncIterator[LocalEnvironment]:
    async with LocalEnvironment() as environment:
        yield environment


def ctx_for(env: LocalEnvironment, cwd: Path, workspace: Path | str | None) -> ToolContext:
    root = None if workspace is None else str(workspace)
    return ToolContext(task_id="t", environment=env, cwd=str(cwd), workspace_root=root)


# -- resolving ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_resolve_existing_missing_and_symlinked(env: LocalEnvironment, tree: Tree) -> None:
    ctx = ctx_for(env, tree.ws, None)
    existing = await resolve_path(ctx, "inside.txt")
    assert existing.path == str(tree.ws / "inside.txt")
    assert existing.stat is not None and existing.stat.kind == "file"
    missing = await resolve_path(ctx, "new/deeper/file.txt")
    assert missing.path == str(tree.ws / "new/deeper/file.txt")
    assert missing.stat is None and isinstance(missing.error, FileNotFoundError)
    assert (await resolve_path(ctx, "link_out")).path == str(tree.outside / "secret.txt")
    assert (await resolve_path(ctx, "dir_out/new.txt")).path == str(tree.outside / "new.txt")
    # ".." after a symlink climbs from the link's target, as the kernel does
    assert (await resolve_path(ctx, "dir_out/../x")).path == str(tree.root / "x")
    assert (await resolve_path(ctx, "a/../inside.txt")).path == str(tree.ws / "inside.txt")
    assert (await resolve_path(ctx, "nope/../../x")).path == str(tree.root / "x")


# -- reading --------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", ["inside.txt", "link_in", "a", "a/../inside.txt", "missing.txt", "new/dir/x"]
)
async def test_read_inside_workspace_is_allowed(
    env: LocalEnvironment, tree: Tree, path: str
) -> None:
    assert await check_read(ctx_for(env, tree.ws, tree.ws), path) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path",
    [
        "link_out",  # a symlink inside pointing outside
        "dir_out/secret.txt",  # a symlinked parent directory
        "dir_out/missing.txt",  # missing files outside are refused alike
        "a/../../outside/secret.txt",
        "../outside/secret.txt",
        "hosts_link",
        "etc_link/passwd",
        "/etc/passwd",
        "~/.bashrc",
    ],
)
async def test_read_outside_workspace_is_refused(
    env: LocalEnvironment, tree: Tree, path: str
) -> None:
    message = await check_read(ctx_for(env, tree.ws, tree.ws), path)
    assert message is not None
    assert message.startswith(f"Refused to read {path}: it is outside the workspace {tree.ws}")


@pytest.mark.anyio
async def test_refusal_says_where_a_symlink_leads(env: LocalEnvironment, tree: Tree) -> None:
    message = await check_read(ctx_for(env, tree.ws, tree.ws), "dir_out/secret.txt")
    assert message is not None
    assert f"it resolves to {tree.outside / 'secret.txt'} through symlinks or '..'" in message


@pytest.mark.anyio
async def test_dot_dot_up_to_etc_passwd(env: LocalEnvironment, tree: Tree) -> None:
    climb = "a/../" + "../" * (len(tree.ws.parts) - 1) + "etc/passwd"  # a/../../../etc/passwd
    ctx = ctx_for(env, tree.ws, tree.ws)
    read = await check_read(ctx, climb)
    assert read is not None and "outside the workspace" in read
    write = await check_write(ctx_for(env, tree.ws, None), climb)
    assert write is not None and "under /etc, a protected system directory" in write


@pytest.mark.anyio
async def test_without_workspace_reads_go_anywhere(env: LocalEnvironment, tree: Tree) -> None:
    ctx = ctx_for(env, tree.ws, None)
    for path in ("/etc/hosts", "link_out", "dir_out/secret.txt", "/nonexistent/x"):
        assert await check_read(ctx, path) is None


@pytest.mark.anyio
async def test_symlinked_workspace_root(env: LocalEnvironment, tree: Tree) -> None:
    alias = tree.root / "ws_alias"
    ctx = ctx_for(env, alias, alias)
    assert await check_read(ctx, "inside.txt") is None
    assert await check_write(ctx, "new.txt") is None
    assert await check_read(ctx, str(tree.ws / "inside.txt")) is None
    assert await check_read(ctx, "link_out") is not None


@pytest.mark.anyio
async def test_missing_workspace_root_refuses_everything(env: LocalEnvironment, tree: Tree):
    ctx = ctx_for(env, tree.ws, tree.root / "gone")
    message = await check_read(ctx, "inside.txt")
    assert message is not None and "workspace root" in message and "does not exist" in message
    assert await check_write(ctx, "inside.txt") is not None


@pytest.mark.anyio
async def test_relative_workspace_root_is_resolved_against_cwd(env: LocalEnvironment, tree: Tree):
    ctx = ctx_for(env, tree.ws, ".")
    assert await check_read(ctx, "inside.txt") is None
    assert await check_read(ctx, "link_out") is not None


# -- writing --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_write_inside_workspace(env: LocalEnvironment, tree: Tree) -> None:
    ctx = ctx_for(env, tree.ws, tree.ws)
    for path in ("inside.txt", "link_in", "new/dir/file.txt", "dotfiles/.bashrc"):
        assert await check_write(ctx, path) is None
    resolved = await resolve_for_write(ctx, "link_in")
    assert resolved.path == str(tree.ws / "inside.txt")  # act on what was checked


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", ["link_out", "dir_out/new.txt", "dir_out/secret.txt", "../outside/new.txt"]
)
async def test_write_escaping_workspace_is_refused(
    env: LocalEnvironment, tree: Tree, path: str
) -> None:
    message = await check_write(ctx_for(env, tree.ws, tree.ws), path)
    assert message is not None
    assert message.startswith(f"Refused to write {path}: it is outside the workspace")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "under /etc"),
        ("/etc/new.conf", "under /etc"),
        ("etc_link/new.conf", "under /etc"),  # a symlinked directory into /etc
        ("hosts_link", "under /etc"),  # a symlink to a file in /etc
        ("/usr/local/bin/tool", "under /usr"),
        ("/bin/sh", "a protected system directory"),  # /bin may be a link to /usr/bin
        ("/boot/x", "under /boot"),
        ("/lib64/x", "a protected system directory"),
        ("/proc/self/environ", "under /proc"),
        ("/sys/kernel/x", "under /sys"),
        ("/dev/null", "under /dev"),
        ("/var/lib/dpkg/status", "under /var/lib/dpkg"),
        ("/var/run/docker.sock", "container engine's socket"),
        ("/run/docker.sock", "container engine's socket"),
        ("/run/podman/podman.sock", "container engine's socket"),
        ("/run/user/1000/podman/podman.sock", "container engine's socket"),
        ("~/.ssh/authorized_keys", "credentials or start-up files"),
        ("~/.bashrc", "credentials or start-up files"),
        ("~/.config/hermes-sandbox/config.toml", "credentials or start-up files"),
        ("/root/.aws/credentials", "under /root/.aws"),
        ("/home/someone/.gnupg/x", "under /home/someone/.gnupg"),
        ("/home/someone/.profile", "under /home/someone/.profile"),
    ],
)
async def test_protected_paths_are_never_written(
    env: LocalEnvironment, tree: Tree, path: str, why: str
) -> None:
    message = await check_write(ctx_for(env, tree.ws, None), path)
    assert message is not None
    assert message.startswith(f"Refused to write {path}")
    assert why in message
    assert "ask the user" in message


def test_protected_reason_table() -> None:
    assert protected_reason("/etc") is not None
    assert protected_reason("/etcetera/x") is None
    assert protected_reason("/usr") is not None
    assert protected_reason("/var/lib/app/data") is None
    assert protected_reason("/home/me/project/main.py") is None
    assert protected_reason("/home/me/project/.ssh/x") is None  # only directly in a home
    assert protected_reason("/srv/app/docker.sock") is not None
    assert protected_reason("/tmp/x") is None


@pytest.mark.anyio
async def test_socket_file_named_like_an_engine_is_refused(env: LocalEnvironment, tree: Tree):
    engine = tree.root / "engine"
    engine.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(engine / "docker.sock"))
        (tree.ws / "sock_link").symlink_to(engine / "docker.sock")
        ctx = ctx_for(env, tree.ws, None)
        for path in ("sock_link", str(engine / "docker.sock")):
            message = await check_write(ctx, path)
            assert message is not None and "container engine's socket" in message
    finally:
        listener.close()


@pytest.mark.anyio
async def test_special_files_are_refused_for_writing_without_hanging(
    env: LocalEnvironment, tree: Tree
) -> None:
    os.mkfifo(tree.ws / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(tree.ws / "app.sock"))
        ctx = ctx_for(env, tree.ws, tree.ws)
        with anyio.fail_after(5):
            pipe = await check_write(ctx, "pipe")
            sock = await check_write(ctx, "app.sock")
        assert pipe is not None and "it is a named pipe" in pipe
        assert sock is not None and "it is a socket" in sock
    finally:
        listener.close()


@pytest.mark.anyio
async def test_path_protected_as_written_is_refused_even_if_it_resolves_elsewhere(
    env: LocalEnvironment, tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    # like /etc/resolv.conf -> /run/systemd/resolve/stub-resolv.conf
    protected = tree.root / "protected"
    protected.mkdir()
    (protected / "resolv.conf").symlink_to(tree.outside / "secret.txt")
    monkeypatch.setattr(path_policy, "PROTECTED_SYSTEM_DIRS", (str(protected),))
    message = await check_write(ctx_for(env, tree.ws, None), str(protected / "resolv.conf"))
    assert message is not None and f"under {protected}" in message


@pytest.mark.anyio
async def test_resolve_for_write_raises_path_refused(env: LocalEnvironment, tree: Tree) -> None:
    with pytest.raises(PathRefused, match="protected system directory"):
        await resolve_for_write(ctx_for(env, tree.ws, None), "/etc/x")


# -- dangling symlinks: opening one for writing creates its target ----------------------


class CountingEnvironment(LocalEnvironment):
    """A LocalEnvironment that records the commands it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []

    async def execute(self, command: str, **kwargs: Any) -> CommandResult:
        self.commands.append(command)
        return await super().execute(command, **kwargs)


class PlainStatEnvironment(CountingEnvironment):
    """Its stat errors do not name the resolved path, as a backend that stats through a
    command might not: resolution must then ask about symlinks."""

    async def stat(self, path: str) -> FileStat:
        try:
            return await super().stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory") from None


@pytest.fixture(params=["local", "plain-stat"])
async def any_env(request: pytest.FixtureRequest) -> AsyncIterator[LocalEnvironment]:
    environment = LocalEnvironment() if request.param == "local" else PlainStatEnvironment()
    async with environment:
        yield environment


@pytest.mark.anyio
async def test_dangling_symlink_to_a_protected_path(any_env: LocalEnvironment, tree: Tree):
    (tree.ws / "new.conf").symlink_to("/etc/hermes-sandbox-test-never-created.conf")
    ctx = ctx_for(any_env, tree.ws, None)
    resolved = await resolve_path(ctx, "new.conf")
    assert resolved.path == "/etc/hermes-sandbox-test-never-created.conf"
    message = await check_write(ctx, "new.conf")
    assert message is not None and "under /etc" in message


@pytest.mark.anyio
async def test_dangling_symlink_out_of_the_workspace(any_env: LocalEnvironment, tree: Tree):
    (tree.ws / "drop").symlink_to(tree.outside / "new.txt")
    (tree.ws / "chain").symlink_to("drop")  # a chain of them
    ctx = ctx_for(any_env, tree.ws, tree.ws)
    for path in ("drop", "chain"):
        message = await check_write(ctx, path)
        assert message is not None and "outside the workspace" in message
        assert (await resolve_path(ctx, path)).path == str(tree.outside / "new.txt")


@pytest.mark.anyio
async def test_dangling_symlink_inside_the_workspace(any_env: LocalEnvironment, tree: Tree):
    (tree.ws / "later").symlink_to("a/later.txt")
    ctx = ctx_for(any_env, tree.ws, tree.ws)
    resolved = await resolve_for_write(ctx, "later")
    assert resolved.path == str(tree.ws / "a" / "later.txt")
    assert resolved.stat is None


@pytest.mark.anyio
async def test_symlink_probe_runs_only_when_stat_gives_no_hint(tree: Tree) -> None:
    for environment, probes in ((CountingEnvironment(), 0), (PlainStatEnvironment(), 1)):
        async with environment:
            await resolve_path(ctx_for(environment, tree.ws, None), "brand/new.txt")
            assert len(environment.commands) == probes


# -- long paths: work linear in the number of components (issue #11) -----------------


class StatCounting(PlainStatEnvironment):
    """Counts stat calls; its errors name no path, as in PlainStatEnvironment."""

    def __init__(self, hint: bool) -> None:
        super().__init__()
        self.hint = hint
        self.stats = 0

    async def stat(self, path: str) -> FileStat:
        self.stats += 1
        if self.hint:
            return await LocalEnvironment.stat(self, path)
        return await super().stat(path)


@pytest.mark.anyio
@pytest.mark.parametrize("hint", [True, False], ids=["local-stat", "plain-stat"])
@pytest.mark.parametrize("form", ["missing", "dots", "self-links", "missing-self-links"])
async def test_ten_thousand_components_resolve_without_quadratic_work(
    tree: Tree, hint: bool, form: str
) -> None:
    (tree.ws / "self").symlink_to(".")
    path = {
        "missing": "m/" * 10_000 + "x",
        "dots": "./" * 10_000 + "a/x",
        "self-links": "self/" * 10_000 + "a/x",
        "missing-self-links": "m/self/" * 5_000 + "x",
    }[form]
    async with StatCounting(hint) as environment:
        ctx = ctx_for(environment, tree.ws, tree.ws)
        started = time.process_time()
        resolved = await resolve_for_write(ctx, path)
        took = time.process_time() - started
        print(f"{form}, {'hint' if hint else 'probe'}: {took:.3f} s CPU, {environment.stats} stats")
    assert resolved.path.startswith(str(tree.ws) + "/")
    assert resolved.path.endswith("/x")
    # a bounded number of stat calls (each linear in the path), not one per component
    assert environment.stats <= 64


@pytest.mark.anyio
async def test_a_deep_symlink_chain_is_a_loop_not_a_recursion_error(
    any_env: LocalEnvironment, tree: Tree
) -> None:
    (tree.ws / "s0").symlink_to(".")
    for i in range(1, 3_000):
        (tree.ws / f"s{i}").symlink_to(f"s{i - 1}")
    ctx = ctx_for(any_env, tree.ws, tree.ws)
    resolved = await resolve_for_write(ctx, "s2999/new.txt")  # the kernel says ELOOP
    assert resolved.stat is None
    assert resolved.path.startswith(str(tree.ws) + "/")
    assert await check_write(ctx, "s2999/../../outside/x") is not None
