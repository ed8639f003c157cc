"""Reading shell text the way a shell would, for the approval check.

:func:`tokenize` splits text into words (quotes removed, escapes and ``$'...'`` decoded)
and operators; :func:`parse` groups them into pipelines of simple commands, with their
redirections. A word remembers the code it substitutes (``$(...)``, backticks, ``<(...)``)
so that code can be read too, and whether it holds an expansion whose value the text does
not show. :func:`expand_words` does what the shell does next: ``{a,b}`` lists and word
splitting on ``$IFS``. Lenient by design: an unterminated quote or bracket runs to the end
of the text, so what came before it is still read.
"""

from __future__ import annotations

import codecs
import itertools
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

CONTROL_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", ";", "&", "|", "(", ")", "\n")
REDIRECTIONS = ("&>>", "&>", "<<<", "<<-", "<<", ">>", ">|", ">&", "<&", "<>", ">", "<")
_OPERATORS = sorted(CONTROL_OPERATORS + REDIRECTIONS, key=len, reverse=True)
_OPERATOR_RX = re.compile("|".join(re.escape(op) for op in _OPERATORS))
_PLAIN_RUN = re.compile(r"[^\s\\'\"$`<>|&;()#]+")  # characters that are only themselves
PIPES = ("|", "|&")
_CASE_KEYWORD = re.compile(r"(?:case|esac)(?=[\s;)&|]|$)")
_PARAMETER = re.compile(r"[A-Za-z0-9_@*#?$!-]")  # what may follow "$" in a parameter


@dataclass(slots=True)
class Word:
    text: str  # after quote removal
    start: int
    end: int
    substitutions: list[str] = field(default_factory=list)
    expands: bool = False  # holds a $VAR, ${...}, $(...), backtick or <(...) the shell fills in
    body: str | None = None  # the here-document this word delimits (after "<<")


@dataclass(slots=True)
class Operator:
    text: str
    start: int


@dataclass(slots=True)
class SimpleCommand:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, Word]] = field(default_factory=list)
    start: int = -1
    end: int = -1

    def cover(self, start: int, end: int) -> None:
        self.start = start if self.start < 0 else self.start
        self.end = end


def normalise_command(command: str) -> str:
    """The command with backslash-newlines joined and whitespace collapsed to one space.

    This is the form allowlist entries and session approvals are compared in.
    """
    return " ".join(command.replace("\\\n", "").split())


def matching_close(text: str, open_index: int, opener: str = "(", closer: str = ")") -> int:
    """Index of the bracket closing the one at ``open_index`` (len(text) if unclosed)."""
    depth = 0
    cases: list[int] = []  # the depth at each open "case": its patterns end in ")"
    i = open_index
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if opener == "(" and c in "ce":
            keyword = _CASE_KEYWORD.match(text, i)
            j = i - 1
            while j >= 0 and text[j] in " \t":
                j -= 1
            # a keyword only where a command starts: "echo case" is an argument
            if keyword is not None and (j < 0 or text[j] in "\n;&|(`"):
                if keyword.group() == "case":
                    cases.append(depth)
                elif cases:
                    cases.pop()
                i = keyword.end()
                continue
        if c == closer and cases and depth == cases[-1]:
            i += 1  # "x)" ends a case pattern, not the substitution
            continue
        if c == "'" and opener == "(":
            close = text.find("'", i + 1)
            i = n if close < 0 else close + 1
            continue
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def _ansi_c(body: str) -> str:
    try:
        return codecs.decode(body.encode("latin-1", "backslashreplace"), "unicode_escape")
    except (UnicodeDecodeError, ValueError):
        return body


