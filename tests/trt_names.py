"""Names a ``tensorrt`` bindings wheel really exports, read from its shared library (no GPU, no import).

The wheel's dynamic symbol table exports only ``PyInit_tensorrt`` and libstdc++ symbols; pybind11 registers
every class, enum member, method and property by a C string literal (``.def("execute_async_v3", ...)``), so
the NUL-terminated identifiers in the ``.rodata`` section (and their suffixes: the linker merges literals by
tail) are a superset of the Python attribute names. A name
missing there cannot be an attribute of the module; that is the check the conformance test makes.
"""

from __future__ import annotations

import re
import struct
import zipfile
from pathlib import Path

__all__ = ["elf_section", "names_in_wheel"]


def elf_section(data: bytes, wanted: str) -> bytes:
    """Return the bytes of section ``wanted`` of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, str_off, _ = header(shstrndx)
    for i in range(shnum):
        name, offset, size = header(i)
        end = data.index(b"\0", str_off + name)
        if data[str_off + name:end].decode() == wanted:
            return data[offset:offset + size]
    raise KeyError(wanted)


def names_in_wheel(wheel: Path) -> set[str]:
    """Identifiers in the ``.rodata`` of the wheel's ``tensorrt*.so``."""
    with zipfile.ZipFile(wheel) as z:
        so = [n for n in z.namelist() if re.search(r"/tensorrt[^/]*\.so$", n)]
        if not so:
            raise FileNotFoundError(f"no tensorrt*.so in {wheel.name}")
        data = z.read(so[0])
    rodata = elf_section(data, ".rodata")
    names: set[str] = set()
    # The linker merges string literals by tail ("Runtime" can be stored as the end of "IRuntime"), so every
    # identifier suffix of an identifier string that ends at a NUL counts.
    for m in re.findall(rb"[A-Za-z0-9_]{1,120}(?=\0)", rodata):
        text = m.decode()
        for i in range(len(text)):
            if re.match(r"[A-Za-z_]", text[i]):
                names.add(text[i:])
    return names
