"""Builds torch_openreg._C with torch.utils.cpp_extension.

Before compiling, `python -m codegen` turns backend_functions.yaml into C++
under build/generated (rewritten only when the yaml's output changes).
"""

import glob
import os
import subprocess
import sys

# Importing torch would autoload an installed torch_openreg; a stale or broken
# _C from an earlier build must not stop this build.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from setuptools import find_packages, setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join("build", "generated")


def run_codegen() -> None:
    cmd = [
        sys.executable, "-m", "codegen",
        "--source-yaml", "backend_functions.yaml",
        "--output-dir", GENERATED,
    ]
    subprocess.run(cmd, cwd=ROOT, check=True)


def sources() -> list[str]:
    hand_written = sorted(glob.glob("csrc/**/*.cpp", recursive=True, root_dir=ROOT))
    generated = sorted(glob.glob(os.path.join(GENERATED, "*.cpp"), root_dir=ROOT))
    return hand_written + generated


class BuildWithCodegen(BuildExtension):
    def run(self) -> None:
        run_codegen()
        # The generated files exist only now.
        for ext in self.extensions:
            ext.sources = sources()
        super().run()


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
    (docs/testing.md, "Sanitizers"): (compile flags, link flags)."""
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
    extra_compile_args={"cxx": ["-O2", *openmp, *dispatch_stub_abi, *sanitize_compile]},
    extra_link_args=[*openmp, *sanitize_link],
)

setup(
    packages=find_packages(include=["torch_openreg", "torch_openreg.*"]),
    ext_modules=[extension],
    cmdclass={"build_ext": BuildWithCodegen.with_options(use_ninja=True)},
)
