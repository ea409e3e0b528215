"""Builds torch_openreg._C with torch.utils.cpp_extension.

Before compiling, `python -m codegen` turns backend_functions.yaml into C++
under build/generated (rewritten only when the yaml's output changes).

Builds are incremental, also under `pip install -e .`: objects go to
build/temp (not the temporary directory pip's isolated build would use), and
torch's headers are read from a copy under build/torch-headers, so that the
compile commands and the headers' times stay the same from one isolated build
environment to the next and ninja recompiles only what changed.
"""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

# Importing torch would autoload an installed torch_openreg; a stale or broken
# _C from an earlier build must not stop this build.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# ninja would run cores + 2 compilers at once; one per core builds faster here
# (2 cores: 92-94 s against 100 s).
os.environ.setdefault("MAX_JOBS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()))

from setuptools import find_packages, setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join("build", "generated")
BUILD_TEMP = os.path.join(ROOT, "build", "temp")
TORCH_HEADERS = os.path.join(ROOT, "build", "torch-headers")
UNITY = os.path.join(ROOT, "build", "unity")


def torch_build() -> str:
    """The torch build this extension compiles against: its version and git revision."""
    import torch

    return f"{torch.__version__} {torch.version.git_version}"


def stamp_is(path: str, text: str) -> bool:
    """Whether the stamp file `path` holds `text` (what its outputs were made from)."""
    try:
        with open(path) as f:
            return f.read() == text
    except OSError:
        return False


def write_stamp(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def codegen_inputs() -> str:
    """A digest of what the generated code is made from: the yaml, the code
    generator (its modules and C++ templates), and torch (torchgen and its
    native_functions.yaml)."""
    digest = hashlib.sha256(torch_build().encode())
    generator = glob.glob("codegen/**/*.py", root_dir=ROOT, recursive=True) + glob.glob("codegen/templates/*", root_dir=ROOT)
    for path in ["backend_functions.yaml", *sorted(generator)]:
        with open(os.path.join(ROOT, path), "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    return digest.hexdigest()


def run_codegen() -> None:
    """Runs the code generator (`python -m codegen`, 3 s) unless its inputs are
    those of the files already in build/generated. It runs in this process:
    under pip it finds torchgen only on this process's sys.path, which may hold
    the target environment's torch (build_backend.py)."""
    stamp = os.path.join(ROOT, GENERATED, ".inputs")
    inputs = codegen_inputs()
    if stamp_is(stamp, inputs):
        return
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from codegen.cli import main

    args = ["--source-yaml", os.path.join(ROOT, "backend_functions.yaml"), "--output-dir", os.path.join(ROOT, GENERATED)]
    if main(args) != 0:
        raise SystemExit(f"python -m codegen {' '.join(args)} failed (its message is above)")
    write_stamp(stamp, inputs)


def sources() -> list[str]:
    hand_written = sorted(glob.glob("csrc/**/*.cpp", recursive=True, root_dir=ROOT))
    generated = sorted(glob.glob(os.path.join(GENERATED, "*.cpp"), root_dir=ROOT))
    return hand_written + generated


# ninja starts units in the order it is given them (distutils sorts the
# sources by name); a long unit started last ends the build alone. These take
# longest (seconds with the precompiled header, one unit alone): the structured
# shards 10-12, the other generated registrations, the bindings (Module.cpp) and
# autocast 6-9; every other unit 1-5.
LONGEST_FIRST = ("build/generated/RegisterStructured_", "build/generated/", "csrc/python/Module.cpp",
                 "csrc/amp/OpenRegAutocast.cpp", "")


def compile_order(source: str) -> int:
    relative = os.path.relpath(os.path.join(ROOT, source), ROOT)
    return next(i for i, prefix in enumerate(LONGEST_FIRST) if relative.startswith(prefix))


# Units compiled at -O1, about a fifth less CPU than at -O2 (docs/development.md): the
# generated registrations, whose wrappers mostly call the hand-written code
# (benchmarks/bench_ops.py --size small times them the same either way), and
# the units off the operators' path (bindings, distributed, profiler, compiler
# support, IPC, graphs). The kernels, the launch, the allocator and the runtime
# stay at -O2.
LESS_OPTIMISED = ("build/generated/", "csrc/python/", "csrc/distributed/", "csrc/profiler/", "csrc/compiler/",
                  "csrc/ipc/", "csrc/graphs/")


def optimised_less(source: str) -> bool:
    return os.path.relpath(os.path.join(ROOT, source), ROOT).startswith(LESS_OPTIMISED)


# Units compiled together as one translation unit (a unity build), up to four
# of one folder (one layer: docs/architecture.md). Each translation unit costs
# about 3 s before its own code (loading the precompiled header, instantiating
# the templates every unit uses), as much as a small kernel file's code: a clean
# build takes a quarter less CPU, and a rebuild after an edit recompiles the
# edited file's unity file (docs/development.md).
UNITS_PER_UNITY = 4
# File-scope lines that would change the units after them in one translation
# unit; a unit with one is compiled alone.
LEAKS = re.compile(r"^\s*#\s*pragma\s+GCC\b|^using\s+namespace\b", re.M)
DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)
UNDEF = re.compile(r"^\s*#\s*undef\s+(\w+)", re.M)


def compiled_alone(source: str) -> bool:
    with open(os.path.join(ROOT, source)) as f:
        text = f.read()
    return bool(LEAKS.search(text)) or bool(set(DEFINE.findall(text)) - set(UNDEF.findall(text)))


def unity_files(units: list[str], directory: str) -> list[tuple[str, list[str]]]:
    """(file to compile, the units it holds) for `units`, in their order (the
    longest first): unity files written under `directory` (rewritten only when
    their text changes: ninja goes by file times), or a unit itself. A folder's
    units go round-robin, so that its longest ones go to different files."""
    together = [u for u in units if not compiled_alone(u)]
    groups = [[u] for u in units if u not in together]
    for folder in dict.fromkeys(os.path.dirname(u) for u in together):
        members = [u for u in together if os.path.dirname(u) == folder]
        count = -(-len(members) // UNITS_PER_UNITY)
        groups += [members[i::count] for i in range(count)]
    result = []
    for group in sorted(groups, key=lambda g: units.index(g[0])):
        if len(group) == 1:
            result.append((group[0], group))
            continue
        name = f"unity_{together.index(group[0])}.cpp"
        path = os.path.join(directory, os.path.dirname(group[0]), name)
        text = "// Written by setup.py: units compiled as one translation unit.\n" + "".join(
            f'#include "{os.path.join(ROOT, u)}"\n' for u in group)
        if not stamp_is(path, text):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_stamp(path, text)
        result.append((os.path.relpath(path, ROOT), group))
    return result


def with_cxx_args(extra_postargs, args: list[str]):
    """extra_postargs (a dict of per-language flags, or a list) with `args` after the C++ ones."""
    if isinstance(extra_postargs, dict):
        return {**extra_postargs, "cxx": [*extra_postargs["cxx"], *args]}
    return [*extra_postargs, *args]


INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes_any(source: str, headers: set[str], project_dirs: list[str]) -> bool:
    """Whether `source` includes one of `headers`, itself or through the
    project's own headers (those found beside the includer or in project_dirs)."""
    seen, pending = set(), [os.path.join(ROOT, source)]
    while pending:
        path = pending.pop()
        with open(path) as f:
            for name in INCLUDE.findall(f.read()):
                if name in headers:
                    return True
                for d in (os.path.dirname(path), *project_dirs):
                    local = os.path.join(d, name)
                    if os.path.isfile(local):
                        if local not in seen:
                            seen.add(local)
                            pending.append(local)
                        break
    return False


def link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows it (torch's 9,400 headers in
    0.3 s instead of 4), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def stable_torch_headers(include_dirs: list[str]) -> list[str]:
    """include_dirs with torch's include directory replaced by its copy under
    build/torch-headers, made once per torch build. pip installs torch afresh
    into every isolated build environment, at another path and with new file
    times, which would make ninja recompile every unit."""
    import torch

    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    version = torch_build() + "\n"
    stamp = os.path.join(TORCH_HEADERS, ".torch-version")
    if not stamp_is(stamp, version):
        shutil.rmtree(TORCH_HEADERS, ignore_errors=True)
        shutil.copytree(torch_include, TORCH_HEADERS, copy_function=link_or_copy)
        write_stamp(stamp, version)
    return [
        TORCH_HEADERS + d[len(torch_include):] if d == torch_include or d.startswith(torch_include + os.sep) else d
        for d in include_dirs
    ]


def depfile_inputs(path: str) -> list[str]:
    """The prerequisites a compiler's -MMD depfile lists."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    return text.split(":", 1)[1].split()


class PrecompiledHeader:
    """csrc/precompiled.h, precompiled with the very command line ninja compiles
    the units with (torch.utils.cpp_extension: unix_wrap_ninja_compile), into
    <build_temp>/pch. GCC takes the .gch beside the header it is told to
    include; a .gch built from other flags would be refused (-Winvalid-pch says
    so). It is rebuilt when its command or one of the headers it read changes.
    The units' depfiles do not list it, nor the headers it holds (GCC leaves
    out what came precompiled), so their command names it instead: a macro
    (-DOPENREG_PRECOMPILED=<digest>) that changes with the header's command,
    its text and torch's build, and makes ninja recompile every unit that uses
    it when any of them changes. Other compilers, or a header that does not
    compile, get no -include (same results, slower)."""

    def __init__(self, compiler, output_dir, macros, include_dirs, debug, extra_preargs, extra_postargs):
        cxx = compiler.compiler_so[0]
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
        self.supported = "Free Software Foundation" in version and "clang" not in version
        _, _, _, pp_opts, _ = compiler._setup_compile(output_dir, macros, include_dirs, [], None, extra_postargs)
        # -std is among them (extra_compile_args), so ninja's command adds none.
        post = list(extra_postargs["cxx"] if isinstance(extra_postargs, dict) else extra_postargs)
        self.source = os.path.join(ROOT, "csrc", "precompiled.h")
        self.header = os.path.join(output_dir, "pch", "precompiled.h")
        self.gch = self.header + ".gch"
        self.stamp = self.gch + ".command"
        self.command = [*compiler.compiler_so, *compiler._get_cc_args(pp_opts, debug, extra_preargs),
                        "-x", "c++-header", self.header, "-o", self.gch, "-MMD", "-MF", self.gch + ".d", *post]
        self.process = None

    def headers(self) -> set[str]:
        """The torch headers it precompiles."""
        with open(self.source) as f:
            return set(INCLUDE.findall(f.read()))

    def current(self) -> bool:
        try:
            return stamp_is(self.stamp, json.dumps(self.command)) and all(
                os.path.getmtime(d) < os.path.getmtime(self.gch)
                for d in [self.source, *depfile_inputs(self.gch + ".d")] if d != self.header)
        except OSError:
            return False

    def start(self) -> bool:
        """Starts precompiling the header if it is out of date; False if there
        is nothing to do (or no precompiling with this compiler)."""
        if not self.supported or self.current():
            return False
        os.makedirs(os.path.dirname(self.header), exist_ok=True)
        for stale in (self.gch, self.stamp):
            if os.path.exists(stale):
                os.remove(stale)
        shutil.copyfile(self.source, self.header)
        print(f"precompiling {os.path.relpath(self.source, ROOT)}", flush=True)
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return True

    def cancel(self) -> None:
        """Stops a build of the header still running (after an error)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def args(self) -> list[str]:
        """Waits for the header to be precompiled; the units' extra arguments
        that use it."""
        if not self.supported:
            return []
        if self.process is not None:
            output, _ = self.process.communicate()
            if self.process.returncode != 0:
                print(f"warning: {os.path.relpath(self.source, ROOT)} did not precompile, building without it:\n"
                      f"{output[-2000:]}", flush=True)
                self.supported = False
                return []
            write_stamp(self.stamp, json.dumps(self.command))
            self.process = None
        with open(self.source, "rb") as f:
            digest = hashlib.sha256(f"{json.dumps(self.command)}\0{torch_build()}\0".encode() + f.read())
        # GCC accepts a precompiled header under a macro the header does not use.
        return ["-include", self.header, "-Winvalid-pch", f"-DOPENREG_PRECOMPILED={digest.hexdigest()[:16]}"]


class BuildWithCodegen(BuildExtension):
    def finalize_options(self) -> None:
        # Unless given (--build-temp), build_temp would come from the build
        # command, which pip's editable build points at a temporary directory:
        # the objects and ninja's log must outlive the build.
        if self.build_temp is None:
            self.build_temp = BUILD_TEMP
        super().finalize_options()

    def run(self) -> None:
        run_codegen()
        # The generated files exist only now.
        for ext in self.extensions:
            ext.sources = sources()
            ext.include_dirs = stable_torch_headers(ext.include_dirs)
        super().run()

    def build_extension(self, ext) -> None:
        # BuildExtension has made self.compiler.compile write and run ninja by
        # now, and added its flags to ext: the header is precompiled with them.
        compile_sources = self.compiler.compile

        def compile_with_precompiled_header(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                                            extra_preargs=None, extra_postargs=None, depends=None):
            pch = PrecompiledHeader(self.compiler, output_dir, macros, include_dirs, debug, extra_preargs,
                                    extra_postargs)
            # Units that include none of the precompiled headers compile
            # faster without it (loading it costs 1-1.5 s). They compile while
            # it is being built, one compiler per core beside it (the header
            # takes one core for less time than they take), with a ninja
            # directory of their own (each ninja log keeps to its outputs).
            project_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, GENERATED)]
            headers = pch.headers()
            early = [s for s in sources if not includes_any(s, headers, project_dirs)]
            rest = sorted((s for s in sources if s not in early), key=compile_order)

            def compile_groups(units, directory, postargs) -> dict[str, str]:
                """Compiles `units`, in unity files, into `directory`, the
                LESS_OPTIMISED ones first (they hold the longest), at -O1, in a
                ninja directory of their own: each unit's object."""
                objects = {}
                for group, subdirectory, flags in (([s for s in units if optimised_less(s)], "O1", ["-O1"]),
                                                   ([s for s in units if not optimised_less(s)], "", [])):
                    if group:
                        unity = unity_files(group, os.path.join(UNITY, os.path.relpath(directory, output_dir),
                                                                subdirectory))
                        built = compile_sources([f for f, _ in unity], os.path.join(directory, subdirectory), macros,
                                                include_dirs, debug, extra_preargs, with_cxx_args(postargs, flags),
                                                depends)
                        objects.update((u, o) for (_, members), o in zip(unity, built) for u in members)
                return objects

            pch.start()
            try:
                objects = compile_groups(early, os.path.join(output_dir, "no-pch"), extra_postargs)
                pch_args = pch.args()
            finally:
                pch.cancel()
            objects.update(compile_groups(rest, output_dir, with_cxx_args(extra_postargs, pch_args)))
            # Linked in the sources' order, as before the split.
            return list(dict.fromkeys(objects[s] for s in sources))

        self.compiler.compile = compile_with_precompiled_header
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_sources


