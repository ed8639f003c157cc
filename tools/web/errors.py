"""The web tools' errors: each message is what the model is shown.

::

    WebToolError
     ├── NotConfiguredError   no provider set up, a provider name or setting that is wrong
     ├── ProviderError        a provider's HTTP error, non-JSON or ill-shaped answer,
     │                        or no answer at all
     └── PageError            one URL of web_extract could not be read (a per-URL error)
          └── DestinationRefused   its host is an internal address (raised at connect;
                                   defined with the network guard, in guard.py)
"""

from __future__ import annotations

from hermes_sandbox.errors import ToolError


class WebToolError(ToolError):
    """Root of the web tools' errors; the message is what the model is shown."""


class NotConfiguredError(WebToolError):
    """No provider is set up, or a setting names something that does not exist."""


class ProviderError(WebToolError):
    """A provider answered with an HTTP error or something unreadable, or not at all."""


class PageError(WebToolError):
    """One page of web_extract could not be read."""
