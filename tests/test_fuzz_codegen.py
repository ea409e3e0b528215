"""Fuzzing the code generator: random and malformed backend_functions.yaml
documents either load (and then generate C++) or are refused with a YamlError
that names the file and a line: never another exception from inside the codegen.

The documents have the file's structure with random or wrong values (other
types, unknown keys, nonsense and real operator names, stubs and schemas,
operators bound twice), some are then corrupted as text (lines repeated, cut,
or spliced with YAML syntax), and some are arbitrary text. Derandomized and
without an example database, so CI runs the same examples every time.
"""

import os
import string

import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from codegen.cli import main
from codegen.emit import generate
from codegen.load import load_text
from codegen.model import YamlError

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

PATH = "fuzz/backend_functions.yaml"

FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no "explain": it reruns a failure many times
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Real names (so that many documents get past the name checks and reach the
# deeper ones) mixed with near misses and nonsense.
OPS = [
    "view", "add.Tensor", "add.out", "add_.Tensor", "add", "mm", "neg.out", "neg", "max.dim_max", "max.dim",
    "empty.memory_format", "_copy_from", "abs", "abs.out", "sum.IntList_out", "fill_.Scalar", "index.Tensor",
    "_pin_memory", "convolution", "sort.values", "sort.values_stable", "eq.Tensor", "eq.Tensor_out",
    "resize_", "set_.source_Storage", "_foreach_add.List_out", "add.Tensr", "aten::add.Tensor", ".", "",
]
STUBS = ["add_stub", "neg_stub", "max_stub", "fill_stub", "sum_stub", "GeluKernel", "neg_stb", "at::native::add_stub",
         "sub_stub", "", "::"]
SCHEMAS = [
    "f(Tensor self) -> Tensor",
    "f(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "f_backward(Tensor grad, Tensor result, Tensor self, Tensor other, Scalar alpha) -> (Tensor, Tensor)",
    "g(Tensor grad) -> Tensor",
    "g(Tensor a, int[] s) -> Tensor",
    "f(Tensor(a!) self) -> Tensor(a!)",
    "f.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)",
    "f() -> ()",
    "f(Tensor self -> Tensor",
    "ns::f(Tensor self) -> Tensor",
    "f(Tensor? self) -> Tensor[]",
    "(",
    "",
]
KERNEL_NAMES = ["k", "view_impl", "neg_kernel", "add_kernel", "2k", "a b", "k::x", "_"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True), st.text(max_size=12),
)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def field(good):
    """Mostly a plausible value, one time in ten anything at all: documents must
    get past the early checks often enough to reach the later ones."""
    return st.integers(0, 9).flatmap(lambda i: junk if i == 0 else good)


UNKNOWN_KEYS = ["kernal", "reason", "op", "__line__", "extra", "Kernel", ""]


@st.composite
def entry(draw, required: dict, optional: dict):
    if draw(st.integers(0, 19)) == 0:
        return draw(junk)  # an entry that is not a mapping at all
    value = draw(st.fixed_dictionaries(required, optional=optional))
    if draw(st.integers(0, 19)) == 0:
        key = draw(st.sampled_from([k for k in UNKNOWN_KEYS if k not in required and k not in optional]))
        value[key] = draw(junk)
    return value


op_name = st.integers(0, 4).flatmap(
    lambda i: st.text(alphabet=string.ascii_lowercase + "._:", max_size=16) if i == 0 else st.sampled_from(OPS))
identifier = st.one_of(st.sampled_from(KERNEL_NAMES), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True))
boolean = field(st.booleans())

kernel_entry = entry(
    {"op": field(op_name), "kernel": field(identifier)},
    {"symint": boolean, "device_guard": boolean, "device_check": boolean, "handles_conj_neg": boolean},
)
structured_entry = entry({"op": field(op_name)}, {})
stub_entry = entry({"stub": field(st.sampled_from(STUBS))}, {"kernel": field(identifier)})
stubs = entry({}, {"cpu_kernels": boolean, "kernels": field(st.lists(stub_entry, max_size=4))})
custom_entry = entry(
    {"schema": field(st.sampled_from(SCHEMAS)), "kernel": field(identifier), "meta": field(identifier)},
    {"backward": field(st.sampled_from(["g", "f", "f_backward", "h"]))},
)
op_ref = entry({"op": field(op_name)}, {})
blocked = entry({"op": field(op_name), "reason": field(st.text(max_size=10))}, {})


