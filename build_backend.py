"""The PEP 517 build backend (pyproject.toml): setuptools', with torch made a
build requirement only when the environment being installed into lacks it.

pip builds in an isolated environment and installs the build requirements
into it, afresh for every build: for torch 2.13.0 that is 760 MB unpacked and
about 16 of the 25 s a `pip install -e .` with nothing to recompile takes.
The extension must be compiled against the torch it will be loaded with, and
when the target environment already holds exactly torch==2.13.0 that is the
one to use: this backend then leaves torch out of the build requirements and
puts the target's site-packages at the end of sys.path, so that setuptools,
ninja and pyyaml still come from the isolated environment and only what it
does not hold (torch and its dependencies) from the target. Without
torch==2.13.0 in the target (a fresh venv, `pip wheel .` elsewhere) the build
is isolated as usual, torch included.
"""

import sys
import sysconfig
from importlib import metadata

from setuptools.build_meta import *  # noqa: F401,F403  (the hooks this module does not change)

TORCH = "torch==2.13.0"


def target_site_packages() -> list[str]:
    """The site-packages of the environment pip installs into if they hold
    torch==2.13.0 (any local label, e.g. +cpu), else []. pip runs the hooks
    with that environment's interpreter, so sysconfig names its directories;
    pip's isolation only takes them off sys.path."""
    paths = list(dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")))
    version = TORCH.split("==")[1]
    for dist in metadata.distributions(name="torch", path=paths):
        if dist.version.split("+")[0] == version:
            return paths
    return []


_target = target_site_packages()
for _path in _target:
    if _path not in sys.path:
        sys.path.append(_path)


# setup.py declares no setup_requires: setuptools' own get_requires hooks would
# run it only to find none, and it cannot run (it imports torch) before the
# requirements returned here are installed.
def get_requires_for_build_wheel(config_settings=None):
    return [] if _target else [TORCH]


get_requires_for_build_editable = get_requires_for_build_wheel
get_requires_for_build_sdist = get_requires_for_build_wheel