def tokenize(text: str) -> list[Word | Operator]:
    """Split shell text into words (quotes removed) and operators. Lenient: an
    unterminated quote or bracket runs to the end of the text."""
    tokens: list[Word | Operator] = []
    n = len(text)
    i = 0
    parts: list[str] | None = None
    subs: list[str] = []
    start = 0
    expands = False

    def begin() -> list[str]:
        nonlocal parts, start
        if parts is None:
            parts = []
            start = i
        return parts

    in_test = False  # between "[[" and "]]"
    heredocs: list[tuple[int, bool]] = []  # (index of the delimiter word, "<<-") to read

    def flush(end: int) -> None:
        nonlocal parts, subs, expands, in_test
        if parts is not None:
            tokens.append(Word("".join(parts), start, end, subs, expands))
            in_test = (in_test or parts == ["[["]) and parts != ["]]"]
        parts = None
        subs = []
        expands = False

    while i < n:
        c = text[i]
        if c == "\\":
            if text.startswith("\\\n", i):
                i += 2
                continue
            begin().append(text[i + 1 : i + 2])
            i += 2
            continue
        if c in " \t\r":
            flush(i)
            i += 1
            continue
        if c == "#" and parts is None and not (i and text[i - 1] == "\r"):
            # a "#" after a carriage return is no comment: bash reads "\r" as a letter
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
            continue
        if c == "'":
            close = text.find("'", i + 1)
            close = n if close < 0 else close
            begin().append(text[i + 1 : close])
            i = close + 1
            continue
        if c == '"':
            word = begin()
            i += 1
            while i < n and text[i] != '"':
                d = text[i]
                if d == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt != "\n":
                        word.append(nxt if nxt in '$`"\\' else "\\" + nxt)
                    i += 2
                elif d == "$" and text.startswith("$(", i):
                    close = matching_close(text, i + 1)
                    subs.append(text[i + 2 : close])
                    word.append(text[i : close + 1])
                    i = close + 1
                    expands = True
                elif d == "$" and text.startswith("${", i):
                    close = matching_close(text, i + 1, "{", "}")
                    word.append(text[i : close + 1])
                    i = close + 1
                    expands = True
                elif d == "`":
                    close = text.find("`", i + 1)
                    close = n if close < 0 else close
                    subs.append(text[i + 1 : close])
                    word.append(text[i : close + 1])
                    i = close + 1
                    expands = True
                else:
                    expands = expands or (d == "$" and _PARAMETER.match(text, i + 1) is not None)
                    word.append(d)
                    i += 1
            i += 1
            continue
        if c == "$" and text.startswith("$'", i):
            close = i + 2
            while close < n and text[close] != "'":
                close += 2 if text[close] == "\\" else 1
            begin().append(_ansi_c(text[i + 2 : close]))
            i = close + 1
            continue
        if c == "$" and text.startswith("$(", i):
            close = matching_close(text, i + 1)
            begin().append(text[i : close + 1])
            subs.append(text[i + 2 : close])
            i = close + 1
            expands = True
            continue
        if c == "$" and text.startswith("${", i):
            close = matching_close(text, i + 1, "{", "}")
            begin().append(text[i : close + 1])
            i = close + 1
            expands = True
            continue
        if c == "`":
            close = text.find("`", i + 1)
            close = n if close < 0 else close
            begin().append(text[i : close + 1])
            subs.append(text[i + 1 : close])
            i = close + 1
            expands = True
            continue
        if c in "<>" and text.startswith("(", i + 1):
            close = matching_close(text, i + 1)
            begin().append(text[i : close + 1])
            subs.append(text[i + 2 : close])
            i = close + 1
            expands = True
            continue
        plain = _PLAIN_RUN.match(text, i)
        if plain is not None:
            begin().append(plain.group())
            i = plain.end()
            continue
        if c == "(" and parts is not None and text[i - 1] in "@?*+!=":
            # an extglob "@(a|b)" or an array "v=(a b)": one word with the brackets
            close = matching_close(text, i)
            begin().append(text[i : close + 1])
            i = close + 1
            continue
        if c in "()" and in_test:
            begin().append(c)  # inside [[ ]] brackets group a regex or a test
            i += 1
            continue
        found = _OPERATOR_RX.match(text, i)
        if found is not None:
            operator = found.group()
            if operator in REDIRECTIONS and parts is not None and "".join(parts).isdigit():
                parts = None  # "2>": the digits name a file descriptor, not a word
                subs = []
            else:
                flush(i)
            tokens.append(Operator(operator, i))
            i += len(operator)
            if operator in ("<<", "<<-"):
                heredocs.append((len(tokens), operator == "<<-"))
            elif operator == "\n" and heredocs:
                i = _read_heredocs(text, i, tokens, heredocs)
                heredocs = []
            continue
        expands = expands or (c == "$" and _PARAMETER.match(text, i + 1) is not None)
        begin().append(c)
        i += 1
    flush(n)
    return tokens


def _read_heredocs(
    text: str, i: int, tokens: list[Word | Operator], heredocs: list[tuple[int, bool]]
) -> int:
    """Read the bodies of the here-documents opened on the line that ended at ``i`` into
    their delimiter words; returns where the text goes on after them. With an unquoted
    delimiter the body's ``$(...)`` and backticks run, so they become substitutions."""
    for index, strip_tabs in heredocs:
        word = tokens[index] if index < len(tokens) else None
        if not isinstance(word, Word):
            continue
        source = text[word.start : word.end]
        lines: list[str] = []
        while i < len(text):
            newline = text.find("\n", i)
            end = len(text) if newline < 0 else newline
            line = text[i:end]
            i = end + 1
            if (line.lstrip("\t") if strip_tabs else line) == word.text:
                break
            lines.append(line)
        word.body = "\n".join(lines)
        if not any(q in source for q in "'\"\\"):
            word.substitutions = [
                sub
                for token in tokenize(word.body)
                if isinstance(token, Word)
                for sub in token.substitutions
            ]
    return min(i, len(text))


