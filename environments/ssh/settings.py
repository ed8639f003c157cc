"""The ssh backend's settings: which host, as whom, and how to trust it."""

from __future__ import annotations

import getpass
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from hermes_sandbox.environments.settings import BackendSettings
from hermes_sandbox.errors import SettingError

SDK_MISSING = "the ssh backend needs paramiko: pip install 'hermes-sandbox[ssh]'"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
# OpenSSH's default MaxSessions: channels one connection may have open at once.
OPENSSH_MAX_SESSIONS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class SSHSettings(BackendSettings):
    """Settings of the ssh backend: a user account on a remote host.

    ``key_file`` None means what ``ssh`` would try: an ssh-agent and the usual
    ``~/.ssh/id_*`` keys. Host keys are checked against ``known_hosts``; an unknown
    host is refused unless ``accept_new_host_keys`` (then its key is appended to the
    file), and a host whose key changed is always refused.
    """

    backend: ClassVar[str] = "ssh"
    without_image: ClassVar[str] = "it runs on the remote host as that host is"

    host: str
    port: int = 22
    user: str | None = None  # None: this process's user name, as ssh does
    key_file: str | None = None
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0  # TCP connect, SSH handshake and authentication, each
    python: str = "python3"  # the remote interpreter; commands and file operations need it
    workdir: str | None = None  # where scripts start; None: the remote user's home
    scratch_dir: str = "/tmp"  # where each run's private stage directory is made
    max_sessions: int = OPENSSH_MAX_SESSIONS  # channels per connection (sshd's MaxSessions)
    idle_timeout: float = 30.0  # seconds a connection stays open after its last user
    # Keep a relay started ahead on each pooled connection (after the first relayed
    # run), so the next run does not wait for its Python to start.
    standby_relay: bool = True

    def check(self) -> None:
        for name in ("host", "python", "known_hosts", "scratch_dir"):
            if not getattr(self, name):
                raise SettingError("must not be empty", field=name)
        for name in ("user", "key_file", "workdir"):
            if getattr(self, name) == "":
                raise SettingError("must not be empty (leave it unset instead)", field=name)
        if not 0 < self.port < 65536:
            raise SettingError(f"must be between 1 and 65535, got {self.port}", field="port")
        if not self.connect_timeout > 0:
            raise SettingError(f"must be > 0, got {self.connect_timeout}", field="connect_timeout")
        if self.idle_timeout < 0:
            raise SettingError(f"must be >= 0, got {self.idle_timeout}", field="idle_timeout")
        if self.max_sessions < 1:
            raise SettingError(f"must be >= 1, got {self.max_sessions}", field="max_sessions")
        for name in ("workdir", "scratch_dir"):
            value = getattr(self, name)
            if value is not None and not value.startswith("/"):
                raise SettingError(
                    f"must be an absolute path on the remote host: {value!r}", field=name
                )

    def availability(self) -> str | None:
        if importlib.util.find_spec("paramiko") is None:
            return SDK_MISSING
        return None

    @property
    def login(self) -> str:
        """``user@host:port``, as messages show it."""
        return f"{self.user_name}@{self.host}:{self.port}"

    @property
    def user_name(self) -> str:
        return self.user or getpass.getuser()

    @property
    def pool_key(self) -> tuple[Any, ...]:
        """What a pooled connection must match to be shared."""
        key_file = os.path.expanduser(self.key_file) if self.key_file else None
        return (
            self.host,
            self.port,
            self.user_name,
            key_file,
            os.path.expanduser(self.known_hosts),
            self.accept_new_host_keys,
        )


__all__ = ["DEFAULT_KNOWN_HOSTS", "OPENSSH_MAX_SESSIONS", "SSHSettings"]
