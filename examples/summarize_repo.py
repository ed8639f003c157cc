"""Example: a script an agent might write. It uses several tools in one run and
prints only a short summary, which is all that goes back to the model.

Run it with:  hermes-sandbox run examples/summarize_repo.py
"""

from concurrent.futures import ThreadPoolExecutor

from hermes_tools import read_file, terminal, write_file

# 1. Ask the shell which Python files are here (one tool call).
listing = terminal("ls *.py */*.py 2>/dev/null | head -n 40")
files = [line for line in listing["output"].splitlines() if line.endswith(".py")]

# 2. Read them concurrently: calls overlap, each thread gets its own answer.
with ThreadPoolExecutor(max_workers=8) as pool:
    results = list(pool.map(lambda path: read_file(path, limit=5000), files))

sizes = {}
for path, result in zip(files, results, strict=True):
    if "error" in result:
        continue
    sizes[path] = result["total_lines"]

# 3. Write a report file, then read back its first line to show it landed.
biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
report = "\n".join(f"{lines:6d}  {path}" for path, lines in biggest) + "\n"
written = write_file("/tmp/hermes-sandbox-example-report.txt", report)
first = read_file(written["path"], limit=1)["content"].strip()

print(f"{len(sizes)} Python files, {sum(sizes.values())} lines in all.")
print(f"Largest: {first}")
print(f"Report: {written['path']} ({written['bytes_written']} bytes)")
