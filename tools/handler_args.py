"""Reading a handler's arguments: shared by the built-in tools.

Calls through the registry arrive coerced and validated against the tool's schema;
these helpers keep a handler safe when it is called directly, and word the error the
same way everywhere. Each raises ValueError with a message meant for the model.
"""

from __future__ import annotations

from typing import Any


def int_arg(
    args: dict[str, Any],
    name: str,
    default: int,
    *,
    low: int | None = None,
    high: int | None = None,
) -> int:
    """``args[name]`` as an int (``default`` when absent), within ``low``..``high``."""
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        if low is not None and high is not None:
            bounds = f"between {low:,} and {high:,}"
        elif low is not None:
            bounds = f"at least {low:,}"
        else:
            bounds = f"at most {high:,}"
        raise ValueError(f"{name} must be {bounds}, got {number:,}")
    return number


def bool_arg(args: dict[str, Any], name: str) -> bool:
    """``args[name]`` as a bool (False when absent); accepts "true"/"false" text."""
    value = args.get(name)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {value!r}")