def parse(text: str) -> list[list[SimpleCommand]]:
    """The pipelines of ``text``, each a list of simple commands."""
    pipelines: list[list[SimpleCommand]] = []
    pipeline: list[SimpleCommand] = []
    command = SimpleCommand()
    redirect: str | None = None

    def end_command() -> None:
        nonlocal command
        if command.words or command.redirects:
            pipeline.append(command)
        command = SimpleCommand()

    def end_pipeline() -> None:
        nonlocal pipeline
        end_command()
        if pipeline:
            pipelines.append(pipeline)
        pipeline = []

    for token in tokenize(text):
        if isinstance(token, Word):
            if redirect is not None:
                command.redirects.append((redirect, token))
                redirect = None
            else:
                command.words.append(token)
            command.cover(token.start, token.end)
        elif token.text in REDIRECTIONS:
            redirect = token.text
            command.cover(token.start, token.start + len(token.text))
        elif token.text in PIPES:
            redirect = None
            end_command()
        else:
            redirect = None
            end_pipeline()
    end_pipeline()
    return pipelines


def normalise_path(word: str) -> str:
    """A path argument with ``.``, ``..`` and repeated slashes resolved lexically.

    A path that starts at ``~`` or a variable keeps that start: ``~/a/../..`` is ``~/..``
    (``..`` never climbs over a directory whose depth the text does not show). URLs and
    words without a slash come back as they are.
    """
    if ("/" not in word and word not in (".", "..")) or "://" in word:
        return word
    glob = word.endswith("/*")
    body = word[:-2] if glob else word
    if body.startswith(("~", "$")):
        head, _, rest = body.partition("/")
        tail = posixpath.normpath(rest) if rest else "."
        path = head if tail == "." else f"{head}/{tail}"
    else:
        path = posixpath.normpath(body)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
    if glob:
        path = "/*" if path == "/" else path + "/*"
    return "*" if path == "./*" else path


# Word splitting on $IFS (``rm${IFS}-rf${IFS}/`` is three words): any expansion of IFS,
# ${IFS:0:1} and ${IFS%?} included, reads as a word break.
_IFS = re.compile(r"\$\{IFS(?:[^}A-Za-z0-9_][^}]*)?\}|\$IFS(?![A-Za-z0-9_])")
MAX_BRACE_WORDS = 256  # a brace expansion reads as at most this many words
_MAX_BRACE_INPUT = 4_096  # longer words are not brace-expanded (left as one word)


def brace_expand(word: str) -> list[str]:
    """``word`` brace-expanded as bash does for ``{a,b}`` lists (not ``{1..3}``), at most
    :data:`MAX_BRACE_WORDS` words; ``${...}`` is a parameter, not a list."""
    if "{" not in word or "," not in word or len(word) > _MAX_BRACE_INPUT:
        return [word]
    i, n = 0, len(word)
    while i < n:
        if word[i] != "{":
            i += 1
            continue
        if i > 0 and word[i - 1] == "$":
            i = matching_close(word, i, "{", "}") + 1
            continue
        depth, commas, j = 0, [], i
        while j < n:
            if word[j] == "{":
                depth += 1
            elif word[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            elif word[j] == "," and depth == 1:
                commas.append(j)
            j += 1
        if j >= n or not commas:
            i += 1
            continue
        tails = brace_expand(word[j + 1 :])
        words: list[str] = []
        for left, right in itertools.pairwise([i, *commas, j]):
            for middle in brace_expand(word[left + 1 : right]):
                for tail in tails:
                    words.append(word[:i] + middle + tail)
                    if len(words) >= MAX_BRACE_WORDS:
                        return words
        return words
    return [word]


def expand_words(words: Sequence[Word]) -> list[tuple[str, bool]]:
    """The words the shell would pass after brace expansion and $IFS splitting, each
    with whether it still holds an expansion the text does not show."""
    expanded: list[tuple[str, bool]] = []
    for word in words:
        for braced in brace_expand(word.text):
            if word.expands and ("IFS" in braced):
                for piece in _IFS.split(braced):
                    if piece:
                        expanded.append((piece, "$" in piece or "`" in piece))
            else:
                expanded.append((braced, word.expands))
    return expanded
