"""Every error hermes-sandbox raises, under one root: catch :class:`SandboxError` once.

::

    SandboxError
    ├── ConfigError                  a setting that does not fit: a config file, ``-o KEY=VALUE``,
    │   │                            a backend's settings; the message names its place
    │   └── SettingError (ValueError)
    │                                one backend setting refused (which one: ``field``)
    ├── RunError                     a run that cannot start as asked (bad tools, cwd, limits)
    ├── UsageError                   bad input on the command line
    ├── SessionsError                a named session's daemon could not be reached, or refused
    ├── AgentLoopError               a delegated child's agent loop could not finish (its
    │                                model endpoint failed, answered garbage, ran out of turns)
    ├── ToolsetError (ValueError)    a toolset that does not exist or cannot be used as asked
    ├── ToolModuleError              a tools module that cannot be found or imported
    ├── StubError (ValueError)       a tool schema that cannot become a stub function
    ├── TransportUnavailable         the transport cannot work with this environment
    ├── BackendError                 the environment layer
    │   ├── BackendNotAvailable      unknown name, or its SDK, engine or host is missing
    │   │   └── SpawnNotAvailable (NotImplementedError)
    │   │                            starts processes only through the relay
    │   └── EnvironmentFailure       broke while in use (start, exec, I/O)
    │       └── SandboxGone          (modal) the cloud sandbox ended under the run
    ├── RPCError                     the wire
    │   ├── FrameError               bytes that are not a valid frame
    │   │   └── FrameTooLarge        a header announced more than the size cap
    │   ├── ConnectionClosed (ConnectionError)
    │   │                            the peer went away (EOF, reset)
    │   ├── CallRefused              a request answered with an error reply
    │   └── RelayError               the relay in the sandbox failed or went away
    └── ToolError                    a tool refused or failed; the message is for the model
        ├── PathRefused              the path policy refuses a path
        ├── PatchError               (tools.patch_text) a patch that cannot be applied
        └── WebToolError             (tools.web) the web tools
            ├── NotConfiguredError   no provider set up, or a bad setting
            ├── ProviderError        a provider failed or answered garbage
            └── PageError            one page could not be read
                └── DestinationRefused   an internal address, refused before connecting

Errors from inside the sandbox travel as data (an error *kind* and a message, see
docs/protocol.md); this tree is only what code on the host catches. Foreign errors
(docker, paramiko, msgpack, ...) are translated into it at the boundary that met them.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every error hermes-sandbox raises."""


# -- asked for what cannot be done ---------------------------------------------------------


class ConfigError(SandboxError):
    """A setting that cannot be used; the message says where it came from and why."""


class SettingError(ConfigError, ValueError):
    """A backend setting refused: ``field`` names it (None for the settings as a whole),
    ``problem`` says why, and ``place`` where the value came from (a config file's
    section, ``-o KEY=VALUE``, the settings class called in code)."""

    def __init__(self, problem: str, *, field: str | None = None, place: str | None = None):
        self.problem = problem
        self.field = field
        self.place = place
        where = place or field
        super().__init__(f"{where}: {problem}" if where else problem)

    def placed(self, place: str) -> SettingError:
        """The same refusal, said of ``place``."""
        return SettingError(self.problem, field=self.field, place=place)


class RunError(SandboxError):
    """A run that cannot start because of what was asked (bad tools, bad cwd, ...).

    The message says what to do; the command line shows it without a traceback.
    """


class UsageError(SandboxError):
    """Bad input on the command line; printed as one line, exit code 2."""


class AgentLoopError(SandboxError):
    """A delegated child's agent loop could not finish; the message says why. The
    child's result then has status ``error`` and this message as its error."""


class ToolsetError(SandboxError, ValueError):
    """A toolset that does not exist or cannot be used as asked; the message says why."""


class ToolModuleError(SandboxError):
    """A tools module that could not be found or imported; the message says why."""


class StubError(SandboxError, ValueError):
    """A tool schema that cannot become a Python function in the stub."""


class TransportUnavailable(SandboxError):
    """The transport cannot work with this environment; the message says why."""


# -- the environment layer -----------------------------------------------------------------


class BackendError(SandboxError):
    """Root of every error an environment raises."""


class BackendNotAvailable(BackendError):
    """The named backend cannot be used; the message says what to do about it."""


class SpawnNotAvailable(BackendNotAvailable, NotImplementedError):
    """The backend cannot start a process with separate output streams itself; the
    runtime starts scripts there through the stream relay instead."""


class EnvironmentFailure(BackendError):
    """The environment failed while starting, running a command or moving files."""


# -- the wire ------------------------------------------------------------------------------


class RPCError(SandboxError):
    """Root of every error the RPC layer raises."""


class FrameError(RPCError):
    """The peer sent bytes that are not a frame (bad length, undecodable body, not a map)."""


class FrameTooLarge(FrameError):
    """A frame header announced a body larger than the cap; the body is never read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte cap")
        self.size = size
        self.limit = limit


class ConnectionClosed(RPCError, ConnectionError):
    """The stream ended or broke before a whole frame arrived."""


class CallRefused(RPCError):
    """A request that gets an error reply instead of a result.

    ``kind`` is one of the error kinds of docs/protocol.md; it and ``message`` go back to
    the caller verbatim.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class RelayError(RPCError):
    """The relay failed or went away; the message says what it reported."""


# -- tools ---------------------------------------------------------------------------------


class ToolError(SandboxError):
    """A tool refused or failed; the message is what the model is shown."""


class PathRefused(ToolError):
    """A path the policy refuses; the message says what and why, for the script."""


__all__ = [
    "AgentLoopError",
    "BackendError",
    "BackendNotAvailable",
    "CallRefused",
    "ConfigError",
    "ConnectionClosed",
    "EnvironmentFailure",
    "FrameError",
    "FrameTooLarge",
    "PathRefused",
    "RPCError",
    "RelayError",
    "RunError",
    "SandboxError",
    "SettingError",
    "SpawnNotAvailable",
    "StubError",
    "ToolError",
    "ToolModuleError",
    "ToolsetError",
    "TransportUnavailable",
    "UsageError",
]
