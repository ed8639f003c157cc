"""Where the hunks of a V4A update go in a file, and the file's text once they are applied.

A hunk's context and removed lines are looked for from its @@ anchor line (inclusive),
then from the end of the previous hunk, then anywhere else in the file where they fit
exactly once; each search tries an exact match, then one that ignores trailing
whitespace, then one that ignores indentation. An anchor only narrows the search, except
for a hunk of added lines alone: those go right after their anchor line (or at the end of
the file, without one). Line endings, a missing final newline and a byte-order mark are
kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hermes_sandbox.tools.patch_format import Hunk
from hermes_sandbox.tools.patch_text import PatchError, dominant_eol, quote_line

_SHOWN_LINES = 6  # lines of a hunk quoted back in an error
_BOM = "\ufeff"


@dataclass(slots=True)
class _Line:
    content: str  # without its line ending
    ending: str  # "\n", "\r\n", or "" for a last line without one


def _split_lines(text: str) -> list[_Line]:
    parts = text.split("\n")
    result = [
        _Line(part[:-1], "\r\n") if part.endswith("\r") else _Line(part, "\n")
        for part in parts[:-1]
    ]
    if parts[-1]:
        result.append(_Line(parts[-1], ""))
    return result


def _same(line: str) -> str:
    return line


# How strictly a hunk's lines must equal the file's: exactly, then up to trailing
# whitespace, then up to indentation too.
_TIERS: tuple[Callable[[str], str], ...] = (_same, str.rstrip, str.strip)
_Region = tuple[int, int]  # [start, end) in the file's lines; start == end is an insertion


def _overlaps(a: _Region, b: _Region) -> bool:
    if a[0] == a[1]:
        return b[0] < a[0] < b[1]
    if b[0] == b[1]:
        return a[0] < b[0] < a[1]
    return max(a[0], b[0]) < min(a[1], b[1])


class _Search:
    """Looks for a hunk's lines in the file, never inside what earlier hunks change."""

    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.taken: list[_Region] = []
        self._normalised: dict[int, list[str]] = {}  # the file's lines, by tier

    def _places(self, tier: int, pattern: list[str], lo: int, at_eof: bool) -> Iterator[int]:
        """The free places at or after ``lo`` where ``pattern`` fits at ``tier``."""
        norm = _TIERS[tier]
        if tier not in self._normalised:
            self._normalised[tier] = [norm(line.content) for line in self.lines]
        text = self._normalised[tier]
        wanted = [norm(line) for line in pattern]
        last = len(text) - len(wanted)
        # A hunk marked as at the end of the file is tried there first.
        candidates = [last] if at_eof and last >= lo else []
        candidates += [i for i in range(lo, last + 1) if not (at_eof and i == last)]
        for index in candidates:
            if (
                text[index] == wanted[0]
                and text[index : index + len(wanted)] == wanted
                and self.free((index, index + len(wanted)))
            ):
                yield index

    def first(self, pattern: list[str], lo: int, at_eof: bool) -> int | None:
        for tier in range(len(_TIERS)):
            found = next(self._places(tier, pattern, lo, at_eof), None)
            if found is not None:
                return found
        return None

    def everywhere(self, pattern: list[str], at_eof: bool) -> list[int]:
        for tier in range(len(_TIERS)):
            found = list(self._places(tier, pattern, 0, at_eof))
            if found:
                return found
        return []

    def free(self, region: _Region) -> bool:
        return not any(_overlaps(region, other) for other in self.taken)


def _anchor_rank(content: str, anchor: str) -> int | None:
    """How well a line fits an anchor: 0 the whole line, 1 its start, 2 inside it."""
    text = content.strip()
    if text == anchor:
        return 0
    if text.startswith(anchor):
        after = text[len(anchor)]
        if not (after.isalnum() or after == "_"):
            return 1
    return 2 if anchor in content else None


def _anchor_lines(lines: list[_Line], anchor: str, lo: int) -> list[int]:
    """The lines at or after ``lo`` that fit ``anchor`` best."""
    best, found = 3, list[int]()
    for index in range(lo, len(lines)):
        rank = _anchor_rank(lines[index].content, anchor)
        if rank is None or rank > best:
            continue
        if rank < best:
            best, found = rank, []
        found.append(index)
    return found


def _listed(indexes: list[int]) -> str:
    return ", ".join(str(i + 1) for i in indexes[:10]) + (", ..." if len(indexes) > 10 else "")


