"""The form of an allowlist entry of dangerous commands: an exact command, or a regex
after :data:`ALLOWLIST_REGEX_PREFIX`. Read by the config file and by the approval
policy (tools/approval.py, which gives the entries their meaning); a module of its own
so that reading a config file does not import the approval machinery."""

from __future__ import annotations

ALLOWLIST_REGEX_PREFIX = "re:"