openmp = ["-fopenmp"]
# libtorch is built with the AVX2 and AVX512 kernels, and DispatchStub's layout
# depends on these macros (ATen/native/DispatchStub.h): code that calls or
# registers a stub must see the same layout, or loading fails on an undefined
# DispatchStubImpl::get_call_ptr.
dispatch_stub_abi = ["-DHAVE_AVX2_CPU_DEFINITION", "-DHAVE_AVX512_CPU_DEFINITION"]


def kineto_include_dir() -> str:
    # csrc/profiler plugs into Kineto, whose headers ship with torch.
    for path in include_paths():
        kineto = os.path.join(path, "kineto")
        if os.path.isfile(os.path.join(kineto, "libkineto.h")):
            return kineto
    raise SystemExit(
        "torch_openreg needs Kineto's headers (torch/include/kineto/libkineto.h) for its profiler, "
        "and this torch has none: install a torch wheel built with USE_KINETO=1 (the official ones are)."
    )



SANITIZERS = ("address", "undefined")


def sanitizer_flags() -> tuple[list[str], list[str]]:
    """OPENREG_SANITIZE=address,undefined builds an instrumented extension
    (docs/integration/testing.md, "Sanitizers"): (compile flags, link flags)."""
    value = os.environ.get("OPENREG_SANITIZE", "").strip()
    if not value:
        return [], []
    wanted = [s.strip() for s in value.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SANITIZERS]
    if unknown:
        raise SystemExit(
            f"OPENREG_SANITIZE={value!r}: unknown sanitizer {', '.join(unknown)}; "
            f"use a comma-separated subset of {','.join(SANITIZERS)}"
        )
    flags = [f"-fsanitize={','.join(wanted)}", "-fno-omit-frame-pointer", "-g"]
    if "undefined" in wanted:
        # vptr checks every polymorphic object the extension touches, most of
        # them libtorch's, which is not instrumented; the other UBSan checks
        # (overflow, shifts, alignment, bounds, null, enums, ...) cover openreg's
        # own code. UBSAN_OPTIONS=halt_on_error=1 makes a report end the process.
        flags.append("-fno-sanitize=vptr")
    # -O1 keeps the reports' stack traces close to the source.
    return ["-O1", *flags], flags


sanitize_compile, sanitize_link = sanitizer_flags()
extension = CppExtension(
    name="torch_openreg._C",
    sources=sources(),
    include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, GENERATED), kineto_include_dir()],
    # -g0: no debug information (Python's own flags ask for -g); it doubled the
    # extension's size and cost a third of the compile time.
    extra_compile_args={"cxx": ["-std=c++20", "-O2", "-g0", *openmp, *dispatch_stub_abi, *sanitize_compile]},
    extra_link_args=[*openmp, *sanitize_link],
)

setup(
    packages=find_packages(include=["torch_openreg", "torch_openreg.*"]),
    ext_modules=[extension],
    cmdclass={"build_ext": BuildWithCodegen.with_options(use_ninja=True)},
)
