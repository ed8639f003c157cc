"""The bwrap probe's cache across processes (environments/bwrap_cache.py).

Only "bwrap works here" is kept, keyed by what can change the answer; a run that fails
in bwrap drops it. bwrap here is a stand-in on PATH that records each of its command
lines and then runs the real bwrap (or fails as bwrap does), so a test sees whether a
process probed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import bwrap_problem, require
from test_cli import cli

from hermes_sandbox.environments import bwrap_cache
from hermes_sandbox.environments.isolation import ISOLATION_VARIABLE

PROBE = (
    "from hermes_sandbox.environments.isolation import probe_bwrap\n"
    "p = probe_bwrap()\n"
    "print(p.problem or 'works', p.cached)\n"
)
FAILS_AS_BWRAP = 'echo "bwrap: Can\'t find source path /x: No such file or directory" >&2; exit 1'


@pytest.fixture
def real_bwrap() -> str:
    require(bwrap_problem(), "the probe's cache is tried on a bubblewrap that works here")
    found = subprocess.run(["which", "bwrap"], capture_output=True, text=True, check=True)
    return os.path.realpath(found.stdout.strip())


class StandIn:
    """A ``bwrap`` in ``tmp/bin`` that logs its command lines to ``tmp/bwrap.log``."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.path = self.bin / "bwrap"
        self.log = tmp / "bwrap.log"
        self.log.touch()
        self.cache = tmp / "cache"
        self.env = {k: v for k, v in os.environ.items() if k != ISOLATION_VARIABLE}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{os.environ['PATH']}"
        self.env["XDG_CACHE_HOME"] = str(self.cache)
        self.env.pop(bwrap_cache.CACHE_VARIABLE, None)

    def behave(self, trial: str) -> None:
        """``--version`` answers as bwrap 0.8.0 would; anything else runs ``trial``."""
        self.path.write_text(
            textwrap.dedent(
                f"""\
                #!/bin/sh
                printf '%s\\n' "$*" >> {self.log}
                if [ "$1" = --version ]; then echo 'bubblewrap 0.8.0'; exit 0; fi
                {trial}
                """
            )
        )
        self.path.chmod(0o755)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def probe(self) -> str:
        """probe_bwrap() in a new process: "works False", "works True" (from the cache)
        or the problem."""
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def entries(self) -> list[Path]:
        folder = self.cache / "hermes-sandbox" / "bwrap"
        return sorted(folder.glob("bwrap-*.json")) if folder.is_dir() else []

    def key(self) -> dict[str, object] | None:
        return bwrap_cache.key(str(self.path))


