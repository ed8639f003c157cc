"""The routine families of the dangerous-command table: everyday commands that lose work
or reach past the task (any recursive delete, destructive git, force kills, sudo reading
a password, interpreter one-liners, writes to an agent's own config...).

Each flags what Hermes Agent's approval layer flags, so a host that asks a human there
asks here too. A session approval covers the pattern, not only the command: approving
``rm -r build`` for the session lets ``rm -r dist`` run. The severe families (broad
deletes, disks, /etc, services) stay in :mod:`~hermes_sandbox.tools.approval`, where a
session approval covers one command.
"""

from __future__ import annotations

import re

from hermes_sandbox.tools.command_rules import (
    ARG,
    BLOCK_DEVICE,
    END,
    RECURSIVE_FLAG,
    SHELLS,
    WRITE_REDIRECT,
    DangerousPattern,
    command,
    has,
    redirect,
    rx,
    script,
)
from hermes_sandbox.tools.wrappers import Wrapper


def _routine(key: str, programs: str, regex: str, reason: str, flags: int = 0) -> DangerousPattern:
    return command(key, programs, regex, reason, flags=flags, session="pattern")


def _wrapper(key: str, wrappers: str, regex: str, reason: str) -> DangerousPattern:
    return DangerousPattern(
        key, reason, "wrapper", rx(regex), programs=rx(wrappers), session="pattern"
    )


# A project's secrets and settings: .env, .env.local, config.yaml, by any path.
_PROJECT_CONFIG = r"(?:\S*/)?(?:\.env(?:\.[^/ ]+)?|config\.yaml)"
_IMDS_HOSTS = (
    r"(?:169\.254\.169\.254|metadata\.google\.internal|\[fd00:ec2::254\]|100\.100\.100\.200)"
)
_HERMES_GATEWAY_LABEL = r"ai\.hermes\.gateway\b"
_LAUNCHD_STOPS = r"(?:stop|kickstart|bootout|unload|kill|disable|remove)"
_ROOT_OWNER = r"root(?:[:.]\S*)?"
# Options before a subcommand, each maybe with a value: "--log-level debug", "-q", "-".
_OPTION = r"-\S*(?: [^-\s]\S*)? "
_OPTIONS = rf"^(?:{_OPTION})*"

# Options a program reads before its subcommand; the table sees the arguments from the
# subcommand on, so "git -C '/a b' reset --hard" reads as "reset --hard".
SUBCOMMAND_OPTIONS: dict[str, Wrapper] = {
    "git": Wrapper(
        values=frozenset(
            [
                "-C",
                "-c",
                "--git-dir",
                "--work-tree",
                "--namespace",
                "--exec-path",
                "--config-env",
                "--super-prefix",
                "--list-cmds",
            ]
        ),
        flags=frozenset(
            [
                "--no-pager",
                "--paginate",
                "--bare",
                "--no-replace-objects",
                "--literal-pathspecs",
                "--glob-pathspecs",
                "--noglob-pathspecs",
                "--icase-pathspecs",
                "--no-optional-locks",
                "--no-advice",
                "--html-path",
                "--man-path",
                "--info-path",
                "--version",
                "--help",
            ]
        ),
    ),
}

