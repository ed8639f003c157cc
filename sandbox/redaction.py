"""Cleaning a script's output before it goes back to the model: terminal escape sequences
are removed and credentials in known formats are masked.

A script that prints a configuration, a request it made or an environment variable would
otherwise hand the model a live key, and colour codes cost tokens and end up copied into
files. Masking keeps the first 6 and last 4 characters of a long secret (``sk-pro...f00d``)
so the reader can tell which key it was; a secret under 18 characters becomes ``***``.
What is masked, and what is deliberately left alone, is listed in docs/security.md.
"""

from __future__ import annotations

import re

from hermes_sandbox.tools.command_rules import LazyPattern  # compiled at first use

# Vendor key formats: a fixed prefix, then the key's own characters.
_KEY_FORMATS = (
    r"sk-[A-Za-z0-9_-]{10,}",  # OpenAI, OpenRouter, Anthropic (sk-ant-...)
    r"ghp_[A-Za-z0-9]{10,}",  # GitHub classic personal access token
    r"github_pat_[A-Za-z0-9_]{10,}",  # GitHub fine-grained token
    r"gho_[A-Za-z0-9]{10,}",  # GitHub OAuth token
    r"ghu_[A-Za-z0-9]{10,}",  # GitHub user-to-server token
    r"ghs_[A-Za-z0-9]{10,}",  # GitHub server-to-server token
    r"ghr_[A-Za-z0-9]{10,}",  # GitHub refresh token
    r"xapp-\d+-[A-Za-z0-9-]{10,}",  # Slack app-level token
    r"xox[baprs]-[A-Za-z0-9-]{10,}",  # Slack bot, user and app tokens
    r"AIza[A-Za-z0-9_-]{30,}",  # Google API key
    r"pplx-[A-Za-z0-9]{10,}",  # Perplexity
    r"fal_[A-Za-z0-9_-]{10,}",  # fal.ai
    r"fc-[A-Za-z0-9]{10,}",  # Firecrawl
    r"bb_live_[A-Za-z0-9_-]{10,}",  # Browserbase
    r"gAAAA[A-Za-z0-9_=-]{20,}",  # Fernet-encrypted tokens
    r"AKIA[A-Z0-9]{16}",  # AWS access key id
    r"sk_live_[A-Za-z0-9]{10,}",  # Stripe live secret key
    r"sk_test_[A-Za-z0-9]{10,}",  # Stripe test secret key
    r"rk_live_[A-Za-z0-9]{10,}",  # Stripe restricted key
    r"SG\.[A-Za-z0-9_-]{10,}",  # SendGrid
    r"hf_[A-Za-z0-9]{10,}",  # Hugging Face
    r"r8_[A-Za-z0-9]{10,}",  # Replicate
    r"npm_[A-Za-z0-9]{10,}",  # npm
    r"pypi-[A-Za-z0-9_-]{10,}",  # PyPI
    r"dop_v1_[A-Za-z0-9]{10,}",  # DigitalOcean personal token
    r"doo_v1_[A-Za-z0-9]{10,}",  # DigitalOcean OAuth token
    r"am_[A-Za-z0-9_-]{10,}",  # AgentMail
    r"sk_[A-Za-z0-9_]{10,}",  # ElevenLabs
    r"tvly-[A-Za-z0-9]{10,}",  # Tavily
    r"exa_[A-Za-z0-9]{10,}",  # Exa
    r"gsk_[A-Za-z0-9]{10,}",  # Groq
    r"syt_[A-Za-z0-9]{10,}",  # Matrix access token
    r"retaindb_[A-Za-z0-9]{10,}",  # RetainDB
    r"hsk-[A-Za-z0-9]{10,}",  # Hindsight
    r"mem0_[A-Za-z0-9]{10,}",  # Mem0
    r"brv_[A-Za-z0-9]{10,}",  # ByteRover
    r"xai-[A-Za-z0-9]{30,}",  # xAI
    r"ntn_[A-Za-z0-9]{10,}",  # Notion integration token
    r"fw-[A-Za-z0-9]{30,}",  # Fireworks
    r"fw_[A-Za-z0-9]{30,}",  # Fireworks
    r"fpk_[A-Za-z0-9]{30,}",  # Fireworks project key
)
# A key stands alone: not the tail of a longer identifier, not cut short by one.
_KEY = LazyPattern(r"(?<![A-Za-z0-9_-])(?:" + "|".join(_KEY_FORMATS) + r")(?![A-Za-z0-9_-])")
# Each format's literal start: text holding none of them cannot match _KEY (a cheap test).
_KEY_STARTS = tuple(re.split(r"[\\\[(.?*+|{^$]", f, maxsplit=1)[0] for f in _KEY_FORMATS)

