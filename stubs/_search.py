"""hermes-sandbox file search: runs inside the sandbox, for the search_files tool.

Stdlib only, Python 3.8+. Started as ``python -I -S -c SOURCE PARAMS``, PARAMS being the
call's settings as JSON (see tools/search_tool.py, which sends them). It finds candidates
with ripgrep when PARAMS names an ``rg``, and with a walk of its own otherwise; either
way the same code then filters, sorts and pages them, so both engines give the same
results. It prints one line: PARAMS' marker followed by ``{"ok": true, "total",
"items"}`` or ``{"ok": false, "error"}``.
"""

import base64
import json
import os
import re
import subprocess
import sys
import warnings
from collections import deque


def glob_body(glob):
    """A glob as the body of a regular expression.

    '*' and '?' stay within one path component, '**' spans them, '{a,b}' is either,
    '[...]' a class; a leading '!' and anchoring are glob_filter's.
    """
    out = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            start = i + 1
            negate = start < len(glob) and glob[start] in "!^"
            if negate:
                start += 1
            close = glob.find("]", start + 1)
            if close < 0:
                out.append(re.escape(char))
            else:
                inner = "".join("\\" + c if c in "\\[]&~|^" else c for c in glob[start:close])
                out.append("[" + ("^" if negate else "") + inner + "]")
                i = close + 1
                continue
        elif char == "{":
            close = glob.find("}", i)
            if close < 0:
                out.append(re.escape(char))
            else:
                options = glob[i + 1 : close].split(",")
                out.append("(?:" + "|".join(glob_body(o) for o in options) + ")")
                i = close + 1
                continue
        elif char == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def glob_filter(glob, glob_ignore_case):
    """A compiled glob and whether it excludes; one without '/' matches the name at any depth."""
    negated = glob.startswith("!")
    glob = glob[1:] if negated else glob
    anchored = "/" in glob
    glob = glob.lstrip("/")
    prefix = "" if anchored else "(?:.*/)?"
    flags = re.IGNORECASE if glob_ignore_case else 0
    return re.compile("(?s)" + prefix + glob_body(glob) + r"\Z", flags), negated


