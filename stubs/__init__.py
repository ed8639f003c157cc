"""The script side: generating hermes_tools.py and the stdlib-only client it runs.

Nothing in the generated files may need more than the standard library of the
sandbox's Python (3.8 or newer).
"""

from hermes_sandbox.stubs.generate import (
    CLIENT_MODULE,
    CODEC_MODULE,
    KERNEL_MODULE,
    RELAY_MODULE,
    STUB_MODULE,
    StubError,
    client_code_file,
    code_file_name,
    generate_stub,
    kernel_source,
    program_source,
    relay_code_file,
    relay_source,
    stub_files,
    tool_signature,
)

__all__ = [
    "CLIENT_MODULE",
    "CODEC_MODULE",
    "KERNEL_MODULE",
    "RELAY_MODULE",
    "STUB_MODULE",
    "StubError",
    "client_code_file",
    "code_file_name",
    "generate_stub",
    "kernel_source",
    "program_source",
    "relay_code_file",
    "relay_source",
    "stub_files",
    "tool_signature",
]