# "Authorization: Bearer <credential>", any scheme or none; the credential stops at a
# quote so a masked header inside a quoted string keeps its closing quote.
_AUTHORIZATION = LazyPattern(
    r"((?:Proxy-)?Authorization:\s*)([A-Za-z][\w.+-]*\s+)?([^\s\"']+)", re.IGNORECASE
)
# Headers that carry a bare key.
_KEY_HEADER = LazyPattern(
    r"((?:x-api-key|x-goog-api-key|api-key|apikey|x-api-token|x-auth-token|x-access-token)"
    r"\s*:\s*)(\S+)",
    re.IGNORECASE,
)
# Telegram bot tokens: [bot]<digits>:<30+ token characters>; the digits stay.
_TELEGRAM = LazyPattern(r"(bot)?(\d{8,}):([-A-Za-z0-9_]{30,})")
_PRIVATE_KEY = LazyPattern(
    r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----"
)
# The password of a database URL (scheme://user:PASSWORD@host); never across whitespace,
# so it cannot run on to an "@" lines later.
_DATABASE_URL = LazyPattern(
    r"((?:postgres(?:ql)?|mysql|mongodb(?:\+srv)?|redis|amqp)://[^:\s]+:)([^@\s]+)(@)",
    re.IGNORECASE,
)
# A lone credential as a web URL's user (https://TOKEN@host, as git remotes carry them).
# Eight characters at least, so git@, admin@ and the like stay; user:password@ is left
# alone, as are tokens in query strings (links the model is meant to follow).
_URL_TOKEN_USER = LazyPattern(
    r"((?:https?|wss?|git|ssh|ftp|ftps|sftp)://)([^\s:@/]{8,})(@\S+)", re.IGNORECASE
)
# JSON Web Tokens: a base64 JSON header ("eyJ"), then up to two more parts.
_JWT = LazyPattern(r"eyJ[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_=-]{4,}){0,2}")
# The whole text is one form body (k=v&k=v): the values of these keys are masked.
_FORM_BODY = LazyPattern(
    r"^[A-Za-z_][A-Za-z0-9_.-]*=[^&\s]*(?:&[A-Za-z_][A-Za-z0-9_.-]*=[^&\s]*)+$"
)
_FORM_SECRET_KEYS = frozenset(
    {
        "access_token",
        "refresh_token",
        "id_token",
        "token",
        "api_key",
        "apikey",
        "client_secret",
        "password",
        "auth",
        "jwt",
        "session",
        "secret",
        "key",
        "code",
        "signature",
        "x-amz-signature",
    }
)

# ECMA-48 escape sequences: CSI (with private-mode and colon parameters), OSC ended by
# BEL or ST, DCS/SOS/PM/APC strings, nF escapes, single-character escapes, and their
# 8-bit C1 forms.
_ANSI = LazyPattern(
    r"\x1b(?:"
    r"\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|\][\s\S]*?(?:\x07|\x1b\\)"
    r"|[PX^_][\s\S]*?\x1b\\"
    r"|[\x20-\x2f]+[\x30-\x7e]"
    r"|[\x30-\x7e]"
    r")"
    r"|\x9b[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|\x9d[\s\S]*?(?:\x07|\x9c)"
    r"|[\x80-\x9f]"
)
_MAY_HAVE_ESCAPES = LazyPattern(r"[\x1b\x80-\x9f]")


def mask(secret: str) -> str:
    """``secret`` masked: its first 6 and last 4 characters, or ``***`` under 18."""
    if len(secret) < 18:
        return "***"
    return f"{secret[:6]}...{secret[-4:]}"


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, titles...)."""
    if not _MAY_HAVE_ESCAPES.search(text):
        return text
    return _ANSI.sub("", text)


def _database_password(match: re.Match[str]) -> str:
    password = match.group(2)
    if password.startswith("{") and password.endswith("}"):
        return match.group(0)  # an f-string or template placeholder, not a password
    return f"{match.group(1)}***{match.group(3)}"


def _form_body(text: str) -> str:
    body = text.strip()
    if "\n" in body or not _FORM_BODY.match(body):
        return text
    pairs = []
    for pair in body.split("&"):
        key, _, _value = pair.partition("=")
        pairs.append(f"{key}=***" if key.lower() in _FORM_SECRET_KEYS else pair)
    return "&".join(pairs)


def redact_secrets(text: str) -> str:
    """``text`` with credentials in known formats masked (see :func:`mask`).

    Masked: vendor keys by their prefix (OpenAI ``sk-``, GitHub ``ghp_``, AWS ``AKIA``,
    Slack, Google, Stripe, Hugging Face and about thirty more), Authorization and
    API-key headers, Telegram bot tokens, private key blocks (replaced whole), database
    URL passwords, a bare token as a URL's user, JSON Web Tokens, and secret fields of a
    text that is one form body. Assignments such as ``MAX_TOKENS=100`` are left alone:
    script output is often source code or configuration.
    """
    if not text:
        return text
    if any(start in text for start in _KEY_STARTS):
        text = _KEY.sub(lambda m: mask(m.group(0)), text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTHORIZATION.sub(lambda m: m[1] + (m[2] or "") + mask(m[3]), text)
    if ":" in text:
        text = _KEY_HEADER.sub(lambda m: m[1] + mask(m[2]), text)
        text = _TELEGRAM.sub(lambda m: f"{m[1] or ''}{m[2]}:***", text)
    if "BEGIN" in text and "-----" in text:
        text = _PRIVATE_KEY.sub("[REDACTED PRIVATE KEY]", text)
    if "://" in text:
        text = _DATABASE_URL.sub(_database_password, text)
        text = _URL_TOKEN_USER.sub(lambda m: m[1] + mask(m[2]) + m[3], text)
    if "eyJ" in text:
        text = _JWT.sub(lambda m: mask(m.group(0)), text)
    if "&" in text and "=" in text:
        text = _form_body(text)
    return text


def clean_for_model(text: str) -> str:
    """Script output as the model gets it: escape sequences stripped, secrets masked."""
    return redact_secrets(strip_ansi(text))


__all__ = ["clean_for_model", "mask", "redact_secrets", "strip_ansi"]
