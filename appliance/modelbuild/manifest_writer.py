"""Write ``model.toml`` (format_version 1, see :mod:`appliance.manifest`) from plain data.

A minimal TOML emitter for the value types the manifest uses: str, bool, int, float, lists of those, and
nested tables. Floats are written with 6 significant digits, so rebuilding with equal metrics writes equal
text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["dumps", "write_manifest"]


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = f"{v:.6g}"
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    """A bare key if TOML allows one, else a quoted key (``"session.x" = ...`` is one key, not a table)."""
    return k if k and all(c.isalnum() or c in "_-" for c in k) and k.isascii() else _scalar(k)


def _table(lines: list[str], prefix: str, table: Mapping[str, Any]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping) and not _is_array_of_tables(v)}
    for k, v in plain.items():
        lines.append(f"{_key(k)} = {_scalar(v)}")
    for k, v in table.items():
        name = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if isinstance(v, Mapping):
            lines.append("")
            lines.append(f"[{name}]")
            _table(lines, name, v)
        elif _is_array_of_tables(v):
            for item in v:
                lines.append("")
                lines.append(f"[[{name}]]")
                _table(lines, name, item)


def _is_array_of_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def dumps(data: Mapping[str, Any], header: str = "") -> str:
    """Return ``data`` as TOML text, preceded by ``header`` lines as comments."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    _table(lines, "", data)
    return "\n".join(lines).strip("\n") + "\n"


def write_manifest(path: Path, data: Mapping[str, Any], header: str = "") -> None:
    """Write the manifest ``data`` to ``path`` as TOML."""
    path.write_text(dumps(data, header), encoding="utf-8")
