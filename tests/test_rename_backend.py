"""tools/rename_backend.py: the copy under another name holds no trace of this one's
and generates the code the golden files hold; a bad NAME or DEST is refused before
anything is written."""

import os
import re
import subprocess
import sys

import pytest

from tools import rename_backend
from tools.rename_backend import OLD_NAME, Names, Rename, RenameError

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

# Its module fixture is built once: one pytest-xdist worker runs the file.
pytestmark = pytest.mark.xdist_group("rename_backend")

# A name of another length than this one's (memory_summary once padded its header for
# 7 letters) that does not hold it: this file is renamed with the backend.
NAME = next(name for name in ("mydevice", "simdev", "npu_sim") if len(name) != len(OLD_NAME) and OLD_NAME not in name)


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    dest = tmp_path_factory.mktemp("renamed")  # an empty directory is a DEST too
    rename_backend.rename_backend(NAME, dest)
    return dest


@pytest.fixture(scope="module")
def old():
    return rename_backend.old_names(rename_backend.tracked_files(rename_backend.ROOT))


def test_copy_holds_every_tracked_file_under_its_renamed_path(renamed):
    tracked = rename_backend.tracked_files(rename_backend.ROOT)
    copied = rename_backend.tracked_files(renamed)  # the copy is a git checkout of itself
    assert len(copied) == len(tracked)
    assert (renamed / f"torch_{NAME}" / NAME / "memory.py").is_file()
    assert (renamed / f"csrc/runtime/{Names.of(NAME).camel}Runtime.h").is_file()
    assert os.access(renamed / ".ci/run", os.X_OK)


def test_copy_names_the_old_backend_nowhere_but_in_the_kept_lines(renamed):
    found = []
    for path in sorted(renamed.rglob("*")):
        relative = str(path.relative_to(renamed))
        if relative.startswith(".git/") or relative == ".git":
            continue
        if OLD_NAME in relative.lower():
            found.append(relative)
        if path.is_file():
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if OLD_NAME in line.lower() and not any(keep in line for keep in rename_backend.KEEP):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found[:20])


def test_copy_renames_the_runtime_api_and_environment_but_not_the_word_or(renamed, old):
    header = (renamed / f"csrc/runtime/{Names.of(NAME).camel}Runtime.h").read_text()
    new = Names.of(NAME)
    assert f"{new.prefix}Error {new.prefix}Malloc(void** ptr, size_t size);" in header
    assert not re.search(rf"\b{old.prefix}[A-Z]", header)
    assert " or " in header
    assert f"{NAME.upper()}_DEVICE_COUNT" in header


def test_copy_generates_the_code_its_golden_files_hold(renamed):
    # --noconftest: tests/conftest.py imports the copy's package, which is not built;
    # the codegen needs neither it nor this backend (not autoloaded, its pytest plugin off).
    # The C++ compile of a mismatched kernel is left out: the names it would differ in are the
    # generated header's, which the golden files hold.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", f"no:{OLD_NAME}", "-p", "no:cacheprovider",
         "-k", "not does_not_compile", "tests/codegen"],
        cwd=renamed, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def test_the_table_renames_each_spelling_and_the_runtime_prefix_only_before_a_capital(old):
    p = old.prefix
    text = (f"{p}Malloc(&ptr) {p} {p}Stream_t x_{p}Y {p}bit torch_{old.name} {old.camel}Guard "
            f"{old.name.upper()}_X {old.name.capitalize()}")
    assert Rename(old, Names.of("zz_top")).apply(text) == (
        f"zzMalloc(&ptr) {p} zzStream_t x_{p}Y {p}bit torch_zz_top ZzTopGuard ZZ_TOP_X ZzTop")
    # A two-letter name is its own prefix; a replacement is not matched again.
    two_letters = Rename(Names.of("ab"), Names.of("abab", prefix="cd"))
    assert two_letters.apply("abMalloc ab_x Ab AB") == "cdMalloc abab_x Abab ABAB"


@pytest.mark.parametrize("name, message", [
    ("Npu", "lower-case letters"),
    ("npu2", "without digits"),
    ("class", "not a keyword"),
    ("cuda", "one of torch's device types"),
    ("privateuseone", "one of torch's device types"),
    ("fft", "torch.fft exists already"),
    ("leaf", "torch.Tensor.is_leaf exists already"),
    ("native", f"names the tree has already: .*{OLD_NAME} -> native"),
    (OLD_NAME, "this backend's name already"),
])
def test_a_bad_name_is_refused_and_nothing_is_written(tmp_path, name, message):
    dest = tmp_path / "copy"
    with pytest.raises(RenameError, match=message):
        rename_backend.rename_backend(name, dest)
    assert not dest.exists()


def test_a_bad_prefix_or_camel_is_refused(tmp_path):
    with pytest.raises(RenameError, match="--prefix 'Np'"):
        rename_backend.rename_backend("npu", tmp_path / "copy", prefix="Np")
    with pytest.raises(RenameError, match="--camel 'npu'"):
        rename_backend.rename_backend("npu", tmp_path / "copy", camel="npu")


def test_a_dest_that_is_a_file_or_not_empty_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    for dest in (tmp_path, tmp_path / "file"):
        with pytest.raises(RenameError, match="exists and is not an empty directory"):
            rename_backend.rename_backend("npu", dest)
    assert os.listdir(tmp_path) == ["file"]


def test_the_command_line_reports_a_refusal_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "tools/rename_backend.py", "npu-1", str(tmp_path / "copy")],
                            cwd=rename_backend.ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("python tools/rename_backend.py: NAME 'npu-1': use lower-case letters")
    assert len(result.stderr.splitlines()) == 1
