"""Reading TOML into typed, frozen objects: one loader for the config, the model manifests and the pipelines.

Each format is a tree of :class:`msgspec.Struct` types declared ``frozen=True, forbid_unknown_fields=True,
kw_only=True`` (:class:`Schema`), with ranges as ``Annotated[int, msgspec.Meta(ge=..., le=...)]`` and choices as
``Literal[...]``. :func:`read_toml` reads a file and names what is wrong with it (missing, unreadable, a
directory, not UTF-8, not TOML); :func:`convert` turns the parsed tables into those types and rewrites
msgspec's errors so that they name the *full* key path and the value, e.g.
``config key server.inflight_bytes: expected int >= 1024, got 12``.

msgspec ignores unknown keys for plain dataclasses (``ThermalConfig`` is one), so :func:`convert` checks the
keys of every table that maps onto a dataclass itself before converting.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import msgspec.inspect as mi

__all__ = ["Schema", "convert", "numeric_ranges", "read_toml"]

T = TypeVar("T")

_MISSING = object()


class Schema(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every schema table: immutable, unknown keys refused, fields passed by name."""


def read_toml(path: Path | str, what: str, error: type[Exception]) -> dict[str, Any]:
    """Return the parsed TOML document at ``path``; raise ``error`` naming ``what`` and the problem.

    Args:
        path: the file.
        what: how messages name the file, e.g. ``"config file"`` or ``"pipeline file"``.
        error: the exception class to raise (ConfigError, ManifestError).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except PermissionError:
        raise error(f"{what} {path} is not readable by uid {os.geteuid()} (permission denied)") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(f"{what} {path} cannot be read: {e.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path} is not valid TOML: {e}") from None


def convert(raw: Any, typ: type[T], *, where: str, error: type[Exception], at: tuple[str | int, ...] = ()) -> T:
    """Convert parsed TOML ``raw`` into ``typ``; raise ``error`` as ``"{where} {key.path}: {problem}"``.

    Args:
        raw: the parsed tables (dicts, lists, scalars).
        typ: the schema type (a :class:`Schema` subclass, or anything msgspec converts to).
        where: the message prefix naming the source, e.g. ``"config key"`` or ``"pipeline file X: key"``.
        error: the exception class to raise.
        at: the key path of ``raw`` inside its file, when it is not the whole document.
    """
    info = mi.type_info(typ)
    _check_dataclass_keys(raw, info, at, where, error)
    try:
        result: T = msgspec.convert(raw, typ)
    except msgspec.ValidationError as e:
        raise error(_rewrite(str(e), raw, info, where, at)) from None
    return result


def numeric_ranges(typ: type[Any], prefix: str = "") -> Iterator[tuple[str, tuple[float, float] | None]]:
    """Yield ``(dotted key, (min, max))`` for every int/float field of the Struct tree ``typ``.

    The range is None when a bound is missing (a schema mistake: every numeric key must have both). Tables
    that map onto dataclasses are not entered: they validate themselves.
    """
    info = _unwrap(mi.type_info(typ))
    if not isinstance(info, mi.StructType):
        return
    for f in info.fields:
        key = f"{prefix}{f.encode_name}"
        ftype = _unwrap(f.type)
        if isinstance(ftype, mi.UnionType):
            inner = [_unwrap(t) for t in ftype.types if not isinstance(t, mi.NoneType)]
            ftype = inner[0] if len(inner) == 1 else ftype
        if isinstance(ftype, mi.IntType | mi.FloatType):
            lo = ftype.ge if ftype.ge is not None else ftype.gt
            hi = ftype.le if ftype.le is not None else ftype.lt
            yield key, (lo, hi) if lo is not None and hi is not None else None
        elif isinstance(ftype, mi.StructType):
            yield from numeric_ranges(ftype.cls, f"{key}.")


# ------------------------------------------------------------------------------------------------------
# error rewriting

_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_TYPE_NAMES = {"object": "table"}  # msgspec's JSON names, as TOML says them


def _parse_path(text: str) -> list[str | int]:
    return [name if name else (int(index) if index.isdigit() else "...") for name, index in _SEGMENT.findall(text)]


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _format_path(path: list[str | int] | tuple[str | int, ...]) -> str:
    """``a.b[0].c``; a key that is not a bare TOML key is quoted (``session_config."session.x"``)."""
    out = ""
    for seg in path:
        if isinstance(seg, int) or seg == "...":
            out += f"[{seg}]"
        else:
            name = seg if _BARE.match(seg) else '"' + seg.replace("\\", "\\\\").replace('"', '\\"') + '"'
            out += f".{name}" if out else name
    return out or "(top level)"


def _value_at(raw: Any, path: list[str | int]) -> Any:
    for seg in path:
        if isinstance(seg, int) and isinstance(raw, list) and 0 <= seg < len(raw):
            raw = raw[seg]
        elif isinstance(seg, str) and isinstance(raw, dict) and seg in raw:
            raw = raw[seg]
        else:
            return _MISSING
    return raw


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _fields(t: mi.Type) -> tuple[mi.Field, ...] | None:
    t = _unwrap(t)
    if isinstance(t, mi.StructType | mi.DataclassType):
        return t.fields
    return None


def _resolve(t: mi.Type, raw: Any) -> mi.Type | None:
    """Unwrap ``t``; for a union, the member ``raw`` selects (a tagged Struct by its tag, else the first table)."""
    t = _unwrap(t)
    if not isinstance(t, mi.UnionType):
        return t
    members = [_unwrap(m) for m in t.types if not isinstance(_unwrap(m), mi.NoneType)]
    if isinstance(raw, dict):
        tables: list[mi.Type] = [m for m in members if isinstance(m, mi.StructType | mi.DataclassType)]
        tagged: list[mi.Type] = [m for m in tables if isinstance(m, mi.StructType) and m.tag_field is not None
                  and raw.get(m.tag_field) == m.tag]
        members = tagged or tables or members
    return members[0] if len(members) == 1 or isinstance(raw, dict) and members else None


def _step(t: mi.Type, seg: str | int, raw: Any) -> mi.Type | None:
    """The type one path segment below ``t`` (``raw`` is the value at ``t``, to pick a union member)."""
    r = _resolve(t, raw)
    if r is None:
        return None
    fields = _fields(r)
    if fields is not None:
        return next((f.type for f in fields if f.encode_name == seg), None)
    if isinstance(r, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return r.item_type
    if isinstance(r, mi.DictType):
        return r.value_type
    return None


def _type_at(info: mi.Type, raw: Any, path: list[str | int]) -> mi.Type | None:
    t: mi.Type | None = info
    for i, seg in enumerate(path):
        if t is None:
            return None
        t = _step(t, seg, _value_at(raw, path[:i]))
    return t


def _members(t: mi.Type | None, raw: Any) -> tuple[mi.Field, ...] | None:
    """The fields of the table type ``t`` (the union member that ``raw`` selects)."""
    r = _resolve(t, raw) if t is not None else None
    return _fields(r) if r is not None else None


def _choices(t: mi.Type | None) -> tuple[Any, ...] | None:
    if t is None:
        return None
    t = _unwrap(t)
    if isinstance(t, mi.LiteralType):
        return tuple(t.values)
    if isinstance(t, mi.UnionType):
        values: list[Any] = []
        for m in t.types:
            m = _unwrap(m)
            if isinstance(m, mi.LiteralType):
                values.extend(m.values)
        return tuple(values) or None
    return None


def _tags(t: mi.Type | None) -> tuple[Any, ...] | None:
    if t is None:
        return None
    t = _unwrap(t)
    if isinstance(t, mi.UnionType):
        tags = [m.tag for m in (_unwrap(x) for x in t.types) if isinstance(m, mi.StructType) and m.tag is not None]
        return tuple(tags) or None
    return None


def _known(fields: tuple[mi.Field, ...] | None) -> str:
    names = sorted(f.encode_name for f in fields or ())
    return ", ".join(names) or "none"


def _got(value: Any) -> str:
    """``str 'x'``, ``int 3``; a table or an array by its TOML name only."""
    if isinstance(value, dict | list):
        return "table" if isinstance(value, dict) else "array"
    return f"{type(value).__name__} {value!r}"


def _range(t: mi.Type | None) -> str:
    """`` (range lo .. hi)`` for a number type with both bounds, else ''."""
    t = _unwrap(t) if t is not None else None
    if not isinstance(t, mi.IntType | mi.FloatType):
        return ""
    lo = t.ge if t.ge is not None else t.gt
    hi = t.le if t.le is not None else t.lt
    if lo is None or hi is None:
        return ""
    return f" (range {lo} .. {hi})" if isinstance(t, mi.IntType) else f" (range {lo:g} .. {hi:g})"


def _rewrite(message: str, raw: Any, info: mi.Type, where: str, at: tuple[str | int, ...]) -> str:
    """Rewrite msgspec's ``Expected `int`, got `str` - at `$.a[0].b``` as ``{where} a[0].b: expected int, got str 'x'``.

    Unknown keys list the known ones, choices list the allowed values, and ranges state both bounds.
    """
    m = _AT.match(message)  # msgspec leaves the path out for the top level
    msg, path = (m.group("msg"), _parse_path(m.group("path"))) if m is not None else (message, [])
    path = _dict_keys(path, raw, info)

    def key(p: list[str | int]) -> str:
        return _format_path([*at, *p])

    if (u := re.fullmatch(r"Object contains unknown field `(.+)`", msg)) is not None:
        k = [*path, u.group(1)]
        kind = f"table [{key(k)}]" if isinstance(_value_at(raw, k), dict) else "key"
        fields = _members(_type_at(info, raw, path), _value_at(raw, path))
        return f"{where} {key(k)}: unknown {kind} (known: {_known(fields)})"
    if (r := re.fullmatch(r"Object missing required field `(.+)`", msg)) is not None:
        return f"{where} {key([*path, r.group(1)])}: missing (required)"
    value = _value_at(raw, path)
    if msg.startswith("Invalid value") and path and isinstance(path[-1], str):  # the tag of a tagged union
        options = _tags(_type_at(info, raw, path[:-1]))
        return f"{where} {key(path)}: expected one of {', '.join(map(repr, options or ()))}, got {value!r}"
    if msg.startswith("Invalid enum value"):
        options = _choices(_type_at(info, raw, path))
        return f"{where} {key(path)}: expected one of {', '.join(map(repr, options or ()))}, got {value!r}"
    t = _type_at(info, raw, path)
    table = _resolve(t, value) if t is not None else None
    if isinstance(table, mi.StructType | mi.DataclassType):  # "Class.field must ..." from a __post_init__
        own = re.match(rf"{re.escape(table.cls.__name__)}\.(\w+) ", msg)
        if own is not None and any(f.name == own.group(1) for f in table.fields):
            path, msg = [*path, own.group(1)], msg[own.end():]
            value, t = _value_at(raw, path), _type_at(info, raw, path)
    text = re.sub(r"`([^`]*)`", lambda g: _TYPE_NAMES.get(g.group(1), g.group(1)), msg)
    if text.startswith("Expected "):
        text = "expected " + text[len("Expected "):]
    if value is not _MISSING:
        got = re.search(r", got (\w+)$", text)
        if got is not None:
            text = text[: got.start()] + f", got {_got(value)}"
        elif " got " not in text and not isinstance(value, dict | list):
            text += f", got {value!r}"
    if re.match(r"expected (int|float) [<>]", text):
        text += _range(t)
    return f"{where} {key(path)}: {text}"


def _python_type(t: mi.Type) -> Any:
    """A type msgspec can convert to that checks what ``t`` checks (None when not rebuilt here)."""
    t = _unwrap(t)
    if isinstance(t, mi.StructType | mi.DataclassType):
        return t.cls
    if isinstance(t, mi.AnyType):
        return Any
    scalars: dict[type[mi.Type], Any] = {mi.StrType: str, mi.IntType: int, mi.FloatType: float, mi.BoolType: bool}
    if type(t) in scalars:
        bounds = {k: getattr(t, k) for k in ("ge", "gt", "le", "lt", "pattern", "min_length", "max_length")
                  if getattr(t, k, None) is not None}
        base = scalars[type(t)]
        return Annotated[base, msgspec.Meta(**bounds)] if bounds else base
    if isinstance(t, mi.DictType):
        key, value = _python_type(t.key_type), _python_type(t.value_type)
        return dict[key, value] if key is not None and value is not None else None  # type: ignore[valid-type]
    if isinstance(t, mi.ListType | mi.VarTupleType):
        item = _python_type(t.item_type)
        return list[item] if item is not None else None  # type: ignore[valid-type]
    return None


def _dict_keys(path: list[str | int], raw: Any, info: mi.Type) -> list[str | int]:
    """Replace each ``[...]`` (msgspec does not name dict keys) by the first key whose value does not convert."""
    for i, seg in enumerate(path):
        if seg != "...":
            continue
        table, t = _value_at(raw, path[:i]), _type_at(info, raw, path[:i])
        t = _unwrap(t) if t is not None else None
        value_type = _python_type(t.value_type) if isinstance(t, mi.DictType) else None
        if not isinstance(table, dict) or value_type is None:
            return path
        for key, value in table.items():
            try:
                msgspec.convert(value, value_type)
            except msgspec.ValidationError:
                path = [*path[:i], str(key), *path[i + 1:]]
                break
        else:
            return path
    return path


# ------------------------------------------------------------------------------------------------------
# unknown keys of dataclass tables (msgspec ignores them)


def _check_dataclass_keys(raw: Any, t: mi.Type, path: tuple[str | int, ...], where: str,
                          error: type[Exception]) -> None:
    resolved = _resolve(t, raw)
    if resolved is None:
        return
    t = resolved
    if isinstance(t, mi.DataclassType) and isinstance(raw, dict):
        known = {f.encode_name for f in t.fields}
        for key in raw:
            if key not in known:
                kind = f"table [{_format_path([*path, key])}]" if isinstance(raw[key], dict) else "key"
                names = ", ".join(sorted(known)) or "none"
                raise error(f"{where} {_format_path([*path, key])}: unknown {kind} (known: {names})")
    fields = _fields(t)
    if fields is not None and isinstance(raw, dict):
        for f in fields:
            if f.encode_name in raw:
                _check_dataclass_keys(raw[f.encode_name], f.type, (*path, f.encode_name), where, error)
    elif isinstance(t, mi.ListType | mi.VarTupleType) and isinstance(raw, list):
        for i, item in enumerate(raw):
            _check_dataclass_keys(item, t.item_type, (*path, i), where, error)
    elif isinstance(t, mi.DictType) and isinstance(raw, dict):
        for key, item in raw.items():
            _check_dataclass_keys(item, t.value_type, (*path, key), where, error)
