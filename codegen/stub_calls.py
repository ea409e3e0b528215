"""The DispatchStubs CPU's structured impl()s call, read from libtorch_cpu's
machine code.

torch's headers declare the stubs (codegen/stubs.py) but do not say which ones
an impl() calls, and the names do not tell: CPU's impl() of linalg_cross.out
calls cross_stub, that of scatter.value_out scatter_fill_stub. A stub call
(`cross_stub(device_type, ...)`, ATen/native/DispatchStub.h) loads the stub
object's address, from its GOT slot since libtorch_cpu exports the object, and
passes it to DispatchStubImpl::get_call_ptr: the stubs a function calls are the
stub objects its code addresses. impl()s often call them from helpers
(allany_impl, argmax_argmin_impl, addmm_impl_cpu_), so direct calls into other
at::native functions are followed.

objdump (binutils, like the nm the build already needs) disassembles the bytes
of those functions only, copied into one small file: disassembling the library
itself would read all of its 400 MB. x86-64 only; elsewhere `impl_stub_calls`
returns None and the codegen falls back to the stubs named after the group.

Not seen: a stub called through a function pointer, or from an exported
function that the impl() calls through the PLT (none in torch 2.13); nor a call
with an explicit kCPU, which inlines the CPU kernel's pointer rather than
addressing the stub, and never reaches PrivateUse1 anyway.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import subprocess
import tempfile

from codegen.elf import EM_X86_64, SharedLibrary, shared_library
from codegen.stubs import declared_stubs, torch_lib_dir

# Callees worth following: at::native's functions and the lambdas inside them,
# not the DispatchStub machinery every stub call goes through.
_FOLLOW = (b"_ZN2at6native", b"_ZZN2at6native")
_MACHINERY = (b"_ZN2at6native12DispatchStub", b"_ZN2at6native16DispatchStubImpl")
# Objects of at::native and the namespaces inside it (the stubs among them).
_OBJECT = rb"_ZN2at6native\w+E"
# The impl() of a structured class of at::native: _ZN2at6native27structured_linalg_cross_out4implE...
_IMPL = rb"_ZN2at6native\d+structured_\w+?4implE\w*"
# The lines of objdump's listing that matter: a call or jump to an address, and
# a RIP-relative operand, whose address objdump writes after '#'.
_REFERENCE = re.compile(
    rb"^ *([0-9a-f]+):\t(?:(?:call|j[a-z]+) +0x([0-9a-f]+)$|[^\n#]*# 0x([0-9a-f]+))", re.M
)
_LENGTH = re.compile(r"\d+")


def mangled(qualified: str) -> bytes:
    """The Itanium mangling of a namespace-scope object: at::native::cross_stub
    is _ZN2at6native10cross_stubE."""
    return ("_ZN" + "".join(f"{len(part)}{part}" for part in qualified.split("::")) + "E").encode()


def impl_class(name: bytes) -> str:
    """`at::native::structured_neg_out` from the mangled name of its impl()."""
    text, parts, i = name.decode(), [], 3
    while (m := _LENGTH.match(text, i)) is not None:
        end = m.end() + int(m.group(0))
        parts.append(text[m.end() : end])
        i = end
    assert parts[-1] == "impl", name
    return "::".join(parts[:-1])


@functools.lru_cache(maxsize=None)
def impl_stub_calls(lib_dir: str | None = None) -> dict[str, frozenset[str]] | None:
    """For each structured class with an impl() in libtorch_cpu
    (`at::native::structured_linalg_cross_out`), the names of the stubs its
    impl() calls, itself or through at::native helpers. None where the
    library cannot be read this way (not x86-64, no objdump)."""
    lib = shared_library(os.path.join(lib_dir or torch_lib_dir(), "libtorch_cpu.so"))
    if lib.machine != EM_X86_64:
        return None
    dynsym = lib.dynamic_symbols
    # The full table has the static helpers too; a stripped library only its exports.
    funcs = lib.symbols or dynsym

    # Where code reads a stub's address from: its GOT slot, or the object
    # itself where the linker resolved the reference within the library.
    by_mangled = {mangled(d.qualified_name): d.name for d in declared_stubs().values()}
    objects = {n: i for n, i in dynsym.defined_matching(_OBJECT).items() if n in by_mangled}
    stub_at = {dynsym.value[i]: by_mangled[name] for name, i in objects.items()}
    stub_of_symbol = {i: by_mangled[name] for name, i in objects.items()}
    stub_at.update({slot: stub_of_symbol[i] for slot, i in lib.got_slots(set(stub_of_symbol)).items()})

    impls = {name: i for name, i in dynsym.defined_matching(_IMPL).items() if dynsym.is_function(i)}
    # Breadth first from the impl()s, one objdump run per level.
    refs: dict[int, tuple[set[str], set[int]]] = {}
    level = {dynsym.value[i]: dynsym.size[i] for i in impls.values()}
    while level:
        found = _disassemble(lib, sorted(level.items()), stub_at)
        if found is None:
            return None
        refs.update(found)
        targets = {t for _, calls in found.values() for t in calls if t not in refs}
        level = {}
        for addr, i in funcs.functions_at(targets).items():
            name = funcs.name(i)
            if name.startswith(_FOLLOW) and not name.startswith(_MACHINERY):
                level[addr] = funcs.size[i]

    def reached(addr: int) -> frozenset[str]:
        seen, todo, stubs = {addr}, [addr], set()
        while todo:
            direct, calls = refs[todo.pop()]
            stubs |= direct
            for t in calls:
                if t in refs and t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(stubs)

    result: dict[str, frozenset[str]] = {}
    for name, i in impls.items():
        cls = impl_class(name)
        result[cls] = result.get(cls, frozenset()) | reached(dynsym.value[i])
    return result


def _disassemble(
    lib: SharedLibrary, functions: list[tuple[int, int]], stub_at: dict[int, str]
) -> dict[int, tuple[set[str], set[int]]] | None:
    """For each function (address, size): the stubs its code addresses and the
    addresses it calls or jumps to outside itself. The functions' bytes go
    into one file back to back, so that one objdump run decodes them all; its
    addresses are offsets in that file, mapped back to the library's."""
    starts, offset = [], 0
    with tempfile.NamedTemporaryFile(prefix="openreg-impls-", suffix=".bin", delete=False) as f:
        for addr, size in functions:
            f.write(lib.code(addr, size))
            starts.append(offset)
            offset += size
    try:
        out = subprocess.run(
            ["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "-w", "--no-show-raw-insn", f.name],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    finally:
        os.unlink(f.name)
    found: dict[int, tuple[set[str], set[int]]] = {addr: (set(), set()) for addr, _ in functions}
    for m in _REFERENCE.finditer(out):
        at, jump, operand = m.groups()
        k = bisect.bisect_right(starts, int(at, 16)) - 1
        addr, size = functions[k]
        stubs, calls = found[addr]
        if operand is not None:
            stub = stub_at.get(int(operand, 16) + addr - starts[k])
            if stub is not None:
                stubs.add(stub)
        else:
            target = int(jump, 16) + addr - starts[k]
            if not addr <= target < addr + size:
                calls.add(target)
    return found
