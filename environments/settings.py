"""Typed backend settings: one frozen dataclass per backend, built once per run.

Every backend's settings class derives from :class:`BackendSettings` and names its
backend in ``backend`` (the discriminator). A settings object is built from layers of
plain data, each with its place: the config file's ``backends.NAME`` section, the
command line's ``-o KEY=VALUE`` (text, parsed by each field's type), ``--image`` and
``--network``, and the API (the class called in code, or a mapping). A value that does
not fit is refused with :class:`~hermes_sandbox.errors.SettingError`, which says where
it came from: ``backends.docker.memory in /path/config.yaml: ...``, ``-o cpus=abc:
...``, ``DockerSettings(cpus=-1): ...``.

The class owns what is particular to its backend: its fields and their checks
(:meth:`BackendSettings.check`), which field ``--image``, ``--network`` and
``--isolation`` set (:attr:`image_field`, :attr:`network_setting`,
:attr:`isolation_field`), why the backend cannot be used here (:meth:`availability`)
and how it would run here (:meth:`details`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self

from hermes_sandbox.errors import SettingError

# The image a backend that runs one starts from unless told otherwise (docker, modal;
# singularity as docker://...): one default across the code and the docs.
DEFAULT_PYTHON_IMAGE = "python:3.12-slim"
# The logger of progress a person waits on (an image pull): shown even without -v.
PROGRESS_LOGGER = "hermes_sandbox.progress"

# Where a layer's values came from: given a field name (None: the layer as a whole),
# the place a message names.
Place = Callable[[str | None], str]

# Text that means "unset" for a field that may be None (``-o memory=none``).
_NONE_WORDS = frozenset({"none", "null", "~"})
_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0"})


def config_place(backend: str, source: str | None) -> Place:
    """Values from a config file's ``backends.BACKEND`` section in ``source``."""
    suffix = f" in {source}" if source else ""
    return lambda field: f"backends.{backend}{'.' + field if field else ''}{suffix}"


def api_place(name: str) -> Place:
    """Values given in code as the mapping ``name`` (``backend_options``)."""
    return lambda field: f"{name}[{field!r}]" if field else name


def _fixed_place(text: str) -> Place:
    """A place that is ``text`` whichever field it gave."""
    return lambda field: text


_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    """A settings class's field types, resolved once (``get_type_hints`` costs more
    than the rest of building its settings, and a run builds them more than once)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _optional(hint: Any) -> tuple[bool, Any]:
    """(whether ``hint`` allows None, the hint without None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        allows_none = len(options) < len(typing.get_args(hint))
        return allows_none, options[0] if len(options) == 1 else typing.Union[tuple(options)]  # noqa: UP007
    return False, hint


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _check_scalar(value: Any, hint: Any) -> Any:
    """``value`` if it fits the scalar type ``hint`` (an int where a float goes becomes
    a float); raise ValueError otherwise. Other types are the class's own to check."""
    allows_none, inner = _optional(hint)
    if value is None:
        if allows_none:
            return None
        if inner in _KINDS:
            raise ValueError(f"must be set, expected {_KINDS[inner]}")
        return value
    if inner is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_describe(value)}")
    elif inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number, got {_describe(value)}")
    elif inner is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {_describe(value)}")
        return float(value)
    elif inner is str and not isinstance(value, str):
        raise ValueError(f"expected text, got {_describe(value)}")
    return value


def parse_text(text: str, hint: Any) -> Any:
    """A value given as text (``-o KEY=VALUE``) read by its field's type: text stays
    text, numbers and booleans are parsed, ``none`` unsets a field that may be unset,
    and lists or mappings are read as YAML (``[a, b]``, ``{k: v}``; one item alone is
    a list of one). Raise ValueError saying what was expected."""
    allows_none, inner = _optional(hint)
    if allows_none and text.strip().lower() in _NONE_WORDS:
        return None
    if inner is str:
        return text
    if inner is bool:
        word = text.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if inner is int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"expected a whole number, got {text!r}") from None
    if inner is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    import yaml  # here: reading YAML is rare, and PyYAML costs start-up time

    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ValueError(f"not a value YAML can read: {text!r}") from None
    origin = typing.get_origin(inner)
    if origin in (tuple, list, Sequence) and not isinstance(value, list | tuple):
        return () if value is None else (value,)
    return value


