"""Access to torchgen's parsed native_functions.yaml (shipped in the torch wheel)."""

from __future__ import annotations

import functools
import os

import torchgen
from torchgen.gen import parse_native_yaml
from torchgen.model import NativeFunction


def packaged_yaml_dir() -> str:
    return os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")


@functools.lru_cache(maxsize=None)
def native_functions() -> dict[str, NativeFunction]:
    """Every aten operator by its overload name, e.g. ``"add.Tensor"``."""
    d = packaged_yaml_dir()
    parsed = parse_native_yaml(
        os.path.join(d, "native_functions.yaml"), os.path.join(d, "tags.yaml")
    )
    return {str(f.func.name): f for f in parsed.native_functions}
