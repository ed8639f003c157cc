"""Cleaning script output for the model: secrets in known formats masked, terminal escape
sequences stripped; unit cases for each format and what must pass untouched, then runs
that print secrets and colours."""

from __future__ import annotations

import time

import pytest

from hermes_sandbox.redaction import clean_for_model, mask, redact_secrets, strip_ansi

# Built by concatenation so that no key-shaped literal sits in the source.
OPENAI = "sk-proj-" + "abc123def456ghi789jkl012"
GITHUB = "ghp_" + "abcdef1234567890ABCDEF1234567890abcd"


# -- masking --------------------------------------------------------------------------


def test_mask_keeps_head_and_tail_of_long_secrets_only():
    assert mask("a" * 17) == "***"
    assert mask("abcdef" + "x" * 8 + "wxyz") == "abcdef...wxyz"


# -- vendor key formats ---------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        OPENAI,
        "sk-or-v1-" + "reallyLongSecretKeyValue12345678",
        "sk-ant-api03-" + "A" * 30,
        GITHUB,
        "github_pat_" + "11ABCDEFG0123456789_abcdefghij",
        "gho_" + "x" * 20,
        "xoxb-" + "0" * 12 + "-" + "a" * 14,
        "xapp-1-" + "A0B1C2D3E4F5G6",
        "AIza" + "S" * 35,
        "AKIA" + "IOSFODNN7EXAMPLE",
        "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
        "SG." + "abcdefghij1234567890",
        "hf_" + "abcdefghijklmnopqrstuvwxyz",
        "pypi-" + "AgEIcHlwaS5vcmcCJGI1",
        "tvly-" + "ABCdef123456789GHIJKL0000",
        "exa_" + "XYZ789abcdef000000000000000",
        "sk_" + "abc123def456ghi789jklmnopqrstu",
        "xai-" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstu",
        "fw-" + "A" * 40,
        "fw_" + "B" * 40,
        "fpk_" + "C" * 40,
        "gAAAA" + "B" * 30,
    ],
)
def test_known_key_formats_are_masked(key):
    result = redact_secrets(f"provider error {key} in output")
    assert key not in result
    assert key[6:-4] not in result
    assert result.startswith("provider error ") and result.endswith(" in output")


@pytest.mark.parametrize(
    "text",
    [
        "fw-tooshort fw_tooshort fpk_tooshort",
        "xai-tooshort",
        "the sk-learn docs",
        "mysk-" + "abcdefghijklmnop",  # the tail of a longer identifier
        "task_list = ask_user()",
        "HOME=/home/user",
        '{"name": "John", "model": "gpt-4"}',
        "the authorization model is fully open",
        "Hello <@222589316709220353>",
    ],
)
def test_ordinary_text_is_untouched(text):
    assert redact_secrets(text) == text


def test_an_environment_dump_keeps_its_ordinary_lines():
    dump = (
        "HOME=/home/user\n"
        f"OPENAI_API_KEY={OPENAI}\n"
        "FIRECRAWL_API_KEY=fc-" + "shortkey123456789012\n"
        "TELEGRAM_BOT_TOKEN=bot987654321:" + "ABCDEfghij-KLMNopqrst_UVWXyz12345\n"
        "SHELL=/bin/bash\n"
    )
    result = redact_secrets(dump)
    for secret in ("abc123def456", "shortkey1234", "ABCDEfghij"):
        assert secret not in result
    assert "HOME=/home/user\n" in result and "SHELL=/bin/bash\n" in result
    assert "OPENAI_API_KEY=sk-pro" in result  # which key it was stays readable


def test_assignments_without_a_known_format_are_left_alone():
    # Script output is often code or configuration: MAX_TOKENS is not a secret.
    for text in ("MAX_TOKENS=100", '{"apiKey": "test"}', "password: hunter2"):
        assert redact_secrets(text) == text


# -- headers, tokens, keys and URLs ---------------------------------------------------


def test_authorization_headers_keep_their_quotes():
    text = 'curl -H "Authorization: Bearer ' + "sk-abcdef1234567890" + '"'
    result = redact_secrets(text)
    assert "abcdef1234567890" not in result
    assert result.count('"') == 2 and result.endswith('"')
    basic = redact_secrets("Proxy-Authorization: Basic " + "dXNlcjpwYXNzd29yZDEyMzQ1Ng==")
    assert basic == "Proxy-Authorization: Basic dXNlcj...Ng=="


def test_api_key_headers():
    result = redact_secrets("x-api-key: " + "opaque-provider-key-1234567890")
    assert result == "x-api-key: opaque...7890"
    curl = 'curl -H "x-api-key: sk-local-' + 'VERYsecret-999888" https://api.example.com'
    assert "VERYsecret" not in redact_secrets(curl)
    assert "https://api.example.com" in redact_secrets(curl)
    assert "anotherOpaque" not in redact_secrets("api-key: " + "anotherOpaqueSecret1234567")