def _walk_anchors(hunk: Hunk, lines: list[_Line], cursor: int, required: bool) -> int | None:
    """The line of the hunk's last @@ anchor, each looked for after the one before it.

    An anchor not found after the previous hunk ends the narrowing, unless the anchors
    are ``required`` (they alone place the hunk): then they must be found, and the first
    must name one line, after the previous hunk or else in the whole file."""
    position, line = cursor, None
    for number, anchor in enumerate(hunk.anchors):
        found = _anchor_lines(lines, anchor, position)
        if required and (not found or (number == 0 and len(found) > 1)):
            where = f"hunk {hunk.number} (patch line {hunk.patch_line}): its @@ line {anchor!r}"
            found = found or _anchor_lines(lines, anchor, 0)
            if not found:
                raise PatchError(
                    f"{where} was not found; a hunk of '+' lines alone goes right after it"
                )
            if len(found) > 1:
                raise PatchError(
                    f"{where} fits lines {_listed(found)}; make it name one line, or add "
                    "context lines to the hunk"
                )
        if not found:
            return line
        line = found[0]
        position = line + 1
    return line


def _failure(hunk: Hunk, lines: list[_Line], why: str) -> str:
    quoted = "\n".join(f"    {line}" for line in hunk.old[:_SHOWN_LINES])
    hidden = len(hunk.old) - _SHOWN_LINES
    more = f"\n    ... ({hidden} more)" if hidden > 0 else ""
    message = f"hunk {hunk.number} (patch line {hunk.patch_line}) {why}:\n{quoted}{more}"
    first = next((line for line in hunk.old if line.strip()), None)
    if first is not None:
        seen = [i for i, line in enumerate(lines) if line.content.strip() == first.strip()]
        if seen:
            message += f"\n  ({quote_line(first)} is at line {_listed(seen)} of the file)"
    return message


_Placed = tuple[int, list[str], list[str], list[int | None]]  # at, old, new, sources


def _variants(hunk: Hunk) -> list[tuple[list[str], list[str], list[int | None]]]:
    variants = [(hunk.old, hunk.new, hunk.sources)]
    old, sources = hunk.old, hunk.sources
    if len(old) > 1 and old[-1] == "" and sources and sources[-1] == len(old) - 1:
        # A trailing blank context line is often an artefact of the patch's layout.
        variants.append((old[:-1], hunk.new[:-1], sources[:-1]))
    return variants


def _place(hunk: Hunk, search: _Search, cursor: int) -> _Placed:
    lines = search.lines
    if not hunk.old:
        if hunk.at_eof or not hunk.anchors:
            return len(lines), [], hunk.new, hunk.sources
        anchor = _walk_anchors(hunk, lines, cursor, required=True)
        assert anchor is not None
        if not search.free((anchor + 1, anchor + 1)):
            raise PatchError(
                f"hunk {hunk.number} (patch line {hunk.patch_line}): its @@ line "
                f"{hunk.anchors[-1]!r} is inside the lines another hunk changes"
            )
        return anchor + 1, [], hunk.new, hunk.sources
    anchor = _walk_anchors(hunk, lines, cursor, required=False)
    starts = [cursor] if anchor is None else [anchor, cursor]
    for old, new, sources in _variants(hunk):
        for start in starts:
            at = search.first(old, start, hunk.at_eof)
            if at is not None:
                return at, old, new, sources
        elsewhere = search.everywhere(old, hunk.at_eof)
        if len(elsewhere) == 1:
            return elsewhere[0], old, new, sources
        if elsewhere:
            raise PatchError(
                _failure(
                    hunk,
                    lines,
                    f"is not after the previous hunk and fits {len(elsewhere)} places before "
                    f"it (lines {_listed(elsewhere)}); add context lines or an @@ line to "
                    "say which",
                )
            )
    why = "does not match the file" + (" (expected at its end)" if hunk.at_eof else "")
    raise PatchError(_failure(hunk, lines, why))


def apply_hunks(text: str, hunks: list[Hunk]) -> str:
    """The new text of a file after its hunks; raise PatchError for the first misfit."""
    bom = _BOM if text.startswith(_BOM) else ""
    lines = _split_lines(text[len(bom) :])
    eol = dominant_eol(text)
    search = _Search(lines)
    placed: list[tuple[int, bool, int, int, list[str], list[int | None]]] = []
    cursor = 0
    for order, hunk in enumerate(hunks):
        at, old, new, sources = _place(hunk, search, cursor)
        search.taken.append((at, at + len(old)))
        placed.append((at, bool(old), order, len(old), new, sources))
        cursor = at + len(old)

    # Last first, so indexes stay valid; where an insertion and a replacement start on
    # the same line, the replacement goes first and the insertion lands before it.
    for at, _, _, count, new, sources in sorted(placed, reverse=True):
        fresh = [
            _Line(content, eol)
            if source is None
            else _Line(lines[at + source].content, lines[at + source].ending)
            for content, source in zip(new, sources, strict=True)
        ]
        # Keep "no newline at end of file" when a hunk replaces or extends that last line.
        unterminated = bool(lines) and lines[-1].ending == "" and at + count == len(lines)
        if unterminated and fresh:
            if not count:
                lines[-1].ending = eol
            fresh[-1].ending = ""
        lines[at : at + count] = fresh
    return bom + "".join(line.content + line.ending for line in lines)
