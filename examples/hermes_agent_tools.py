"""Example: serve Hermes Agent's own tools to a script.

With hermes-agent installed beside hermes-sandbox (pip install hermes-agent), a script's
read_file, write_file and terminal calls run Hermes's own handlers, and the script gets
Hermes's own result shapes (read_file numbers its lines, write_file reports
resolved_path, ...). They act where Hermes's terminal backend is configured: by default
this host, in the current directory.

Run it with:  python examples/hermes_agent_tools.py
"""

import shutil

from hermes_sandbox import execute_code
from hermes_sandbox.tools.hermes_agent import mirror_hermes_tools

SCRIPT = """
from hermes_tools import terminal, write_file, read_file
write_file("hermes-example/hello.txt", "hello from Hermes's own write_file\\n")
print(read_file("hermes-example/hello.txt")["content"])
print(terminal("ls -l hermes-example")["output"])
"""

if __name__ == "__main__":
    served = mirror_hermes_tools(["read_file", "write_file", "terminal"])
    try:
        result = execute_code(SCRIPT, registry=served, tools=served.names(), timeout=120)
        print(result.status)
        print(result.output)
    finally:
        shutil.rmtree("hermes-example", ignore_errors=True)
