"""The code generator: golden output for a fixture yaml, and yaml errors that
name the file and line and write nothing."""

import os
import subprocess
import sys
import textwrap

import pytest

from codegen.cli import main, run
from codegen.emit import generate
from codegen.load import load, load_text
from codegen.model import YamlError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(HERE, "fixture.yaml")
GOLDEN = os.path.join(HERE, "golden")


def test_fixture_generates_golden_files():
    """Regenerate with: python -m codegen --source-yaml tests/codegen/fixture.yaml --output-dir tests/codegen/golden"""
    files = generate(load(FIXTURE))
    assert sorted(files) == sorted(os.listdir(GOLDEN))
    for name, content in files.items():
        with open(os.path.join(GOLDEN, name), encoding="utf-8") as f:
            assert content == f.read(), f"{name} differs from its golden file"


def test_project_yaml_binds_every_required_operator():
    bound = load(os.path.join(ROOT, "backend_functions.yaml")).binding_of()
    required = [
        "empty.memory_format", "empty_strided", "as_strided", "view", "_reshape_alias", "resize_",
        "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "set_.source_Tensor",
        "set_.source_Storage", "set_.source_Storage_storage_offset",
    ]
    for op in required:
        assert bound.get(op, "").startswith("wrapper ->"), op


def test_second_run_rewrites_nothing(tmp_path):
    first = run(FIXTURE, str(tmp_path))
    assert len(first) == 3
    mtimes = {p: os.stat(p).st_mtime_ns for p in first}
    assert run(FIXTURE, str(tmp_path)) == []
    assert {p: os.stat(p).st_mtime_ns for p in first} == mtimes


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "gen"
    assert main(["--source-yaml", FIXTURE, "--output-dir", str(out), "--dry-run"]) == 0
    assert not out.exists()


def test_list_shows_each_binding(capsys):
    assert main(["--source-yaml", FIXTURE, "--list"]) == 0
    text = capsys.readouterr().out
    assert "view" in text and "wrapper -> demo::native::view_symint" in text
    assert "mm" in text and "fallback (per operator)" in text
    assert 'blocked: no "pinned" memory here' in text
    assert "(every other operator: no kernel)" in text


def write(tmp_path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


ERROR_CASES = [
    # (yaml, line, message fragment)
    ("cpp_namespace: n\nkernels:\n  - op: add.Tensr\n    kernel: k\n", 3,
     "unknown operator 'add.Tensr'"),
    ("cpp_namespace: n\nkernels:\n  - op: add\n    kernel: k\n", 3, "Name an overload"),
    ("cpp_namespace: n\nkernels:\n  - op: view\n    kernal: k\n", 4, "unknown key 'kernal'"),
    ("cpp_namespace: n\nkernels:\n  - op: view\n", 3, "needs the key 'kernel'"),
    ("cpp_namespace: n\nkernels:\n  - op: view\n    kernel: k\n    symint: yes please\n", 5,
     "'symint' in a kernels entry must be true or false"),
    ("cpp_namespace: n\nkernels:\n  - op: view\n    kernel: 2k\n", 4, "is not a C++ function name"),
    ("cpp_namespace: n\nkernels:\n  - op: view\n    kernel: a\n  - op: view\n    kernel: b\n", 5,
     "'view' is already bound in kernels at line 3"),
    ("cpp_namespace: n\nkernel:\n  - op: view\n", 2, "unknown key 'kernel' in the file. Did you mean 'kernels'"),
    ("kernels: []\n", 1, "needs the key 'cpp_namespace'"),
    ("cpp_namespace: 'a b'\n", 1, "is not a C++ namespace"),
    ("cpp_namespace: n\nkernels: {op: view}\n", 2, "'kernels' in the file must be a list"),
    ("cpp_namespace: n\nkernels:\n  - view\n", 2, "each entry of 'kernels' must be a mapping"),
    ("cpp_namespace: n\nfallback:\n  blocklist:\n    - op: mm\n", 4, "needs the key 'reason'"),
    ("cpp_namespace: n\nfallback:\n  global: maybe\n", 3, "'global' in fallback must be true or false"),
    ("cpp_namespace: n\nkernels:\n  - op: mm\n    kernel: k\nfallback:\n  blocklist:\n    - op: mm\n      reason: r\n", 7,
     "'mm' is already bound in kernels at line 3"),
    ("cpp_namespace: n\ncpp_namespace: m\n", 2, "key 'cpp_namespace' appears twice"),
    ("cpp_namespace: n\nkernels: [\n", 3, "invalid YAML"),
    ("# only a comment\n", 1, "the file is empty"),
    ("- just\n- a list\n", 1, "the file must be a mapping"),
]


@pytest.mark.parametrize("text,line,fragment", ERROR_CASES)
def test_yaml_errors_name_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(YamlError) as info:
        load(path)
    assert info.value.loc.file == path
    assert info.value.loc.line == line, str(info.value)
    assert fragment in info.value.message


def test_unknown_operator_suggests_close_names():
    with pytest.raises(YamlError, match=r"Did you mean 'add.Tensor'"):
        load_text("cpp_namespace: n\nkernels:\n  - op: add.Tensr\n    kernel: k\n", "x.yaml")


def test_cli_reports_error_without_traceback_and_writes_nothing(tmp_path):
    path = write(tmp_path, "cpp_namespace: n\nkernels:\n  - op: no_such_op\n    kernel: k\n")
    out = tmp_path / "gen"
    result = subprocess.run(
        [sys.executable, "-m", "codegen", "--source-yaml", path, "--output-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:3: error: unknown operator 'no_such_op'")
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_missing_file_is_a_clean_error(tmp_path):
    with pytest.raises(YamlError, match="cannot read the file"):
        load(str(tmp_path / "absent.yaml"))