def search(params):
    """Run one search as ``params`` ask and print its result line."""
    root = params["root"]
    root_is_dir = os.path.isdir(root)
    target = params["target"]
    mode = params["output_mode"]
    context = params["context"]
    ignore_case = params["case_insensitive"]
    rg = params["rg"]
    excluded = params["excluded_dirs"]
    max_filesize = params["max_filesize"]
    line_chars = params["max_line_chars"]

    def emit(result):
        print(params["marker"] + json.dumps(result))

    def clean(name):
        """A path from rg (its JSON object) or from os (str) as display text."""
        if isinstance(name, dict):
            if "text" in name:
                name = name["text"]
            else:
                name = base64.b64decode(name["bytes"]).decode("utf-8", "replace")
        else:
            name = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return name[2:] if name.startswith("./") else name

    filters = []
    if target == "files":
        filters.append(glob_filter(params["pattern"], ignore_case))
    if params["file_glob"]:
        filters.append(glob_filter(params["file_glob"], False))

    def wanted(rel):
        name = rel or os.path.basename(root)
        return all(bool(rx.match(name)) != negated for rx, negated in filters)

    # Globs rg may use to skip files early: only plain name globs, whose meaning in rg
    # is surely no narrower than ours. The filter above decides in the end.
    prefilter = []
    for glob in (params["pattern"] if target == "files" else None, params["file_glob"]):
        if glob and not ignore_case and re.match(r"[^/\\\[\]!?]+\Z", glob):
            prefilter += ["--glob", glob]
    rg_common = ["--no-config", "--no-ignore", "--hidden", "--no-messages"]
    rg_common += ["--max-filesize", str(max_filesize)]
    rg_walk = prefilter[:]  # after the include globs, so that the excludes win
    for name in excluded:
        rg_walk += ["--glob", "!" + name + "/"]

    # Finders yield (rel, {line_number: text}, [matching line numbers]) per file, in any
    # order; text is the line without its ending.
    def walk():
        if not root_is_dir:
            yield "", root
            return
        pending = [("", root)]
        while pending:
            rel_dir, full_dir = pending.pop()
            try:
                entries = list(os.scandir(full_dir))
            except OSError:
                continue
            for entry in entries:
                rel = rel_dir + "/" + entry.name if rel_dir else entry.name
                try:
                    if entry.is_symlink():
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in excluded:
                            pending.append((rel, entry.path))
                    elif (
                        entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_size <= max_filesize
                    ):
                        yield rel, entry.path
                except OSError:
                    continue

    def python_scan(full, rx):
        lines: dict[int, str] = {}  # (local annotations are never evaluated: fine on 3.8)
        matches = []
        before: deque[tuple[int, str]] = deque(maxlen=context)
        after = 0
        number = 0
        try:
            with open(full, "rb") as handle:
                if b"\0" in handle.read(65536):
                    return None
                handle.seek(0)
                for raw in handle:
                    if b"\0" in raw:
                        return None  # binary, however late the NUL
                    number += 1
                    if raw.endswith(b"\n"):
                        raw = raw[:-1]
                    if raw.endswith(b"\r"):
                        raw = raw[:-1]
                    text = raw.decode("utf-8", "replace")
                    if rx.search(text):
                        lines.update(before)
                        before.clear()
                        lines[number] = text
                        matches.append(number)
                        after = context
                    elif after:
                        lines[number] = text
                        after -= 1
                    elif context:
                        before.append((number, text))
        except OSError:
            return None
        return lines, matches

    def python_content(rx):
        for rel, full in walk():
            rel = clean(rel)
            if not wanted(rel):
                continue
            found = python_scan(full, rx)
            if found and found[1]:
                yield rel, found[0], found[1]

    def rg_content(rx):
        argv = [rg, "--json", "--crlf", "--encoding", "none", "--no-mmap", *rg_common]
        argv += ["--ignore-case" if ignore_case else "--case-sensitive"]
        argv += ["--regexp", params["pattern"]]
        if context:
            argv += ["--context", str(context)]
        if root_is_dir:
            argv += [*rg_walk, "--", "."]
        else:
            argv += ["--", root]
        process = subprocess.Popen(
            argv,
            cwd=root if root_is_dir else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        produced = 0
        current = None
        assert process.stdout is not None
        with process:
            for raw in process.stdout:
                try:
                    message = json.loads(raw)
                    kind = message["type"]
                    data = message["data"]
                except (ValueError, KeyError, TypeError):
                    continue
                if kind == "begin":
                    current = ("" if not root_is_dir else clean(data["path"]), {}, [])
                elif kind in ("match", "context") and current is not None:
                    lines = data["lines"]
                    text = lines["text"] if "text" in lines else clean(lines)
                    text = text[:-1] if text.endswith("\n") else text
                    text = text[:-1] if text.endswith("\r") else text
                    current[1][data["line_number"]] = text
                    if kind == "match":
                        current[2].append(data["line_number"])
                elif kind == "end" and current is not None:
                    # A NUL anywhere makes the file binary; rg reports where it saw one.
                    if data.get("binary_offset") is None and wanted(current[0]):
                        produced += 1
                        yield current
                    current = None
        if process.returncode not in (0, 1) and not produced:
            # rg refused (a regex only Python accepts, say): the walk gives the answer.
            yield from python_content(rx)

    def rg_files():
        process = subprocess.run(
            [rg, "--files", "--null", *rg_common, *rg_walk, "--", "."],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if process.returncode not in (0, 1):
            return None
        names = process.stdout.split(b"\0")
        return [clean(name.decode("utf-8", "surrogateescape")) for name in names if name]

    # Keep only the page's worth of the smallest results: memory stays bounded however
    # many there are.
    keep_count = params["offset"] + params["limit"]
    kept = []

    def key(entry):
        return entry[0]

    def keep(sort_key, item):
        kept.append((sort_key, item))
        if len(kept) >= 2 * keep_count + 1000:
            kept.sort(key=key)
            del kept[keep_count:]

    def cut(text):
        return text if len(text) <= line_chars else text[:line_chars] + "…"

    total = 0
    if target == "files":
        names = None
        if not root_is_dir:
            names = [""]
        elif rg:
            names = rg_files()
        if names is None:
            names = [clean(rel) for rel, _ in walk()]
        for rel in names:
            if wanted(rel):
                total += 1
                keep((rel.split("/"),), rel)
    else:
        flags = re.IGNORECASE if ignore_case else 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                rx = re.compile(params["pattern"], flags)
        except (re.error, Warning) as exc:
            emit({"ok": False, "error": f"invalid regular expression: {exc}"})
            return
        for rel, lines, matches in rg_content(rx) if rg else python_content(rx):
            parts = rel.split("/")
            if mode == "content":
                for number in matches:
                    item = {"path": rel, "line": number, "text": cut(lines[number])}
                    if context:
                        item["before"] = [
                            cut(lines[n]) for n in range(number - context, number) if n in lines
                        ]
                        item["after"] = [
                            cut(lines[n])
                            for n in range(number + 1, number + 1 + context)
                            if n in lines
                        ]
                    keep((parts, number), item)
                total += len(matches)
            else:
                total += 1
                if mode == "count":
                    keep((parts,), {"path": rel, "count": len(matches)})
                else:
                    keep((parts,), rel)

    kept.sort(key=key)
    page: list[object] = []
    size = 0
    for _, item in kept[params["offset"] : keep_count]:
        size += len(json.dumps(item))
        if page and size > params["max_page_chars"]:
            break
        page.append(item)
    emit({"ok": True, "total": total, "items": page})


if __name__ == "__main__":
    search(json.loads(sys.argv[1]))
