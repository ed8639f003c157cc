"""The environment a script starts with: the host's, scrubbed of anything secret.

A variable passes only if its name is one of :data:`PASSTHROUGH_NAMES`, exactly, or of the
locale family ``LC_*``, and contains none of the secret markers; anything else reaches
the script only when the caller passes it explicitly. Exact names, not prefixes: a
prefix let ``USER_PASS``, ``USERDB_URL``, ``HOMEASSISTANT_PIN`` and
``XDG_SESSION_COOKIE`` through.

The agent's own time zone setting, ``HERMES_TIMEZONE``, reaches the script as ``TZ``
(see :func:`timezone_setting`), so the script's clock reads as the agent's does.
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
# A name passes if it is one of these (and carries no secret marker): what programs need
# to find things (PATH, HOME, the XDG base directories, the virtualenv or conda env),
# who the user is, and how text, time and the terminal look.
PASSTHROUGH_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "COLORTERM",
        "TERMINFO",
        "TERMINFO_DIRS",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        "XDG_RUNTIME_DIR",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_CONFIG_DIRS",
        "XDG_DATA_DIRS",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "CONDA_EXE",
        "CONDA_PYTHON_EXE",
        "CONDA_SHLVL",
        # where the agent keeps its state and which profile it runs: modules a script
        # imports from the agent read them to find their files
        "HERMES_HOME",
        "HERMES_PROFILE",
        "HERMES_CONFIG",
        "HERMES_ENV",
    }
)
# The locale family: LC_ALL, LC_CTYPE, LC_TIME... (and ssh's habit of forwarding LC_*).
PASSTHROUGH_FAMILY = "LC_"
# Set for every script: predictable text I/O, no stray .pyc files, output as it comes.
SCRIPT_DEFAULTS = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONUTF8": "1",
    "PYTHONUNBUFFERED": "1",
}
# Variables of the runtime itself, never inherited from an enclosing run.
RUNTIME_PREFIXES = ("HERMES_RPC_", "HERMES_SANDBOX_")
# The agent's time zone (an IANA name such as "Europe/Berlin"); the script gets it as TZ.
TIMEZONE_SETTING = "HERMES_TIMEZONE"


def timezone_setting(host_env: Mapping[str, str]) -> str | None:
    """The time zone ``HERMES_TIMEZONE`` names in ``host_env``, or None when unset or blank."""
    return host_env.get(TIMEZONE_SETTING, "").strip() or None


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def scrub_environment(
    host_env: Mapping[str, str],
    explicit: Mapping[str, str] | None = None,
    *,
    timezone: str | None = None,
) -> dict[str, str]:
    """The base environment for a script: allowlisted host variables, then ``TZ`` set to
    ``timezone`` when given (it overrides the host's TZ), then the caller's ``explicit``
    ones (which pass as given), then the script defaults."""
    env = {
        name: value
        for name, value in host_env.items()
        if (name in PASSTHROUGH_NAMES or name.startswith(PASSTHROUGH_FAMILY))
        and not is_secret_name(name)
        and not name.startswith(RUNTIME_PREFIXES)
    }
    if timezone:
        env["TZ"] = timezone
    if explicit:
        env.update(explicit)
    env.update(SCRIPT_DEFAULTS)
    return env