def test_telegram_bot_tokens_keep_the_bot_id():
    result = redact_secrets("bot123456789:" + "ABCDEfghij-KLMNopqrst_UVWXyz12345")
    assert result == "bot123456789:***"
    assert "ABCDEfghij" not in redact_secrets(
        "12345678901:" + "ABCDEfghijKLMNopqrstUVWXyz1234567890"
    )


def test_private_key_blocks_are_replaced_whole():
    block = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow"
        + "IBAAKCAQEA" * 5
        + "\n-----END RSA PRIVATE KEY-----"
    )
    assert redact_secrets(f"key:\n{block}\ndone") == "key:\n[REDACTED PRIVATE KEY]\ndone"


def test_database_url_passwords_but_not_templates():
    assert redact_secrets("postgres://admin:dbpass@db.internal:5432/app") == (
        "postgres://admin:***@db.internal:5432/app"
    )
    assert "s3cret" not in redact_secrets("mongodb+srv://u:s3cret@cluster0.example.net")
    template = 'url = f"postgresql://{user}:{password}@{host}/db"'
    assert redact_secrets(template) == template
    # never across a line: the "@" of a decorator further down is not the host
    code = "dsn = 'postgres://user:pw\n@app.route('/')"
    assert redact_secrets(code) == code


def test_a_bare_token_as_a_urls_user():
    remote = "git remote set-url origin https://" + "MYPASSWORDWASDISPLAYED@github.com/u/r.git"
    result = redact_secrets(remote)
    assert "MYPASSWORDWASDISPLAYED" not in result and "@github.com/u/r.git" in result
    assert "longtoken1234567" not in redact_secrets("ssh://longtoken1234567@gitlab.com/p.git")
    for kept in (
        "URL: https://user:supersecretpw@host.example.com/path",  # user:password@ passes
        "https://git@github.com/user/repo.git",
        "https://example.com/search?q=user@example.com",
        "https://example.com/users/john@doe.com/profile",
        "GET https://api.example.com/oauth/cb?code=abc123xyz789&state=csrf_ok",
    ):
        assert redact_secrets(kept) == kept
    in_query = "https://evil.com/steal?key=sk-" + "a" * 30
    assert "a" * 30 not in redact_secrets(in_query)


def test_json_web_tokens():
    jwt = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    result = redact_secrets(f"before {jwt} after")
    assert "eyJzdWIi" not in result
    assert result.startswith("before ") and result.endswith(" after")


def test_a_form_body_masks_its_secret_fields():
    result = redact_secrets("password=mysecret&username=bob&token=opaqueValue")
    assert result == "password=***&username=bob&token=***"
    for kept in ("I have password=foo and other things", "first=1\nsecond=2"):
        assert redact_secrets(kept) == kept


def test_long_output_is_quick():
    text = ("segment." * 100 + "token end\n") * 500 + "x" * 20_000 + "=value"
    started = time.perf_counter()
    assert redact_secrets(text) == text
    assert time.perf_counter() - started < 1.0


# -- terminal escapes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b[1;38;5;196mbold\x1b[m", "bold"),
        ("\x1b[38:2:255:0:0mcolon\x1b[0m", "colon"),
        ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
        ("\x1b]0;window title\x07text", "text"),
        ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1bPdevice control\x1b\\after", "after"),
        ("\x1b(Bcharset", "charset"),
        ("\x1b7saved\x1b8", "saved"),
        ("\x9b31m8-bit\x9b0m", "8-bit"),
        ("plain text, tabs\tand\nnewlines", "plain text, tabs\tand\nnewlines"),
    ],
)
def test_escape_sequences_are_stripped(raw, clean):
    assert strip_ansi(raw) == clean


def test_a_key_split_by_colour_codes_is_masked_once_they_are_gone():
    coloured = "\x1b[32m" + OPENAI[:10] + "\x1b[0m\x1b[32m" + OPENAI[10:] + "\x1b[0m"
    assert OPENAI[6:-4] not in clean_for_model(coloured)


# -- through a run --------------------------------------------------------------------


def test_a_runs_output_is_cleaned(run):
    key, token = OPENAI, GITHUB
    result = run(
        f"""
        import sys
        print("\\x1b[1;32mok\\x1b[0m", {key!r})
        print("token", {token!r}, file=sys.stderr)
        raise SystemExit(f"failed with {token}")
        """
    )
    assert result.status == "error"
    assert "\x1b" not in result.output
    assert result.output.startswith("ok sk-pro...l012\n")
    for secret in (key[6:-4], token[6:-4]):
        assert secret not in result.output
        assert secret not in (result.error or "")
    assert "ghp_ab...abcd" in result.output
