"""`python -m torch_openreg info`: versions, devices, and what serves each operator."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from torch_openreg import info

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

# One pytest-xdist worker runs the module: the report is a module fixture.
pytestmark = pytest.mark.xdist_group("info_cli")

def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m torch_openreg *args` in this process (info.main, which __main__ runs):
    its exit code and output. The report fixture and the pipe test start the real command."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = info.main(list(args))
        except SystemExit as e:
            code = e.code
    return subprocess.CompletedProcess(["python", "-m", "torch_openreg", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def report() -> dict:
    result = subprocess.run([sys.executable, "-m", "torch_openreg", "info", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def yaml_custom_operators() -> list[str]:
    """The custom operators backend_functions.yaml declares (adding one must
    not break this file)."""
    import yaml

    with open(os.path.join(os.path.dirname(__file__), "..", "backend_functions.yaml")) as f:
        return [entry["schema"].split("(")[0] for entry in yaml.safe_load(f).get("custom_ops") or []]


def test_json_report_counts_every_aten_operator(report):
    assert report["torch"] == torch.__version__
    assert report["aten_operators"] == len(info.operators("aten"))
    assert sum(report["counts"].values()) == report["aten_operators"]
    assert sum(report["native_by_route"].values()) == report["counts"]["native"]
    assert report["counts"]["blocked"] == 1  # _pin_memory
    assert report["custom_operators"] == sorted(f"openreg::{name}" for name in yaml_custom_operators())
    assert "at::native::add_stub" in report["stubs"]["stub_cpu_kernel"]
    assert "at::native::index_stub" in report["stubs"]["stub_kernel"]


def test_json_report_lists_devices_and_memory(report):
    assert [d["index"] for d in report["devices"]] == list(range(torch.openreg.device_count()))
    for d in report["devices"]:
        assert d["memory"]["total"] == torch.openreg.get_device_properties(d["index"]).total_memory
        assert 0 < d["memory"]["free"] <= d["memory"]["total"]


def test_native_count_matches_the_operators_the_yaml_binds(report):
    bound = info.bindings()
    aten_native = {n for n, (route, _) in bound.items() if n.startswith("aten::") and route.name not in ("blocked", "fallback", "stub_kernel", "stub_cpu_kernel")}
    assert report["counts"]["native"] == len(aten_native)


def test_text_report(report):
    result = cli("info")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"torch_openreg {report['torch_openreg']} (torch {torch.__version__})" in out
    assert f"devices: {torch.openreg.device_count()}" in out
    assert "openreg:0" in out
    for category in info.CATEGORIES:
        assert f"  {category:<12}{report['counts'][category]:>6}" in out


@pytest.mark.parametrize(
    "name, category, served_by",
    [
        ("aten::add.Tensor", "native", "structured at::native::structured_ufunc_add_CPU"),
        ("aten::empty.memory_format", "native", "kernel openreg::native::empty_memory_format"),
        ("aten::nan_to_num.out", "fallback", "fallback"),
        ("aten::nan_to_num", "composite", "CompositeExplicitAutograd kernel: runs through other operators"),
        ("aten::linear", "composite", "CompositeImplicitAutograd kernel: runs through other operators"),
        ("aten::_pin_memory", "blocked", "blocked: only CPU tensors can be pinned; call .cpu() first"),
        ("aten::mode.values", "fallback", "fallback (fallback.ops in the yaml)"),
        ("openreg::add_relu", "native", "custom_op openreg::native::add_relu"),
    ],
)
def test_classification(name, category, served_by):
    r = info.classify(name)
    assert (r.category, r.served_by) == (category, served_by)


def test_classification_agrees_with_what_runs():
    # An operator classified "fallback" is counted by fallback_stats when it
    # runs; a "native" one is not.
    a = torch.tensor([-1.0, 2.0], device="openreg")
    torch.openreg.reset_fallback_stats()
    torch.nan_to_num(a)
    torch.neg(a)
    ran = set(torch.openreg.fallback_stats())
    assert ran == {"aten::nan_to_num.out"}
    assert info.classify("aten::nan_to_num.out").category == "fallback"
    assert info.classify("aten::neg").category == "native"


def test_op_shows_the_dispatch_table():
    result = cli("info", "--op", "add.Tensor")
    assert result.returncode == 0, result.stderr
    assert "aten::add.Tensor: native" in result.stdout
    assert "served by: structured at::native::structured_ufunc_add_CPU" in result.stdout
    assert "PrivateUse1 entry: registered at" in result.stdout
    assert "    CPU: registered at" in result.stdout  # the table itself


def test_op_without_overload_lists_each_overload():
    result = cli("info", "--op", "nan_to_num", "--json")
    assert result.returncode == 0, result.stderr
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    assert {"aten::nan_to_num", "aten::nan_to_num.out"} <= set(entries)
    assert entries["aten::nan_to_num.out"]["category"] == "fallback"
    assert "PrivateUse1" in entries["aten::nan_to_num"]["dispatch_table"]


def test_unknown_op_is_a_clean_error():
    result = cli("info", "--op", "no_such_op")
    assert result.returncode == 2
    assert "no operator named 'no_such_op'" in result.stderr
    assert "Traceback" not in result.stderr


def test_fallbacks_lists_the_operators_the_cpu_fallback_serves_by_name(report):
    result = cli("info", "--fallbacks", "--json")
    assert result.returncode == 0, result.stderr
    names = json.loads(result.stdout)
    assert len(names) == report["counts"]["fallback"] and names == sorted(names)
    assert "aten::trace" in names and "aten::add.Tensor" not in names
    text = cli("info", "--fallbacks").stdout.splitlines()
    assert text == names


def test_a_reader_that_stops_early_gets_no_traceback():
    result = subprocess.run(
        f"{sys.executable} -m torch_openreg info --fallbacks | head -1",
        shell=True, capture_output=True, text=True, timeout=300,
    )
    assert result.stdout.startswith("aten::") and result.stderr == ""


def test_help_says_what_the_command_does():
    result = cli("--help")
    assert result.returncode == 0
    assert "What serves each operator on openreg, and the devices." in result.stdout


def test_no_command_shows_usage():
    result = cli()
    assert result.returncode == 2
    assert "usage: python -m torch_openreg" in result.stderr


def test_routes_are_one_vocabulary_in_python_and_cpp():
    """torch_openreg._C.Route (openreg::Route, csrc/operators/OpenRegRoutes.h) and
    codegen.model.Route name the same routes in the same order."""
    from codegen.model import Route

    from torch_openreg import _C

    assert list(_C.Route.__members__) == [r.value for r in Route]
    bound_routes = {route.name for route, _ in info.bindings().values()}
    assert bound_routes <= {r.value for r in Route}
