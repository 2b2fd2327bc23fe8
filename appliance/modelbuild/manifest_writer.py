"""Write ``model.toml`` (format_version 1, see :mod:`appliance.manifest`) from plain data, with ``tomli-w``.

``tomli-w`` escapes every string TOML needs escaped (tabs, quotes, backslashes, newlines, control characters)
and quotes keys that are not bare. Floats are rounded to 6 significant digits first, so rebuilding with equal
metrics writes equal text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

__all__ = ["dumps", "header_of", "write_manifest"]


def _rounded(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, float):
        return v if not math.isfinite(v) else float(f"{v:.6g}")
    if isinstance(v, Mapping):
        return {str(k): _rounded(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_rounded(x) for x in v]
    return v


def dumps(data: Mapping[str, Any], header: str = "") -> str:
    """Return ``data`` as TOML text, preceded by ``header`` lines as comments."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    body = tomli_w.dumps(_rounded(data))
    return ("\n".join(lines) + "\n" if lines else "") + body


def header_of(toml_text: str) -> str:
    """Return the comment lines at the top of a manifest's text, as :func:`dumps` takes them back."""
    return "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                     for line in toml_text.splitlines() if line.startswith("#"))


def write_manifest(path: Path, data: Mapping[str, Any], header: str = "") -> None:
    """Write the manifest ``data`` to ``path`` as TOML."""
    path.write_text(dumps(data, header), encoding="utf-8")
