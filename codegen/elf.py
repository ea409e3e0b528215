"""A read-only view of a 64-bit little-endian ELF shared library (libtorch_cpu):
its sections, symbols, GOT relocations and code bytes.

The codegen asks libtorch_cpu which stubs have a CPU kernel (codegen/stubs.py)
and which stubs CPU's structured impl()s call (codegen/stub_calls.py). The
library has some 75,000 dynamic symbols and 500,000 in its full table, so
symbols are found by scanning the string tables with a regular expression and
the symbol tables as flat word arrays, never one Python object per symbol.
Layouts from elf.h (Elf64_Ehdr, Elf64_Shdr, Elf64_Sym, Elf64_Rela).
"""

from __future__ import annotations

import functools
import itertools
import mmap
import re
import struct
from dataclasses import dataclass

EM_X86_64 = 62
_STT_FUNC = 2
_R_X86_64_GLOB_DAT = 6  # a GOT slot that holds a symbol's address


@dataclass(frozen=True)
class Section:
    name: str
    addr: int
    offset: int
    size: int
    link: int  # for a symbol table, the index of its string table


class SymbolTable:
    """A symbol table as flat lists of its Elf64_Sym fields (24 bytes: name,
    info, other, section index, value, size)."""

    def __init__(self, data: mmap.mmap, section: Section, strings: Section) -> None:
        view = memoryview(data)[section.offset : section.offset + section.size]
        words = view.cast("Q")
        self.value: list[int] = words[1::3].tolist()
        self.size: list[int] = words[2::3].tolist()
        self._info = view.cast("B")[4::24]
        self._section = view.cast("H")[3::12]
        self._name = view.cast("I")[0::6]
        self._data = data
        self._strings = strings.offset
        # A view, not a copy: the full table's strings take 76 MB in libtorch_cpu.
        self.strings = memoryview(data)[strings.offset : strings.offset + strings.size]

    def name(self, i: int) -> bytes:
        start = self._strings + self._name[i]
        return self._data[start : self._data.find(b"\0", start)]

    def is_function(self, i: int) -> bool:
        return self._info[i] & 0xF == _STT_FUNC and self.size[i] > 0

    def defined_matching(self, pattern: bytes) -> dict[bytes, int]:
        """The defined symbols whose whole name matches `pattern`, by name."""
        at = {m.start(): m.group(0) for m in re.finditer(rb"(?<=\0)(?:" + pattern + rb")(?=\0)", self.strings)}
        offsets = self._name.tolist()
        return {
            at[offsets[i]]: i
            for i in itertools.compress(range(len(offsets)), map(at.__contains__, offsets))
            if self._section[i] != 0  # SHN_UNDEF: defined in another library
        }

    def functions_at(self, addresses: set[int]) -> dict[int, int]:
        """Address -> index of the function symbol that starts there, for
        those of `addresses` where one does."""
        found: dict[int, int] = {}
        for i in itertools.compress(range(len(self.value)), map(addresses.__contains__, self.value)):
            if self.is_function(i):
                found.setdefault(self.value[i], i)
        return found


class SharedLibrary:
    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self.data[:6] != b"\x7fELF\x02\x01":
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        (self.machine,) = struct.unpack_from("<H", self.data, 0x12)
        (shoff,) = struct.unpack_from("<Q", self.data, 0x28)
        entsize, count, names = struct.unpack_from("<HHH", self.data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", self.data, shoff + i * entsize) for i in range(count)]
        strings = raw[names][4]
        self.sections = [
            Section(self.data[strings + r[0] : self.data.find(b"\0", strings + r[0])].decode(), r[3], r[4], r[5], r[6])
            for r in raw
        ]
        self.by_name = {s.name: s for s in self.sections}

    @functools.cached_property
    def dynamic_symbols(self) -> SymbolTable:
        section = self.by_name[".dynsym"]
        return SymbolTable(self.data, section, self.sections[section.link])

    @functools.cached_property
    def symbols(self) -> SymbolTable | None:
        """The full symbol table (static functions included); None if stripped."""
        section = self.by_name.get(".symtab")
        return None if section is None else SymbolTable(self.data, section, self.sections[section.link])

    def got_slots(self, symbols: set[int]) -> dict[int, int]:
        """Address of the GOT slot -> dynamic symbol index, for the slots that
        hold the address of one of `symbols` (x86-64 relocations)."""
        section = self.by_name[".rela.dyn"]
        words = memoryview(self.data)[section.offset : section.offset + section.size].cast("Q")
        want = {(i << 32) | _R_X86_64_GLOB_DAT for i in symbols}
        info = words[1::3].tolist()
        slot = words[0::3].tolist()
        return {slot[k]: info[k] >> 32 for k in itertools.compress(range(len(info)), map(want.__contains__, info))}

    def code(self, addr: int, size: int) -> bytes:
        text = self.by_name[".text"]
        start = addr - text.addr + text.offset
        return self.data[start : start + size]


@functools.lru_cache(maxsize=None)
def shared_library(path: str) -> SharedLibrary:
    return SharedLibrary(path)
