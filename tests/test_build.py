"""The build backend (build_backend.py): torch is a build requirement only when the
environment being installed into lacks torch==2.13.0."""

import os
import subprocess
import sys
import textwrap
import tomllib

import pytest

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hook(name: str, site: str | None = None) -> list[str]:
    """Runs a PEP 517 hook as pip does: in a fresh interpreter, the backend found
    through pyproject.toml's backend-path. With `site`, sysconfig names `site` as
    the target's site-packages (a target without torch, or with another one) and
    torch cannot be imported, as in pip's isolated environment before the hook
    has asked for it."""
    fake_target = "" if site is None else textwrap.dedent(f"""
        import sys, sysconfig
        sys.modules["torch"] = None
        _get_paths = sysconfig.get_paths
        sysconfig.get_paths = lambda *a, **k: {{**_get_paths(*a, **k), "purelib": {site!r}, "platlib": {site!r}}}
    """)
    code = fake_target + textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        import build_backend
        print(repr(build_backend.{name}()))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(out.stdout)


def test_pyproject_names_the_backend():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        system = tomllib.load(f)["build-system"]
    assert (system["build-backend"], system["backend-path"]) == ("build_backend", ["."])
    # torch comes from get_requires_for_build_*, never unconditionally.
    assert not [r for r in system["requires"] if r.startswith("torch")]


@pytest.mark.parametrize("name", ["get_requires_for_build_editable", "get_requires_for_build_wheel"])
def test_torch_of_the_target_is_used(name):
    # This environment holds torch 2.13.0: the build uses it instead of installing another.
    requires = hook(name)
    assert not [r for r in requires if r.startswith("torch")], requires


@pytest.mark.parametrize("name", ["get_requires_for_build_editable", "get_requires_for_build_wheel"])
def test_a_target_without_torch_gets_it_in_the_build_environment(name, tmp_path):
    assert "torch==2.13.0" in hook(name, str(tmp_path))


def test_a_target_with_another_torch_gets_the_pinned_one(tmp_path):
    dist = tmp_path / "torch-2.12.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    assert "torch==2.13.0" in hook("get_requires_for_build_editable", str(tmp_path))
    # A local label (+cpu) is the same release.
    (tmp_path / "torch-2.12.0.dist-info").rename(tmp_path / "torch-2.13.0+cpu.dist-info")
    (tmp_path / "torch-2.13.0+cpu.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    assert "torch==2.13.0" not in hook("get_requires_for_build_editable", str(tmp_path))


# docs/architecture.md's layers, bottom first: a unit includes nothing from a higher one.
LAYERS = [
    ("runtime",),
    ("device", "memory", "operators", "amp", "profiler", "compiler", "graphs", "ipc", "distributed"),
    ("kernels",),
    ("generated",),
    ("python",),
]


def test_layers_only_look_down():
    rank = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
    csrc = os.path.join(ROOT, "csrc")
    upward = []
    for folder, _, files in os.walk(csrc):
        top = os.path.relpath(folder, csrc).split(os.sep)[0]
        if top == ".":
            continue
        for name in files:
            with open(os.path.join(folder, name)) as f:
                for line in f:
                    included = line.removeprefix("#include \"").split("/")[0] if line.startswith("#include \"") else None
                    if included is None:
                        continue
                    # The generated declarations of the yaml's kernels are the kernels' own interface.
                    target = "kernels" if included.startswith("OpenRegNativeFunctions") else included.rstrip('"\n')
                    if rank.get(target, -1) > rank[top]:
                        upward.append(f"csrc/{os.path.relpath(os.path.join(folder, name), csrc)}: {line.strip()}")
    assert not upward, "includes that look up (docs/architecture.md):\n" + "\n".join(upward)
