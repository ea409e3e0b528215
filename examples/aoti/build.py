"""Builds run_package (run_package.cpp) against the installed torch and torch_openreg.

    python examples/aoti/build.py [output]

torch_openreg._C is a Python extension, so the program also links libtorch_python
and libpython, whose symbols _C refers to; it does not start an interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import torch.utils.cpp_extension as cpp_extension
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def openreg_library() -> str:
    """torch_openreg/_C*.so, found without importing torch_openreg."""
    import importlib.util

    spec = importlib.util.find_spec("torch_openreg")
    assert spec is not None and spec.origin is not None, "torch_openreg is not installed"
    package = os.path.dirname(spec.origin)
    return os.path.join(package, "_C" + sysconfig.get_config_var("EXT_SUFFIX"))


def command(output: str) -> list[str]:
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    python_lib = sysconfig.get_config_var("LIBDIR")
    python = f"python{sysconfig.get_config_var('py_version_short')}"
    library = openreg_library()
    return [
        os.environ.get("CXX", "c++"),
        os.path.join(HERE, "run_package.cpp"),
        "-o", output,
        "-std=c++20", "-O1",
        *[f"-I{d}" for d in cpp_extension.include_paths()],
        # Keep _C although main() calls none of its functions: its static
        # initialisers register openreg.
        "-Wl,--no-as-needed",
        f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
        "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python",
        # _C has no soname: given by path, it is recorded by path.
        library,
        f"-L{python_lib}", f"-Wl,-rpath,{python_lib}", f"-l{python}",
    ]


def main() -> int:
    output = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "run_package")
    cmd = command(output)
    print(" ".join(cmd))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
