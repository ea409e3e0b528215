"""docs/adding_an_op.md, followed step by step: the yaml and the check are read from
the document, the rebuild compiles the code the codegen generates for that yaml into
an extension of its own (linked to torch_openreg._C), loaded in a fresh process."""

import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

import torch_openreg
from torch_openreg import info

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "adding_an_op.md")
# Under build/ (ignored by git) so that a second run finds the objects up to date.
WORK = os.path.join(ROOT, "build", "tutorial")
OP = "aten::renorm.out"

# One pytest-xdist worker runs the module: the extension is built once, in WORK.
pytestmark = pytest.mark.xdist_group("adding_an_op")


def block(marker: str, language: str) -> str:
    """The fenced block that follows `<!-- adding_an_op:MARKER ... -->` in the doc."""
    text = open(DOC, encoding="utf-8").read()
    m = re.search(rf"<!-- adding_an_op:{marker}\b[^>]*-->\s*```{language}\n(.*?)```", text, re.S)
    assert m, f"docs/adding_an_op.md has no {language} block marked adding_an_op:{marker}"
    return m.group(1)


def printed(marker: str) -> tuple[str, list[str]]:
    """A block of printed output in the doc: its `$ command` (or "") and the lines it shows."""
    lines = block(marker, "").rstrip("\n").splitlines()
    command = lines.pop(0)[2:] if lines and lines[0].startswith("$ ") else ""
    return command, lines


def assert_printed(marker: str, output: str) -> None:
    """The doc's lines appear in `output` in order, spaces collapsed; "..." stands for any lines."""
    def norm(line):
        return " ".join(line.split())
    actual = [norm(line) for line in output.splitlines()]
    at = 0
    for line in printed(marker)[1]:
        if line.strip() == "...":
            continue
        want = norm(line)
        assert want in actual[at:], f"docs/adding_an_op.md ({marker}) prints {line!r}, which the run does not:\n{output}"
        at = actual.index(want, at) + 1


def shell(command: str, **env: str) -> str:
    """Runs a documented command with this interpreter as `python`, from the repository."""
    command = re.sub(r"(^|\s)python(?=\s)", lambda m: m.group(1) + sys.executable, command)
    result = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **env))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def codegen(source: str, output: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "codegen", "--source-yaml", source, "--output-dir", output,
         "--csrc-dir", os.path.join(ROOT, "csrc"), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def snippet() -> dict:
    return yaml.safe_load(block("yaml", "yaml"))


def test_step1_the_operator_starts_on_the_fallback():
    # If the project binds it natively one day, the tutorial needs another operator.
    (report,) = info.operator_report("renorm.out")
    assert report["category"] == "fallback", report


def test_step1_the_printed_report_and_trace_are_what_the_commands_print():
    for marker in ("info_before", "trace_before"):
        command, _ = printed(marker)
        assert_printed(marker, shell(command))


def test_step3_the_snippet_is_valid_in_the_project_yaml(snippet, tmp_path):
    project = yaml.safe_load(open(os.path.join(ROOT, "backend_functions.yaml"), encoding="utf-8"))
    for section, entries in snippet.items():
        project[section].extend(entries)
    merged = tmp_path / "backend_functions.yaml"
    merged.write_text(yaml.safe_dump(project, sort_keys=False))
    result = codegen(str(merged), str(tmp_path / "generated"), "--dry-run", "--list")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if "renorm" in line}
    assert listed["aten::renorm.out"] == ["structured", "at::native::structured_renorm_out"]
    assert listed["aten::renorm"] == ["structured", "at::native::structured_renorm_out"]
    assert listed["at::native::renorm_scale_factor_stub"][0] == "stub_cpu_kernel"
    assert_printed("list", result.stdout)


@pytest.fixture(scope="module")
def extension(snippet) -> str:
    """Step 4: the code generated for the snippet, built like the project builds its own."""
    os.makedirs(WORK, exist_ok=True)
    source = os.path.join(WORK, "tutorial.yaml")
    # The project's yaml gives CPU's kernel to every iterator stub (renorm's
    # impl() calls renorm_scale_factor_stub); _C registers them already, so the
    # extension leaves out RegisterStubs.cpp.
    config = {"cpp_namespace": "openreg::native", **snippet, "stubs": {"cpu_kernels": True},
              "fallback": {"global": False}}
    with open(source, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    generated = os.path.join(WORK, "generated")
    result = codegen(source, generated)
    assert result.returncode == 0, result.stderr
    # The files that register something; the others define what _C already defines.
    sources = sorted(
        os.path.join(generated, name) for name in os.listdir(generated)
        if name.endswith(".cpp") and name != "RegisterStubs.cpp" and re.search(
            r"TORCH_LIBRARY_IMPL|REGISTER_PRIVATEUSE1_DISPATCH|RouteRegistration",
            open(os.path.join(generated, name)).read())
    )
    lib = torch_openreg._C.__file__
    options = dict(
        name="openreg_tutorial",
        sources=sources,
        extra_include_paths=[os.path.join(ROOT, "csrc"), generated],
        extra_cflags=["-O2", "-DHAVE_AVX2_CPU_DEFINITION", "-DHAVE_AVX512_CPU_DEFINITION"],
        extra_ldflags=[lib, f"-Wl,-rpath,{os.path.dirname(lib)}"],
        build_directory=WORK,
        is_python_module=False,
    )
    # load() also loads the library: in a process of its own, so that this
    # one's kernels and route table stay the project's for the other tests.
    result = subprocess.run(
        [sys.executable, "-c", f"from torch.utils.cpp_extension import load\nprint(load(**{options!r}))"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def run_with(extension: str, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_SHOW_DISPATCH_TRACE="1")
    prelude = f"import torch\ntorch.ops.load_library({extension!r})\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_step5_info_reports_the_operator_native(extension):
    command, _ = printed("info_after")
    argv = command.split()[3:]  # after "python -m torch_openreg"
    result = run_with(extension, f"import runpy, sys\nsys.argv = {['torch_openreg', *argv]!r}\n"
                                 "runpy.run_module('torch_openreg', run_name='__main__')")
    assert_printed("info_after", result.stdout)


def test_step5_the_check_passes_and_the_trace_shows_the_kernel_and_its_stub(extension):
    result = run_with(extension, block("check", "python"))
    assert result.stdout.strip().endswith("renorm is native")
    trace = result.stderr.splitlines()
    i = trace.index(
        "[call] op=[aten::renorm], key=[PrivateUse1] -> structured at::native::structured_renorm_out"
    )
    nested = []
    for line in trace[i + 1:]:
        if not line.startswith(" "):
            break
        nested.append(line)
    assert printed("trace_after")[1] == [trace[i], *nested]
    assert not any(f"op=[{OP}]" in line and "-> fallback" in line for line in trace)
