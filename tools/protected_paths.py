"""The paths no tool writes: one list for the file tools and the terminal's approval check.

:mod:`~hermes_sandbox.tools.path_policy` refuses write_file and patch under these paths;
:mod:`~hermes_sandbox.tools.approval` flags terminal commands that write to them (a
redirection, tee, cp/mv/install/ln, ``sed -i``, ``dd of=``...), so a script cannot do with
the terminal what write_file refuses. Data only, so both can import it.
"""

from __future__ import annotations

__all__ = [
    "ENGINE_SOCKETS",
    "ENGINE_SOCKET_SUFFIXES",
    "HOME_DIRS",
    "PROTECTED_HOME_ENTRIES",
    "PROTECTED_SYSTEM_DIRS",
]

# Never written by the file tools: the system's programs, libraries, configuration,
# boot files, kernel interfaces and package databases.
PROTECTED_SYSTEM_DIRS: tuple[str, ...] = (
    "/etc",
    "/boot",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sys",
    "/dev",
    "/var/lib/dpkg",
    "/var/lib/apt",
    "/var/lib/rpm",
    "/var/lib/dnf",
    "/var/lib/yum",
    "/var/lib/pacman",
    "/var/lib/docker",
    "/var/lib/containers",
    "/var/lib/containerd",
    "/var/spool/cron",
    "/var/log",
)

# Never written below a home directory: credentials and keys, the shell's start-up
# files (code there runs in every later shell) and this project's own configuration.
PROTECTED_HOME_ENTRIES: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".config/hermes-sandbox",
    ".hermes/config.yaml",  # Hermes Agent's own: its approval settings live here
    ".hermes/.env",
    ".config/systemd",
    ".config/autostart",
    ".local/share/keyrings",
    ".password-store",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
)

# Home directories, as patterns of path components: "*" is any one component.
HOME_DIRS: tuple[str, ...] = ("/root", "/home/*", "/Users/*")

# A container engine's socket gives root on the host to whoever can write to it.
ENGINE_SOCKETS: tuple[str, ...] = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
)
ENGINE_SOCKET_SUFFIXES: tuple[str, ...] = ("docker.sock", "podman.sock", "containerd.sock")