def section(items):
    return field(st.lists(items, max_size=4))


fallback = entry(
    {},
    {"global": boolean, "ops": section(op_ref), "cpu_tensor_args": section(op_ref), "blocklist": section(blocked)},
)

NAMESPACES = ["openreg::native", "n", "n::m"] * 4 + ["a b", "::x", "x::"]
documents = entry(
    {"cpp_namespace": field(st.sampled_from(NAMESPACES))},
    {
        "kernels": section(kernel_entry),
        "structured": section(structured_entry),
        "stubs": stubs,
        "custom_ops": section(custom_entry),
        "fallback": fallback,
    },
)

SYNTAX = ["\n", ":", ": ", "- ", "[", "]", "{", "}", "&a ", "*a", "!!binary ", "!!python/object ", "? ", "\t",
          "'", '"', "#", "---\n", "%YAML 1.1\n", "\x00", "\ufeff", "  ", ",", "|", ">"]


@st.composite
def yaml_texts(draw):
    how = draw(st.sampled_from(["document", "document", "corrupted", "text"]))
    if how == "text":
        return "".join(draw(st.lists(st.sampled_from(SYNTAX + list("abc_.01 ")), max_size=40)))
    doc = draw(documents)
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=draw(st.sampled_from([False, None, True])))
    if how == "document":
        return text
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["repeat", "drop", "splice", "cut"]))
        if action == "repeat":  # repeated keys, entries bound twice
            lines.insert(i, lines[i])
        elif action == "drop" and len(lines) > 1:
            del lines[i]
        elif action == "splice":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.sampled_from(SYNTAX)) + lines[i][at:]
        else:
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
    return "".join(lines)


def check_loads_or_refuses(text: str, csrc_dir=None) -> str:
    try:
        cfg = load_text(text, PATH, csrc_dir)
    except YamlError as e:
        assert e.loc.file == PATH
        assert 0 <= e.loc.line <= text.count("\n") + 2, (e.loc.line, text)
        assert e.message and str(e).startswith(f"{PATH}:{e.loc.line}: ")
        event("refused: " + " ".join(e.message.split()[:3]))  # pytest --hypothesis-show-statistics
        return "refused"
    files = generate(cfg)  # a document that loads must generate
    assert files and all(isinstance(content, str) and content for content in files.values())
    event("loaded and generated")
    return "loaded"


@FUZZ
@given(yaml_texts())
def test_random_yaml_loads_or_is_refused_with_a_located_error(text):
    check_loads_or_refuses(text)


KERNELS_CPP = """
#include "OpenRegNativeFunctions.h"
namespace n {
void neg_kernel(at::TensorIteratorBase& iter) {}
void add_kernel(at::TensorIteratorBase& iter, const at::Scalar& alpha) {}
at::Tensor view_impl(const at::Tensor& self, at::IntArrayRef size) { return self; }
at::Tensor k(const at::Tensor& self) { return self; }
}
"""


@settings(FUZZ, max_examples=150)
@given(documents)
def test_random_documents_against_kernel_sources(tmp_path_factory, doc):
    # With --csrc-dir the codegen also checks that every kernel is defined
    # and that stub kernels have the stub's parameter types.
    csrc = tmp_path_factory.getbasetemp() / "fuzz_csrc"
    if not csrc.exists():
        csrc.mkdir()
        (csrc / "kernels.cpp").write_text(KERNELS_CPP)
    check_loads_or_refuses(yaml.safe_dump(doc, sort_keys=False), str(csrc))


@settings(FUZZ, max_examples=40)
@given(yaml_texts())
def test_cli_answers_every_document_with_status_0_or_1(tmp_path_factory, text):
    path = tmp_path_factory.getbasetemp() / "cli_fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    out = tmp_path_factory.getbasetemp() / "never_written"
    assert main(["--source-yaml", str(path), "--output-dir", str(out), "--dry-run",
                 "--csrc-dir", os.path.dirname(__file__)]) in (0, 1)
    assert not out.exists()
