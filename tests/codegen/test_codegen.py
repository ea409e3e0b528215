"""The code generator: golden output for a fixture yaml, and yaml errors that
name the file and line and write nothing."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from codegen.cli import main, run
from codegen.emit import generate
from codegen.emit.routes import bindings
from codegen.load import load, load_text
from codegen.cpp import NATIVE_HEADER
from codegen.model import Route, YamlError
from codegen.stubs import torch_include_dir

# The stubs an impl() calls are read from x86-64 code (codegen/stub_calls.py);
# elsewhere only those named after the group are checked.
X86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="reads libtorch_cpu's x86-64 code")

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

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
    bound = {b.name: b for b in bindings(load(os.path.join(ROOT, "backend_functions.yaml")))}
    required = [
        "empty.memory_format", "empty_strided", "as_strided", "view", "_reshape_alias", "resize_",
        "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "set_.source_Tensor",
        "set_.source_Storage", "set_.source_Storage_storage_offset",
    ]
    for op in required:
        assert bound[f"aten::{op}"].route is Route.kernel, op


def test_second_run_rewrites_nothing(tmp_path):
    first = run(FIXTURE, str(tmp_path))
    assert len(first) == 11
    mtimes = {p: os.stat(p).st_mtime_ns for p in first}
    assert run(FIXTURE, str(tmp_path)) == []
    assert {p: os.stat(p).st_mtime_ns for p in first} == mtimes


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "gen"
    assert main(["--source-yaml", FIXTURE, "--output-dir", str(out), "--dry-run"]) == 0
    assert not out.exists()


def test_list_shows_each_binding_with_its_route(capsys):
    assert main(["--source-yaml", FIXTURE, "--list"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith("("):
            name, route, *detail = line.split(maxsplit=2)
            rows[name] = (route, detail[0] if detail else "")
    assert rows["aten::view"] == ("kernel", "demo::native::view_symint")
    assert rows["aten::mm"] == ("fallback", "")
    assert rows["aten::_pin_memory"] == ("blocked", 'no "pinned" memory here')
    assert rows["aten::neg_"] == ("structured", "at::native::structured_neg_out")
    assert rows["aten::max.dim"] == ("structured", "at::native::structured_max_out")
    assert rows["aten::bmm.out"] == ("structured_impl", "demo::native::bmm_out")
    assert rows["aten::_softmax"] == ("structured_on_cpu_aliases", "at::native::structured_softmax_cpu_out")
    assert rows["at::native::fill_stub"] == ("stub_kernel", "demo::native::fill_kernel")
    assert rows["at::native::add_stub"] == ("stub_cpu_kernel", "demo::native::CpuKernelOf<&add_stub>::run")
    assert rows["openreg::scale"] == ("custom_op", "demo::native::scale")
    assert rows["aten::cat"] == ("cpu_kernel", "at::cpu::cat")
    # Every route the fixture can name appears, in the one vocabulary.
    assert {route for route, _ in rows.values()} == {r.value for r in Route} - {
        "nested_fallback",
        "nested_blocked",
        "sparse_fallback",
        "sparse_blocked",
    }


def test_every_stub_that_takes_an_iterator_gets_cpus_kernel():
    """stubs.cpu_kernels: derived from torch's headers and libtorch_cpu's
    symbols, not listed in the yaml."""
    cfg = load(FIXTURE)
    cpu = {st.decl.name for st in cfg.stubs if st.route is Route.stub_cpu_kernel}
    assert {"add_stub", "exp_stub", "renorm_scale_factor_stub"} <= cpu
    assert "neg_stub" not in cpu  # the yaml names an openreg kernel for it
    assert "normal_stub" not in cpu and "max_stub" not in cpu  # tensors, not an iterator
    assert "random_stub" not in cpu  # takes a Generator: CPU's kernel would use CPU's generator
    assert "min_elementwise_stub" not in cpu  # declared, but libtorch_cpu has no CPU kernel for it


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
    ("cpp_namespace: n\n? [a, b]\n: 1\n", 2, "a key must be a plain word such as 'op', got a list"),
    ("cpp_namespace: n\nkernels:\n  - ? {op: view}\n    : k\n", 3, "a key must be a plain word such as 'op', got a mapping"),
    ("cpp_namespace: !!binary aGk=\n", 1, "'cpp_namespace' in the file must be a string, got the bytes b'hi'"),
    ("cpp_namespace: n\nkernels:\n  - op: 2001-02-03\n    kernel: k\n", 3,
     "'op' in a kernels entry must be a string, got the date datetime.date(2001, 2, 3)"),
    ("cpp_namespace: n\nkernels:\n  - op: mm\n    kernel: k\n    autograd: true\n", 5,
     "'mm' has no CompositeImplicitAutograd kernel: autograd: true registers"),
    # structured
    ("cpp_namespace: n\nstructured:\n  - op: abs.out\n", 3,
     "'abs.out' is not the out= operator of a structured group"),
    ("cpp_namespace: n\nstructured:\n  - op: add.Tensor\n", 3,
     "It delegates to the structured 'add.out': name that instead"),
    ("cpp_namespace: n\nstructured:\n  - op: eq.Tensor\n", 3, "delegates to the structured 'eq.Tensor_out'"),
    ("cpp_namespace: n\nstructured:\n  - op: sort.values\n", 3, "Structured operators named sort: sort.values_stable."),
    ("cpp_namespace: n\nstructured:\n  - op: abs\n", 3, "No operator named abs is structured"),
    ("cpp_namespace: n\nstructured:\n  - op: neg.out\n    kernel: k\n", 4, "unknown key 'kernel' in a structured entry"),
    ("cpp_namespace: n\nstructured:\n  - op: neg.out\n    impl: 3\n", 4, "'impl' in a structured entry must be a string"),
    ("cpp_namespace: n\nstructured:\n  - op: neg.out\n    on_cpu_aliases: yes please\n", 4,
     "'on_cpu_aliases' in a structured entry must be true or false"),
    ("cpp_namespace: n\nstructured:\n  - op: bmm.out\n    impl: bmm_out\n    on_cpu_aliases: true\n", 5,
     "'bmm.out' names an openreg 'impl', which takes device tensors"),
    ("cpp_namespace: n\nstructured:\n  - op: nll_loss_forward.output\n    on_cpu_aliases: true\n", 4,
     "takes 'weight' of type Tensor?"),
    ("cpp_namespace: n\nstructured:\n  - op: neg.out\n    host_impl: true\n", 4,
     "'host_impl' is now 'on_cpu_aliases'"),
    ("cpp_namespace: n\nstructured:\n  - op: cumsum.out\n", 3,
     "'cumsum.out': CPU's impl() calls at::native::cumsum_stub (ATen/native/ReduceOps.h)"),
    ("cpp_namespace: n\nstructured:\n  - op: sort.values_stable\n", 3,
     "calls at::native::sort_stub"),
    # The stubs an impl() calls are read from libtorch_cpu's code: linalg_cross's
    # is not named after it, all.out's impl() calls its stub from a helper.
    pytest.param("cpp_namespace: n\nstubs:\n  cpu_kernels: true\nstructured:\n  - op: neg.out\n  - op: linalg_cross.out\n", 6,
                 "'linalg_cross.out': CPU's impl() calls at::native::cross_stub (ATen/native/Cross.h), which takes "
                 "(const Tensor&, const Tensor&, const Tensor&, const int64_t) rather than a TensorIterator, so it "
                 "needs an openreg kernel: add '- {stub: cross_stub, kernel: ...}' under stubs.kernels (a function "
                 "in n with the stub's parameter types)", marks=X86_64),
    pytest.param("cpp_namespace: n\nstructured:\n  - op: all.out\n", 3,
                 "'all.out': CPU's impl() calls at::native::and_stub (ATen/native/ReduceOps.h), which has no openreg "
                 "kernel: set 'cpu_kernels: true' under 'stubs'", marks=X86_64),
    ("cpp_namespace: n\nstructured:\n  - op: add.out\n", 3,
     "'add.out': CPU's impl() calls at::native::add_stub (ATen/native/BinaryOps.h), which has no openreg kernel: "
     "set 'cpu_kernels: true' under 'stubs' (CPU's kernel of every stub that takes a TensorIterator, on device "
     "memory) or add '- {stub: add_stub, kernel: ...}' under stubs.kernels"),
    ("cpp_namespace: n\nkernels:\n  - op: neg\n    kernel: k\nstructured:\n  - op: neg.out\n", 6,
     "'neg' is already bound in kernels at line 3"),
    # cpu_kernels
    ("cpp_namespace: n\ncpu_kernels:\n  - op: linear\n", 3,
     "'linear' cannot run a CPU kernel on openreg: it is CompositeImplicitAutograd"),
    ("cpp_namespace: n\ncpu_kernels:\n  - op: transpose.int\n", 3, "returns a view of its input"),
    ("cpp_namespace: n\ncpu_kernels:\n  - op: _foreach_add_.Scalar\n", 3, "writes the tensor list 'self'"),
    ("cpp_namespace: n\ncpu_kernels:\n  - op: set_.source_Storage\n", 3, "takes a Storage ('source')"),
    ("cpp_namespace: n\ncpu_kernels:\n  - op: mm\n    kernel: k\n", 4, "unknown key 'kernel' in a cpu_kernels entry"),
    ("cpp_namespace: n\ncpu_kernels:\n  - op: mm\nfallback:\n  ops:\n    - op: mm\n", 6,
     "'mm' is already bound in cpu_kernels at line 3"),
    # stubs
    ("cpp_namespace: n\nstubs:\n  kernels:\n    - stub: neg_stb\n      kernel: k\n", 4, "Did you mean 'neg_stub'"),
    ("cpp_namespace: n\nstubs:\n  kernels:\n    - stub: neg_stub\n", 4, "needs the key 'kernel'"),
    ("cpp_namespace: n\nstubs:\n  kernels:\n    - stub: neg_stub\n      kernel: a\n    - stub: neg_stub\n      kernel: b\n", 6,
     "stub 'neg_stub' already has a kernel at line 4"),
    ("cpp_namespace: n\nstubs:\n  kernels:\n    - stub: [neg_stub]\n      kernel: k\n", 4,
     "'stub' in a stubs.kernels entry must be a string"),
    ("cpp_namespace: n\nstubs:\n  kernels:\n    - stub: neg_stub\n      cpu_kernel: true\n", 5,
     "stubs no longer take 'cpu_kernel: true'"),
    ("cpp_namespace: n\nstubs:\n  - stub: neg_stub\n    kernel: k\n", 2, "'stubs' is a mapping"),
    ("cpp_namespace: n\nstubs:\n  cpu_kernels: sometimes\n", 3, "'cpu_kernels' in stubs must be true or false"),
    # custom operators
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor self -> Tensor'\n    kernel: k\n    meta: m\n", 3,
     "invalid operator schema"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'ns::f(Tensor self) -> Tensor'\n    kernel: k\n    meta: m\n", 3,
     "write the schema without a namespace"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor self) -> Tensor'\n    kernel: k\n", 3,
     "needs the key 'meta'"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor self) -> Tensor'\n    kernel: k\n    meta: m\n"
     "    backward: f_bwd\n", 3, "backward 'f_bwd' of 'f' is not a custom operator in this file"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor self) -> Tensor'\n    kernel: k\n    meta: m\n"
     "    backward: g\n  - schema: 'g(Tensor grad, Tensor other) -> Tensor'\n    kernel: k\n    meta: m\n", 7,
     "argument 'other' of backward 'g' is neither 'grad', 'result' nor an argument of 'f'"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor a, Tensor b) -> Tensor'\n    kernel: k\n    meta: m\n"
     "    backward: g\n  - schema: 'g(Tensor grad) -> Tensor'\n    kernel: k\n    meta: m\n", 7,
     "must return one Tensor per Tensor argument of 'f' (a, b): 2 Tensors, got (Tensor)"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor a, int[] s) -> Tensor'\n    kernel: k\n    meta: m\n"
     "    backward: g\n  - schema: 'g(Tensor grad, int[] s) -> Tensor'\n    kernel: k\n    meta: m\n", 7,
     "needs 's' of type int[], which the generated autograd function cannot save"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor a) -> (Tensor, Tensor)'\n    kernel: k\n    meta: m\n"
     "    backward: g\n  - schema: 'g(Tensor grad) -> Tensor'\n    kernel: k\n    meta: m\n", 3,
     "must be functional and return one Tensor"),
    ("cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor a) -> Tensor'\n    kernel: k\n    meta: m\n"
     "  - schema: 'f(Tensor b) -> Tensor'\n    kernel: k\n    meta: m\n", 6, "custom operator 'f' is declared twice"),
    ("cpp_namespace: n\nfallback:\n  global: false\n  nested: true\n", 4, "'nested: true' needs 'global: true'"),
    ("cpp_namespace: n\nfallback:\n  nested: yes please\n", 3, "'nested' in fallback must be true or false"),
    ("cpp_namespace: n\nfallback:\n  cpu_results:\n    - op: _nested_tensor_size\n    - op: _nested_tensor_size\n",
     5, "'_nested_tensor_size' is listed twice in fallback.cpu_results"),
]


@pytest.mark.parametrize("text,line,fragment", ERROR_CASES)
def test_yaml_errors_name_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(YamlError) as info:
        load(path)
    assert info.value.loc.file == path
    assert info.value.loc.line == line, str(info.value)
    assert fragment in info.value.message


KERNELS_CPP = """
#include "OpenRegNativeFunctions.h"
namespace n {
void neg_kernel(at::TensorIterator& iter) {}
void add_kernel(at::TensorIteratorBase& iter, const at::Scalar& alpha) {}
at::Tensor view_impl(const at::Tensor& self, at::IntArrayRef size) { return self; }
// at::Tensor commented_out(const at::Tensor& self) { return self; }
}
"""


def definition_error(tmp_path, text: str) -> YamlError:
    csrc = tmp_path / "csrc"
    csrc.mkdir(exist_ok=True)
    (csrc / "kernels.cpp").write_text(KERNELS_CPP)
    path = write(tmp_path, text)
    with pytest.raises(YamlError) as info:
        load(path, str(csrc))
    return info.value


def test_stub_kernel_with_other_parameter_types_is_an_error(tmp_path):
    err = definition_error(tmp_path, "cpp_namespace: n\nstubs:\n  kernels:\n    - stub: neg_stub\n      kernel: neg_kernel\n")
    assert err.loc.line == 4
    assert err.message.startswith(
        "kernel 'neg_kernel' cannot serve 'neg_stub': the stub's type unary_fn (ATen/native/UnaryOps.h) takes "
        "(TensorIteratorBase&) but 'neg_kernel' takes (TensorIterator&)"
    )


def test_kernel_that_no_file_defines_is_an_error(tmp_path):
    err = definition_error(tmp_path, "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: view_kernel\n")
    assert err.loc.line == 3
    assert "kernel 'view_kernel' is not defined in any file under" in err.message


def test_a_commented_out_definition_does_not_count(tmp_path):
    err = definition_error(tmp_path, "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: commented_out\n")
    assert "kernel 'commented_out' is not defined" in err.message


def test_a_kernel_defined_in_a_file_without_the_generated_header_is_an_error(tmp_path):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernels.cpp").write_text(KERNELS_CPP.replace('#include "OpenRegNativeFunctions.h"\n', ""))
    with pytest.raises(YamlError) as info:
        load(write(tmp_path, "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: view_impl\n"), str(csrc))
    assert info.value.loc.line == 3
    assert info.value.message.startswith(
        "kernel 'view_impl' is defined in kernels.cpp, which does not include the generated "
        "OpenRegNativeFunctions.h: include it there, so that the compiler checks the definition"
    )


def compile_against_generated_header(tmp_path, yaml_text: str, source: str) -> subprocess.CompletedProcess:
    """Compiles (syntax only, as setup.py's C++ standard) one unit that includes
    the OpenRegNativeFunctions.h generated for `yaml_text`."""
    (tmp_path / NATIVE_HEADER).write_text(generate(load(write(tmp_path, yaml_text)))[NATIVE_HEADER])
    (tmp_path / "unit.cpp").write_text(source)
    include = torch_include_dir()
    return subprocess.run(
        [os.environ.get("CXX", "c++"), "-std=c++20", "-fsyntax-only", f"-I{tmp_path}", f"-I{include}",
         f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}", str(tmp_path / "unit.cpp")],
        capture_output=True, text=True, timeout=300,
    )


def test_a_kernel_with_other_parameter_types_than_its_declaration_does_not_compile(tmp_path):
    """Without the header's pragma the mismatched definition is an overload:
    the unit compiles, the registration's call of the declared reshape_alias
    links against nothing, and every `import torch` fails on the autoloaded
    extension's undefined symbol."""
    result = compile_against_generated_header(
        tmp_path,
        "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: view_impl\n  - op: _reshape_alias\n    kernel: reshape_alias\n",
        textwrap.dedent("""
            #include "OpenRegNativeFunctions.h"
            namespace n {
            static int64_t static_helper(int64_t x) { return x; }
            namespace {
            int64_t anonymous_helper(int64_t x) { return x; }
            }
            at::Tensor view_impl(const at::Tensor& self, at::IntArrayRef size) {
              return self.view(static_helper(anonymous_helper(size[0])));
            }
            // The declaration takes IntArrayRef.
            at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
              return self;
            }
            }
        """),
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert "no previous declaration for" in errors[0] and "n::reshape_alias(" in errors[0], errors[0]


def test_structured_impl_must_be_defined(tmp_path):
    err = definition_error(tmp_path, "cpp_namespace: n\nstructured:\n  - op: bmm.out\n    impl: bmm_impl\n")
    assert err.loc.line == 3
    assert "kernel 'bmm_impl' is not defined" in err.message


def test_custom_op_meta_kernel_must_be_defined(tmp_path):
    err = definition_error(
        tmp_path, "cpp_namespace: n\ncustom_ops:\n  - schema: 'f(Tensor self) -> Tensor'\n    kernel: view_impl\n    meta: f_meta\n"
    )
    assert "kernel 'f_meta' is not defined" in err.message


def test_matching_definitions_pass(tmp_path):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernels.cpp").write_text(KERNELS_CPP)
    path = write(tmp_path, "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: view_impl\nstubs:\n"
                 "  kernels:\n    - stub: add_stub\n      kernel: add_kernel\n")
    cfg = load(path, str(csrc))
    assert [st.decl.qualified_name for st in cfg.stubs] == ["at::native::add_stub"]


def test_missing_kernel_directory_is_an_error(tmp_path):
    path = write(tmp_path, "cpp_namespace: n\nkernels:\n  - op: view\n    kernel: k\n")
    with pytest.raises(YamlError, match="does not exist: the codegen checks that every kernel"):
        load(path, str(tmp_path / "nowhere"))


def test_stub_discovery_finds_every_declared_stub_with_its_header():
    from codegen.stubs import declared_stubs

    stubs = declared_stubs()
    assert len(stubs) > 400
    fill = stubs["fill_stub"]  # declared with an inline function pointer type
    assert (fill.namespace, fill.header, fill.params) == (
        "at::native", "ATen/native/Fill.h", ("TensorIterator&", "const Scalar&"))
    assert stubs["add_stub"].params == ("TensorIteratorBase&", "const Scalar&")


@X86_64
def test_the_stubs_an_impl_calls_are_read_from_libtorch_cpu():
    from codegen.stub_calls import impl_stub_calls

    calls = impl_stub_calls()
    assert calls["at::native::structured_neg_out"] == {"neg_stub"}
    assert calls["at::native::structured_linalg_cross_out"] == {"cross_stub"}  # not named after the group
    assert "and_stub" in calls["at::native::structured_all_out"]  # from its helper allany_impl
    assert "scatter_fill_stub" in calls["at::native::structured_scatter_value_out"]
    assert calls["at::native::structured_tril_cpu"] == frozenset()  # CPU loops of its own, no stub


def test_a_structured_group_whose_stubs_have_kernels_loads(tmp_path):
    cfg = load(write(tmp_path, "cpp_namespace: n\nstubs:\n  cpu_kernels: true\n  kernels:\n"
                     "    - {stub: cross_stub, kernel: cross_kernel}\nstructured:\n  - op: linalg_cross.out\n  - op: all.out\n"))
    assert [s.route for s in cfg.structured] == [Route.structured, Route.structured]


def test_without_libtorch_cpus_code_the_stub_named_after_the_group_is_checked(tmp_path, monkeypatch):
    monkeypatch.setattr("codegen.load.impl_stub_calls", lambda: None)
    with pytest.raises(YamlError, match=r"calls at::native::cumsum_stub \(ATen/native/ReduceOps.h\), which takes"):
        load(write(tmp_path, "cpp_namespace: n\nstructured:\n  - op: cumsum.out\n"))
    # What the names cannot tell: cross_stub, and TensorIterator stubs.
    load(write(tmp_path, "cpp_namespace: n\nstructured:\n  - op: linalg_cross.out\n  - op: add.out\n"))


def test_sparse_fallback_is_registered_for_both_sparse_keys(tmp_path):
    """With the global fallback, sparse tensors get the sparse CPU fallback for
    COO (SparsePrivateUse1) and the compressed layouts (SparseCsrPrivateUse1);
    fallback.sparse: false refuses them, and needs no global fallback."""
    cfg = load(write(tmp_path, "cpp_namespace: n\nfallback:\n  global: true\n"))
    assert cfg.fallback.sparse
    text = generate(cfg)["RegisterRoutes.cpp"]
    assert "TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {\n  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::openreg::sparse_fallback>());" in text
    assert "TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {\n  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::openreg::sparse_compressed_fallback>());" in text
    assert "/*sparse_fallback=*/true" in text
    # By name where a composite kernel would hide the sparse CPU kernel.
    assert 'm.impl("values", torch::CppFunction::makeFromBoxedFunction<&::openreg::sparse_fallback>());' in text
    assert 'm.impl("crow_indices", torch::CppFunction::makeFromBoxedFunction<&::openreg::sparse_compressed_fallback>());' in text
    blocked = load(write(tmp_path, "cpp_namespace: n\nfallback:\n  blocklist:\n    - {op: _pin_memory, reason: pinned}\n"))
    assert "_pin_memory" not in {str(f.func.name) for f in blocked.fallback.sparse_ops}
    assert "_pin_memory" in {str(f.func.name) for f in cfg.fallback.sparse_ops}
    off = generate(load(write(tmp_path, "cpp_namespace: n\nfallback:\n  sparse: false\n")))["RegisterRoutes.cpp"]
    assert off.count("&::openreg::refuse_sparse") == 2 and "&::openreg::sparse_fallback" not in off
    with pytest.raises(YamlError, match="'sparse: true' needs 'global: true'"):
        load(write(tmp_path, "cpp_namespace: n\nfallback:\n  global: false\n  nested: false\n  sparse: true\n"))


def test_nested_fallback_is_registered_for_the_key_and_over_composites(tmp_path):
    """With the global fallback, nested tensors get the nested CPU fallback: for
    the NestedTensorPrivateUse1 key, and by name for the operators whose
    NestedTensorCPU kernel a CompositeImplicitAutograd kernel would hide."""
    path = write(tmp_path, "cpp_namespace: n\nfallback:\n  global: true\n")
    cfg = load(path)
    assert cfg.fallback.nested
    assert {"linear", "matmul", "narrow"} <= {str(f.func.name) for f in cfg.fallback.nested_ops}
    text = generate(cfg)["RegisterRoutes.cpp"]
    assert "TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {\n  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::openreg::nested_fallback>());" in text
    assert 'm.impl("linear", torch::CppFunction::makeFromBoxedFunction<&::openreg::nested_fallback>());' in text
    assert "refuse_nested" not in text
    off = generate(load(write(tmp_path, "cpp_namespace: n\nfallback:\n  nested: false\n")))["RegisterRoutes.cpp"]
    assert "&::openreg::refuse_nested" in off and "&::openreg::nested_fallback" not in off


def test_error_cases_cover_every_kind_of_mistake():
    assert len(ERROR_CASES) >= 15


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