ROUTINE_PATTERNS: tuple[DangerousPattern, ...] = (
    # -- deleting ---------------------------------------------------------------------
    _routine("rm-recursive", "rm", rf"{ARG}{RECURSIVE_FLAG}{END}", "deletes recursively"),
    _routine("rm-absolute-path", "rm", rf"{ARG}/", "deletes files by absolute path"),
    _routine("find-delete", "find", rf"{ARG}-delete{END}", "deletes the files find matches"),
    _routine(
        "find-exec-rm",
        "find",
        rf"{ARG}-(?:exec|execdir|ok|okdir) (?:\S*/)?rm{END}",
        "runs rm on the files find matches",
    ),
    _wrapper("xargs-rm", "xargs", r"=> rm$", "runs rm on a list read from input (xargs rm)"),
    # -- disks and permissions --------------------------------------------------------
    _routine("dd-read-disk", "dd", rf"{ARG}if={BLOCK_DEVICE}", "copies a raw disk with dd"),
    _routine(
        "chmod-world-writable",
        "chmod",
        rf"{ARG}(?:0?777|0?666|[ugoa]*[oa][ugoa]*\+[rwxXst]*w[rwxXst]*){END}",
        "makes files writable by every user",
    ),
    _routine(
        "chown-recursive-root",
        "chown",
        rf"^{has(RECURSIVE_FLAG)}{has(_ROOT_OWNER)}",
        "recursively gives files to root",
    ),
    # -- code that is not read here ---------------------------------------------------
    _routine(
        "interpreter-inline-code",
        r"python[\d.]*|pypy[\d.]*",
        rf"^(?:-\S+ )*-[a-zA-Z]*c{END}",
        "runs code given on the command line (python -c)",
    ),
    _routine(
        "interpreter-inline-code-js",
        r"(?i:(?:node|nodejs|bun|deno)(?:\.exe)?)",
        r"^(?:-\S+ )*(?:-e|--eval|-p|--print)(?:[ =]|$)|^eval(?: |$)",
        "runs code given on the command line (node -e)",
    ),
    _routine(
        "interpreter-inline-code-perl",
        "perl|ruby",
        rf"^(?:-\S+ )*-[a-zA-Z]*e{END}",
        "runs code given on the command line (perl -e, ruby -e)",
    ),
    _routine(
        "interpreter-inline-code-php", "php", rf"^(?:-\S+ )*-r{END}", "runs PHP code (php -r)"
    ),
    redirect(
        "interpreter-heredoc",
        r"^(?:python[\d.]*|pypy[\d.]*|node|nodejs|bun|deno|perl|ruby|php) <<",
        "runs code from a here-document in an interpreter",
        session="pattern",
    ),
    DangerousPattern(
        "decode-pipe-shell",
        "pipes decoded or transformed text into a shell (hidden commands)",
        "pipeline",
        rx(
            r"(?:^|\| )(?:base(?:64|32|16) [^|]*(?:-[dD]|--decode)|xxd [^|]*-r|tr "
            r"|openssl [^|]*-d\b)"
            rf"[^|]*(?:\| [^|]*)*?\| {SHELLS}(?: [-+][\w-]*)*(?: \||$)"
        ),
        session="pattern",
    ),
    _routine(
        "program-via-option",
        "sort|rg|ag|man",
        r"(?:^| )(?:--compress-program|--pre|--hostname-bin|--pager|--html|-P|-H)(?:[ =]|$)",
        "runs a program named in an option (sort --compress-program, rg --pre, man -P)",
    ),
    _routine(
        "windows-delete",
        r"cmd|cmd\.exe",
        r"^(?:/\S+ )*?/[ck] (?:.* )?(?:del|erase|rd|rmdir)(?: |$)",
        "deletes files through cmd",
        re.IGNORECASE,
    ),
    _routine(
        "powershell-delete",
        r"powershell|powershell\.exe|pwsh|pwsh\.exe",
        r"^(?:-\S+ )*(?:-(?:command|c) )?(?:remove-item|rmdir|erase|del|rd|ri|rm)(?: |$)",
        "deletes files through PowerShell",
        re.IGNORECASE,
    ),
    _routine(
        "powershell-code",
        r"powershell|powershell\.exe|pwsh|pwsh\.exe",
        r"(?:^| )-(?:encodedcommand|enc|e|ec|command|c|file|f)(?: |$)",
        "runs PowerShell code or a script",
        re.IGNORECASE,
    ),
    # -- a project's and an agent's own settings ---------------------------------------
    redirect(
        "project-config-redirect",
        rf"{WRITE_REDIRECT}{_PROJECT_CONFIG}$",
        "overwrites a project's .env or config.yaml",
        session="pattern",
    ),
    _routine(
        "project-config-tee",
        "tee",
        rf"{ARG}{_PROJECT_CONFIG}{END}",
        "overwrites a project's .env or config.yaml",
    ),
    _routine(
        "project-config-copy",
        "cp|mv|install",
        rf"{ARG}{_PROJECT_CONFIG}$",
        "overwrites a project's .env or config.yaml",
    ),
    # -- processes --------------------------------------------------------------------
    _routine(
        "kill-by-lookup",
        "kill",
        r"(?:\$\(|`)\s*(?:\S*/)?(?:pgrep|pidof)\b",
        "kills processes found by name ($(pgrep ...))",
    ),
    _routine(
        "pkill-force",
        "pkill",
        r"(?:^| )(?:-9|-kill|-sigkill|--signal[ =](?:9|kill|sigkill))(?: |$)",
        "force-kills processes by name (pkill -9)",
        re.IGNORECASE,
    ),
    _routine(
        "killall-force",
        "killall",
        r"(?:^| )(?:-9|-kill|-sigkill|(?:-s|--signal) (?:9|kill|sigkill))(?: |$)",
        "force-kills processes by name (killall -9)",
        re.IGNORECASE,
    ),
    _routine(
        "killall-regex",
        "killall",
        r"(?:^| )(?:-[a-zA-Z]*r|--regexp)(?: |$)",
        "kills every process whose name matches a regex (killall -r)",
    ),
    _wrapper(
        "sudo-password",
        "sudo",
        r"(?:^| )(?:-[a-zA-Z]*[SAsa][a-zA-Z]*|--stdin|--askpass)(?= |$)",
        "runs sudo with a password from input or a helper, or opens a root shell (sudo -S, -A, -s)",
    ),
    script(
        "chmod-then-run",
        r"\bchmod\s+(?:-\S+\s+)*\+x\b.*?[;&|\n]+\s*\./",
        "makes a file executable and runs it",
        session="pattern",
    ),
    # -- git --------------------------------------------------------------------------
    _routine(
        "git-reset-hard",
        "git",
        rf"^reset (?:.* )?--h(?:a(?:r(?:d)?)?)?{END}",
        "discards uncommitted changes (git reset --hard)",
    ),
    _routine(
        "git-push-force",
        "git",
        rf"^push (?:.* )?(?:--force\S*|-[a-zA-Z]*f[a-zA-Z]*){END}",
        "rewrites a remote's history (git push --force)",
    ),
    _routine(
        "git-clean-force",
        "git",
        rf"^clean (?:.* )?(?:-[a-zA-Z]*f[a-zA-Z]*|--force){END}",
        "deletes untracked files (git clean -f)",
    ),
    _routine(
        "git-branch-force-delete",
        "git",
        rf"^branch (?:(?=(?:.* )?-[a-zA-Z]*D)"
        rf"|(?=(?:.* )?(?:-[a-zA-Z]*d[a-zA-Z]*|--delete){END})"
        rf"(?=(?:.* )?(?:-[a-zA-Z]*f[a-zA-Z]*|--force){END}))",
        "deletes a branch that may not be merged (git branch -D)",
    ),
    # -- services and the agent's own processes ----------------------------------------
    _routine(
        "hermes-lifecycle",
        "hermes",
        rf"{_OPTIONS}(?:gateway (?:stop|restart)|update)(?: |$)",
        "stops, restarts or updates the Hermes gateway (kills running agents)",
    ),
    _routine(
        "hermes-approval-settings",
        "hermes",
        rf"{_OPTIONS}config set (?:command_allowlist|mcp_allowlist|approvals\S*)(?: |$)",
        "changes Hermes's own approval settings or allowlists",
    ),
    script(
        "hermes-gateway-detached",
        r"gateway\s+run\b.*(?:&\s*$|&\s*;|\bdisown\b|\bsetsid\b)|\bnohup\b.*gateway\s+run\b",
        "starts the Hermes gateway outside its service manager",
        session="pattern",
    ),
    _routine(
        "kill-hermes",
        "pkill|killall",
        r"(?:^| )\S*(?:hermes|gateway|cli\.py)",
        "kills the Hermes agent or gateway",
    ),
    _routine(
        "launchctl-hermes",
        "launchctl",
        rf"^(?:-\S+ )*{_LAUNCHD_STOPS} (?:.* )?\S*{_HERMES_GATEWAY_LABEL}",
        "stops or unloads the Hermes gateway's launchd service",
    ),
    script(
        "launchctl-hermes-variable",
        rf"^(?=[\s\S]*\b{_HERMES_GATEWAY_LABEL})[\s\S]*\blaunchctl\s+{_LAUNCHD_STOPS}\s[^;&|\n]*\$",
        "stops or unloads a launchd service named by a variable, next to the Hermes "
        "gateway's label",
        session="pattern",
    ),
    _routine(
        "container-lifecycle",
        r"docker|podman",
        rf"{_OPTIONS}(?:(?:container )?(?:restart|stop|kill)|compose (?:{_OPTION})*"
        r"(?:restart|stop|kill|down))(?: |$)",
        "stops, restarts or kills containers",
    ),
    _routine(
        "container-remote-daemon",
        r"docker|podman",
        rf"{_OPTIONS}(?:-H|--host|--context|-c|--url|--connection|--identity|-r|--remote)"
        r"(?:[ =]|$)",
        "sends container commands to another daemon (docker -H, --context; podman --remote)",
    ),
    _routine(
        "compose-lifecycle",
        r"docker-compose|podman-compose",
        r"^(?:.* )?(?:restart|stop|kill|down)(?: |$)",
        "stops, restarts or kills containers",
    ),
    # -- software and credentials -----------------------------------------------------
    _routine(
        "package-uninstall",
        r"npm|pnpm|yarn|pip[\d.]*|brew",
        rf"{_OPTIONS}(?:global )?(?:uninstall|un|unlink|remove|rm|r)(?: |$)",
        "uninstalls software",
    ),
    _routine(
        "cloud-metadata",
        r"curl|wget|http|https|aria2c|fetch",
        rf"(?:^|[\s/@]){_IMDS_HOSTS}(?=[:/?# ]|$)",
        "reads the cloud metadata endpoint (instance credentials)",
    ),
)
"""The routine families; :data:`~hermes_sandbox.tools.approval.DANGEROUS_PATTERNS` ends
with them."""
