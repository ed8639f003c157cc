"""The one head/tail cut: its marker, its sizes, and the UTF-8 edges of a cut byte stream."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_sandbox.environments.capture import HeadTailBuffer
from hermes_sandbox.truncation import (
    cut_middle,
    decode_ends,
    decode_head_within,
    decode_tail_within,
    encoded_size,
    keep_ends,
    omission_marker,
)

MARKER = re.compile(r"\n\.\.\. \[([\d,]+) (characters|bytes) omitted\] \.\.\.\n")


def parts(text: str) -> tuple[str, int, str, str]:
    """Head, omitted count, unit and tail of a cut text."""
    match = MARKER.search(text)
    assert match, text
    return text[: match.start()], int(match[1].replace(",", "")), match[2], text[match.end() :]


def test_the_marker():
    assert omission_marker(12345) == "\n... [12,345 characters omitted] ...\n"
    assert omission_marker(7, "bytes") == "\n... [7 bytes omitted] ...\n"


@given(st.text(min_size=0, max_size=3000), st.integers(min_value=0, max_value=3000))
def test_cut_middle_fits_and_accounts_for_every_character(text: str, limit: int):
    cut = cut_middle(text, limit)
    assert len(cut) <= limit or cut == text
    if len(text) <= limit:
        assert cut == text
    elif limit <= len(omission_marker(len(text))):
        assert cut == text[:limit]  # no room for the marker: the head alone
    else:
        head, omitted, unit, tail = parts(cut)
        assert unit == "characters"
        assert text.startswith(head) and text.endswith(tail)
        assert len(head) + omitted + len(tail) == len(text)


def test_head_share():
    text = "h" * 5000 + "t" * 5000
    head, _, _, tail = parts(cut_middle(text, 1000))
    assert len(head) == int((len(head) + len(tail)) * 0.4)  # the default: 40% head
    head, _, _, tail = parts(cut_middle(text, 1000, head_share=0.75))
    assert len(head) == int((len(head) + len(tail)) * 0.75)


def test_keep_ends_keeps_exactly_what_it_is_told():
    text = "".join(str(i % 10) for i in range(500))
    head, omitted, _, tail = parts(keep_ends(text, 100))
    assert len(head) + len(tail) == 100 and omitted == 400
    assert keep_ends(text, 500) == text
    assert parts(keep_ends(text, 0))[1] == 500


def test_decode_ends_drops_a_character_split_by_the_cut():
    euro = "€".encode()  # three bytes
    head, tail = (euro * 3)[:-1], (euro * 3)[2:]
    text = decode_ends(head, 99, tail)
    assert text == "€€" + omission_marker(99, "bytes") + "€€"
    assert decode_ends(b"\xff ok", 1, b"ok \xff") == "\ufffd ok" + omission_marker(1, "bytes") + (
        "ok \ufffd"
    )


@pytest.mark.parametrize("size", [0, 10, 99, 100, 101, 5000])
def test_head_tail_buffer_text(size: int):
    data = bytes(range(48, 58)) * (size // 10) + b"x" * (size % 10)
    buffer = HeadTailBuffer(100)
    for start in range(0, len(data), 7):
        buffer.feed(data[start : start + 7])
    text = buffer.text()
    if size <= 100:
        assert text == data.decode()
    else:
        head, omitted, unit, tail = parts(text)
        assert unit == "bytes" and omitted == size - 100
        assert head.encode() == data[:40] and tail.encode() == data[-60:]


def test_encoded_size_counts_what_decoding_and_json_make_of_bytes() -> None:
    assert encoded_size("abc\n\t") == 5
    assert encoded_size("\ufffd") == 3
    assert encoded_size("\x00") == 6  # JSON writes it \\u0000
    assert encoded_size("\u20ac") == 3


def test_decoding_within_a_budget_cuts_after_decoding() -> None:
    assert decode_head_within(b"\xff" * 100, 30) == ("\ufffd" * 10, 10)
    assert decode_tail_within(b"\xff" * 100, 30) == ("\ufffd" * 10, 10)
    assert decode_head_within(b"\x00" * 100, 30) == ("\x00" * 5, 5)
    assert decode_head_within(b"plain text", 100) == ("plain text", 10)
    # A character the budget cuts in two is left out, not shown as U+FFFD.
    assert decode_head_within("\u20ac".encode() * 4, 7) == ("\u20ac" * 2, 6)
    assert decode_tail_within("\u20ac".encode() * 4, 7) == ("\u20ac" * 2, 6)


@given(st.binary(max_size=400), st.integers(min_value=0, max_value=200))
def test_decoding_within_a_budget_never_passes_it(data: bytes, budget: int) -> None:
    for fit in (decode_head_within, decode_tail_within):
        text, shown = fit(data, budget)
        assert encoded_size(text) <= budget
        assert 0 <= shown <= len(data)


def test_captured_output_whose_text_passes_the_cap_is_cut_and_spilled(tmp_path: Path) -> None:
    """40 kB of invalid bytes fit a 50 kB byte cap but decode to 120 kB of text."""
    from hermes_sandbox.output import CappedOutput

    output = CappedOutput(50_000, spill_limit=1_000_000, spill_dir=str(tmp_path))
    output.feed(b"\xff" * 40_000)
    output.close()
    assert output.truncated
    assert len(output.text().encode()) <= 50_000 + 100
    assert output.shown_bytes == output.text().count("\ufffd")
    assert output.spill_path is not None
    assert Path(output.spill_path).read_bytes() == b"\xff" * 40_000