class BackendSettings:
    """The base of every backend's settings (see the module docstring).

    A subclass is a ``@dataclass(frozen=True, slots=True)`` that sets :attr:`backend`,
    puts its own checks in :meth:`check` (raising :class:`SettingError` with the
    ``field``, or ValueError), and may set :attr:`image_field`,
    :attr:`network_setting` and override :meth:`availability`. Scalar fields (text,
    numbers, booleans, each possibly None) are type-checked here.
    """

    __slots__ = ()

    # The backend's name in the table (environments.BACKENDS): the discriminator.
    backend: ClassVar[str]
    # The field --image sets, or None: the backend has no image; then
    # ``without_image`` says what it runs instead.
    image_field: ClassVar[str | None] = None
    without_image: ClassVar[str] = "it has no image"
    # (field, value) that --network sets, or None: the backend has no network switch.
    network_setting: ClassVar[tuple[str, Any] | None] = None
    # The field --isolation sets, or None: the backend has its own sandbox.
    isolation_field: ClassVar[str | None] = None
    # Keys that are not settings on purpose, with what to do instead (credentials).
    refused: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        hints = _type_hints(type(self))
        field: str | None = None
        try:
            for item in dataclasses.fields(self):  # type: ignore[arg-type]
                field = item.name
                value = _check_scalar(getattr(self, field), hints[field])
                object.__setattr__(self, field, value)
            field = None
            self.check()
        except SettingError as exc:
            raise exc.placed(self._place(exc.field)) from None
        except (ValueError, TypeError) as exc:
            message = str(exc)
            if field is None:  # a check that names its field first ("cpus must be ...")
                first = message.split(" ", 1)[0]
                field = first if first in self.field_names() else None
            raise SettingError(message, field=field, place=self._place(field)) from None

    def _place(self, field: str | None) -> str:
        name = type(self).__name__
        if field is None:
            return f"{name}(...)"
        return f"{name}({field}={getattr(self, field, None)!r})"

    def check(self) -> None:
        """The backend's own checks of the values, after their types; may normalise
        them (with ``object.__setattr__``). Raise SettingError naming the field."""

    def availability(self) -> str | None:
        """Why the backend cannot be used on this machine with these settings, or None
        when it can as far as can be told without starting anything (an SDK
        installed, an engine answering, an executable found, credentials present)."""
        return None

    def details(self) -> dict[str, str]:
        """How the backend would run here with these settings, as name -> phrase, for
        ``hermes-sandbox backends`` (the local backend's isolation); may probe the
        machine, never starts a sandbox."""
        return {}

    # -- building from layers ----------------------------------------------------------

    @classmethod
    def field_names(cls) -> list[str]:
        return [item.name for item in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def build(cls, layers: Sequence[tuple[Mapping[str, Any], Place]]) -> Self:
        """Settings from layers of plain data, later layers over earlier ones; each
        layer's unknown keys are refused, and a bad value is refused with the place of
        the layer that gave it. Raises SettingError."""
        return cls._build({}, layers, None)

    def updated(self, layers: Sequence[tuple[Mapping[str, Any], Place]]) -> Self:
        """These settings with ``layers`` over them (see :meth:`build`)."""
        base = {name: getattr(self, name) for name in self.field_names()}
        return self._build(base, layers, self._place)

    @classmethod
    def _build(
        cls,
        base: Mapping[str, Any],
        layers: Sequence[tuple[Mapping[str, Any], Place]],
        base_place: Place | None,
    ) -> Self:
        known = cls.field_names()
        values = dict(base)
        origin: dict[str, Place] = {}
        for data, place in layers:
            cls._refuse(data, place)
            unknown = sorted(set(data) - set(known))
            if unknown:
                raise SettingError(
                    f"unknown {cls.backend} backend setting{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}",
                    place=place(None),
                )
            for key, value in data.items():
                values[key] = value
                origin[key] = place
        first = layers[0][1] if layers else (base_place or (lambda f: cls.__name__))
        missing = [
            item.name
            for item in dataclasses.fields(cls)  # type: ignore[arg-type]
            if item.name not in values
            and item.default is dataclasses.MISSING
            and item.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise SettingError(
                f"the {cls.backend} backend needs a {', '.join(missing)}: set it in the config "
                f"file's backends.{cls.backend} section, with -o {missing[0]}=..., or in "
                f"{cls.__name__}({missing[0]}=...)",
                place=first(None),
            )
        try:
            return cls(**values)
        except SettingError as exc:
            where = origin.get(exc.field or "") or base_place or first
            raise exc.placed(where(exc.field)) from None

    @classmethod
    def _refuse(cls, data: Mapping[str, Any], place: Place) -> None:
        for key in data:
            if key in cls.refused:
                raise SettingError(f"{key} {cls.refused[key]}", field=key, place=place(key))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Self:
        """Settings from one mapping of plain data (see :meth:`build`)."""
        return cls.build([(data, lambda field: cls._call_place(field, data))])

    @classmethod
    def _call_place(cls, field: str | None, data: Mapping[str, Any]) -> str:
        if field is None or field not in data:
            return f"{cls.__name__}(...)"
        return f"{cls.__name__}({field}={data[field]!r})"

    @classmethod
    def parse_options(cls, items: Sequence[str]) -> list[tuple[dict[str, Any], Place]]:
        """``-o KEY=VALUE`` items as layers, each value parsed by its field's type.
        Raises SettingError naming the item."""
        hints = _type_hints(cls)
        layers: list[tuple[dict[str, Any], Place]] = []
        for item in items:
            key, eq, text = item.partition("=")
            key = key.strip()
            here = f"-o {item}"
            place = _fixed_place(here)
            if not eq or not key:
                raise SettingError("needs KEY=VALUE", place=here)
            cls._refuse({key: text}, place)
            if key not in hints or key not in cls.field_names():
                known = ", ".join(sorted(cls.field_names()))
                raise SettingError(
                    f"unknown {cls.backend} backend setting {key}; known: {known}", place=here
                )
            try:
                value = parse_text(text, hints[key])
            except ValueError as exc:
                raise SettingError(str(exc), field=key, place=here) from None
            layers.append(({key: value}, place))
        return layers

    @classmethod
    def flag_layers(
        cls, *, image: str | None, network: bool, isolation: str | None = None
    ) -> list[tuple[dict[str, Any], Place]]:
        """The generic ``--image``, ``--network`` and ``--isolation`` flags as layers of
        this backend's fields; raises SettingError where the backend has no such thing."""
        layers: list[tuple[dict[str, Any], Place]] = []
        if isolation is not None:
            if cls.isolation_field is None:
                raise SettingError(
                    "--isolation chooses how the local backend contains its scripts, and "
                    f"the {cls.backend} backend has no such choice; drop --isolation",
                    place=f"--isolation {isolation}",
                )
            layers.append(({cls.isolation_field: isolation}, lambda f: f"--isolation {isolation}"))
        if image is not None:
            if cls.image_field is None:
                raise SettingError(
                    f"the {cls.backend} backend runs no image ({cls.without_image}); "
                    "drop --image, or choose a backend that runs one",
                    place="--image",
                )
            layers.append(({cls.image_field: image}, lambda field: f"--image {image}"))
        if network:
            if cls.network_setting is None:
                raise SettingError(
                    f"the {cls.backend} backend has no network switch: its network is "
                    "what the machine it runs on has; drop --network",
                    place="--network",
                )
            name, value = cls.network_setting
            layers.append(({name: value}, lambda field: "--network"))
        return layers


__all__ = [
    "BackendSettings",
    "Place",
    "api_place",
    "config_place",
    "parse_text",
]
