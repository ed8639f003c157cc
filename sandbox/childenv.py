"""The environment a script starts with: the host's, scrubbed of anything secret.

A variable passes only if its name is on a short allowlist of harmless prefixes and
contains none of the secret markers; anything else reaches the script only when the
caller passes it explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping

# A name containing any of these is dropped, whatever its prefix. "PASS" alone is not
# a marker: it would hit names like BYPASS_CACHE.
SECRET_MARKERS = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "CREDENTIAL",
    "PASSWD",
    "AUTH",
    "DSN",
    "WEBHOOK",
    "CREDS",
    "BEARER",
    "APIKEY",
)
# A name passes if it starts with one of these (and carries no secret marker).
PASSTHROUGH_PREFIXES = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LANGUAGE",
    "LC_",
    "TERM",
    "TMPDIR",
    "TMP",
    "TEMP",
    "TZ",
    "SHELL",
    "LOGNAME",
    "XDG_",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA",
)
# Set for every script: predictable text I/O, no stray .pyc files, output as it comes.
SCRIPT_DEFAULTS = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONUTF8": "1",
    "PYTHONUNBUFFERED": "1",
}
# Variables of the runtime itself, never inherited from an enclosing run.
RUNTIME_PREFIXES = ("HERMES_RPC_", "HERMES_SANDBOX_")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def scrub_environment(
    host_env: Mapping[str, str], explicit: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The base environment for a script: allowlisted host variables, then the
    caller's ``explicit`` ones (which pass as given), then the script defaults."""
    env = {
        name: value
        for name, value in host_env.items()
        if name.upper().startswith(PASSTHROUGH_PREFIXES)
        and not is_secret_name(name)
        and not name.startswith(RUNTIME_PREFIXES)
    }
    if explicit:
        env.update(explicit)
    env.update(SCRIPT_DEFAULTS)
    return env