@pytest.fixture
def stand_in(tmp_path: Path, real_bwrap: str, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    made = StandIn(tmp_path)
    made.behave(f'exec {real_bwrap} "$@"')
    monkeypatch.setenv("XDG_CACHE_HOME", str(made.cache))  # for this process's look
    monkeypatch.delenv(bwrap_cache.CACHE_VARIABLE, raising=False)
    return made


def run_print_pid(stand_in: StandIn, tmp_path: Path, *args: str) -> dict:
    script = tmp_path / "pid.py"
    script.write_text("import os\nprint(os.getpid())\n")
    done = cli("run", str(script), "--json", *args, cwd=tmp_path, env=stand_in.env)
    return json.loads(done.stdout)


def test_a_working_probe_is_cached_and_the_next_run_starts_no_probe(
    stand_in: StandIn, tmp_path: Path
) -> None:
    first = run_print_pid(stand_in, tmp_path)
    assert first["status"] == "success", first
    probed = stand_in.lines()
    assert len(probed) == 3  # --version, the trial, the run
    assert probed[0] == "--version"
    [entry] = stand_in.entries()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700

    second = run_print_pid(stand_in, tmp_path)
    assert second["status"] == "success", second
    new = stand_in.lines()[3:]
    assert len(new) == 1 and "--version" not in new[0]  # the run alone: no probe
    assert int(second["output"]) < 10  # its own pid namespace: it did run under bwrap
    assert stand_in.probe() == "works True"


def test_a_changed_key_probes_again(stand_in: StandIn) -> None:
    assert stand_in.probe() == "works False"
    assert stand_in.probe() == "works True"
    before = stand_in.key()
    mtime = stand_in.path.stat().st_mtime_ns
    os.utime(stand_in.path, ns=(mtime, mtime + 1_000_000_000))  # bwrap replaced
    assert stand_in.key() != before
    assert stand_in.probe() == "works False"
    assert len(stand_in.entries()) == 2  # one per key
    assert stand_in.probe() == "works True"


def test_each_part_of_the_key_is_there(stand_in: StandIn) -> None:
    key = stand_in.key()
    assert key is not None
    assert key["probe"] == bwrap_cache.PROBE_VERSION
    assert key["uid"] == os.getuid()
    assert key["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert key["bwrap"][0] == str(stand_in.path)  # type: ignore[index]
    assert key["python"][0] == sys.executable  # type: ignore[index]
    if Path("/proc/sys/user/max_user_namespaces").exists():
        assert "max_user_namespaces" in key
    assert bwrap_cache.key(str(stand_in.path), python="/bin/sh") != key


def test_a_negative_result_is_never_stored(stand_in: StandIn) -> None:
    stand_in.behave(FAILS_AS_BWRAP)
    assert "does not work here: bwrap: Can't find source path" in stand_in.probe()
    assert stand_in.entries() == []
    stand_in.probe()
    assert stand_in.lines().count("--version") == 2  # each process probed


def test_the_cache_can_be_turned_off(stand_in: StandIn) -> None:
    stand_in.env[bwrap_cache.CACHE_VARIABLE] = "0"
    assert stand_in.probe() == "works False"
    assert stand_in.probe() == "works False"
    assert stand_in.entries() == []


def _corrupt(entry: Path) -> None:
    entry.write_text("{not json")


def _group_writable(entry: Path) -> None:
    entry.chmod(0o620)


def _world_writable_dir(entry: Path) -> None:
    entry.parent.chmod(0o777)


def _foreign_owned(entry: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a file another user's needs root")
    os.chown(entry, 65534, 65534)


def _a_symlink(entry: Path) -> None:
    real = entry.with_name("elsewhere.json")
    entry.rename(real)
    entry.symlink_to(real)


def _another_key(entry: Path) -> None:
    data = json.loads(entry.read_text())
    data["key"]["uid"] = -1
    entry.write_text(json.dumps(data))


def _not_works(entry: Path) -> None:
    data = json.loads(entry.read_text())
    data["works"] = False
    entry.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "spoil",
    [
        _corrupt,
        _group_writable,
        _world_writable_dir,
        _foreign_owned,
        _a_symlink,
        _another_key,
        _not_works,
    ],
)
def test_a_bad_file_is_ignored(stand_in: StandIn, spoil) -> None:
    key = stand_in.key()
    bwrap_cache.store(key, "0.8.0")
    [entry] = stand_in.entries()
    assert bwrap_cache.lookup(key) == "0.8.0"  # as written, it is used
    spoil(entry)
    assert bwrap_cache.lookup(key) is None
    assert stand_in.probe().startswith("works")
    assert "--version" in stand_in.lines()  # it probed


@pytest.mark.parametrize("transport", ["unix", "relay"])
def test_a_run_that_fails_in_bwrap_drops_the_entry(
    stand_in: StandIn, tmp_path: Path, transport: str
) -> None:
    stand_in.behave(FAILS_AS_BWRAP)
    bwrap_cache.store(stand_in.key(), "0.8.0")  # stale: bwrap stopped working since
    result = run_print_pid(stand_in, tmp_path, "--transport", transport)
    assert result["status"] == "error", result
    assert "--version" not in stand_in.lines()  # it trusted the entry: no probe
    said = result["error"] + (result.get("hint") or "")
    assert said.count("bwrap: Can't find source path") == 1, said  # said once
    assert "cached result of its probe was dropped" in said
    assert stand_in.entries() == []
    # The next run probes, finds bwrap broken, and runs without it (auto).
    again = run_print_pid(stand_in, tmp_path, "--transport", transport)
    assert again["status"] == "success", again
    assert "--version" in stand_in.lines()
    assert stand_in.entries() == []
