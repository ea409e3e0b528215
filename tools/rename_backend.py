"""Writes a copy of this backend under another device name.

Usage:
    python tools/rename_backend.py NAME DEST [--camel CAMEL] [--prefix PREFIX]
    python tools/rename_backend.py mydev /tmp/mydev   # torch.device("mydev"), torch.mydev, torch_mydev
    cd /tmp/mydev && python3 -m venv .venv && . .venv/bin/activate && pip install -e .   # README.md

NAME: lower-case letters and '_' (c10 parses no digits in a device type), not a name torch uses
already. DEST: a new or empty directory; it becomes a git checkout of the copy. The copy holds the
git-tracked files with each spelling of the name replaced, in contents and paths, by one table
(Rename.table): openreg -> NAME, OpenReg -> CAMEL (NAME in CamelCase: mydev -> Mydev), OPENREG ->
NAME in capitals (OPENREG_*, TORCH_OPENREG_*, PYTORCH_OPENREG_*), and the runtime's API prefix
(orMalloc, orStream_t, ...) -> PREFIX (NAME's first two letters: myMalloc). The copy's own copy of
this tool renames it in turn.
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_NAME = "openreg"
OLD_CAMEL = "OpenReg"
# The runtime's C API; its error enum (`enum class orError`) gives the prefix.
RUNTIME_HEADER = f"csrc/runtime/{OLD_CAMEL}Runtime.h"
# Substrings of lines copied unchanged because they must name the original project. None does.
KEEP: tuple[str, ...] = ()
# This tool and its test: the names of copies they show as examples are no clash.
OWN_FILES = ("tools/rename_backend.py", "tests/test_rename_backend.py")


class RenameError(ValueError):
    """A NAME, DEST or tree this tool refuses; the message says what to do."""


@dataclass(frozen=True)
class Names:
    """The spellings a backend's name takes."""

    name: str    # the device type, torch.<name>, torch_<name>
    camel: str   # class and file names: <Camel>Allocator
    prefix: str  # the runtime's C API: <prefix>Malloc

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z_]*", self.name) or keyword.iskeyword(self.name):
            raise RenameError(f"NAME {self.name!r}: use lower-case letters and '_' (a device type, "
                              "which c10 parses without digits, and a Python identifier, not a keyword)")
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", self.camel):
            raise RenameError(f"--camel {self.camel!r}: use letters and digits, starting with a capital")
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.prefix):
            raise RenameError(f"--prefix {self.prefix!r}: use lower-case letters and digits")

    @staticmethod
    def of(name: str, camel: str | None = None, prefix: str | None = None) -> Names:
        return Names(name, camel or "".join(part.capitalize() for part in name.split("_")),
                     prefix or name.replace("_", "")[:2])


@dataclass(frozen=True)
class Rename:
    old: Names
    new: Names

    def table(self) -> dict[str, str]:
        """Each spelling of the old name and what replaces it. The runtime's prefix is
        replaced too (`pattern`), where it starts a word and a capital follows it."""
        return {
            self.old.camel: self.new.camel,
            self.old.name.capitalize(): self.new.camel,  # a sentence's first word
            self.old.name.upper(): self.new.name.upper(),
            self.old.name: self.new.name,
        }

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        # One pass over the text: no replacement is matched again. The prefix comes first
        # for a two-letter name, whose prefix is the name; then the longest spelling.
        spellings = sorted(self.table(), key=len, reverse=True)
        return re.compile(rf"(?P<prefix>(?<![A-Za-z0-9_]){self.old.prefix}(?=[A-Z]))|"
                          + "|".join(map(re.escape, spellings)))

    def word(self, text: str) -> str:
        table = self.table()
        return self.pattern.sub(lambda m: self.new.prefix if m.lastgroup else table[m.group()], text)

    def apply(self, text: str) -> str:
        return "".join(line if any(k in line for k in KEEP) else self.word(line)
                       for line in text.splitlines(keepends=True))


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def tracked_files(root: Path) -> dict[str, str]:
    """The git-tracked files of `root`, by path: build outputs, .so files and .venv are not tracked."""
    try:
        toplevel = Path(git(root, "rev-parse", "--show-toplevel").strip()).resolve()
    except subprocess.CalledProcessError:
        toplevel = None
    if toplevel != root.resolve():
        raise RenameError(f"{root} is not the top of a git checkout; the copy holds the files git tracks there")
    listed = git(root, "ls-files", "-z")
    paths = [p for p in listed.split("\0") if p and (root / p).is_file()]
    return {p: (root / p).read_text(encoding="utf-8") for p in paths}


def old_names(files: dict[str, str]) -> Names:
    match = re.search(r"enum class (\w+)Error\b", files[RUNTIME_HEADER])
    if match is None:
        raise RenameError(f"{RUNTIME_HEADER} declares no `enum class <prefix>Error`, which gives the runtime's prefix")
    return Names(OLD_NAME, OLD_CAMEL, match.group(1))


def check_name_is_free(name: str) -> None:
    """A name torch has already: a device type, or a name in torch, Tensor, Module or storage
    that the device's module (torch._register_device_module) or its methods
    (torch.utils.generate_methods_for_privateuse1_backend) would have to replace."""
    if name == OLD_NAME:
        raise RenameError(f"NAME {name!r} is this backend's name already; choose another")
    import torch

    try:
        torch.device(name)
    except RuntimeError:
        pass
    else:
        raise RenameError(f"NAME {name!r} is one of torch's device types; choose another")
    for label, owner in (("torch", torch), ("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
                         ("torch.UntypedStorage", torch.UntypedStorage)):
        for attribute in (name, f"is_{name}"):
            if hasattr(owner, attribute):
                raise RenameError(f"NAME {name!r}: {label}.{attribute} exists already, and the device's module "
                                  "or methods would have to replace it; choose another")


def check_tree(files: dict[str, str], rename: Rename) -> None:
    """What the table cannot rename safely: a word that only looks like a name of the
    runtime's API, and a renamed word or path that is another's already."""
    prefix = rename.old.prefix
    declared = set(re.findall(rf"\b{prefix}[A-Z]\w*", files[RUNTIME_HEADER]))
    words = {w for path, text in files.items() if path not in OWN_FILES for w in re.findall(r"\w+", text)}
    strays = sorted(w for w in words
                    if re.fullmatch(rf"{prefix}[A-Z]\w*", w) and not any(d.startswith(w) for d in declared))
    if strays:
        raise RenameError(f"{', '.join(strays)}: spelled like names of the runtime's API ({prefix}Malloc) but not "
                          f"declared in {RUNTIME_HEADER}, so the copy would rename them too; rename them first")
    renamed = {w: rename.word(w) for w in words if rename.pattern.search(w)}
    clashes = sorted(f"{w} -> {new}" for w, new in renamed.items() if new in words - renamed.keys())
    paths = [rename.word(p) for p in files]
    clashes += sorted({f"a second {p}" for p in paths if paths.count(p) > 1})
    if clashes:
        raise RenameError(f"renamed, these become names the tree has already: {', '.join(clashes[:8])}"
                          f"{' ...' if len(clashes) > 8 else ''}; choose another NAME, --camel or --prefix")


def check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RenameError(f"DEST {dest} exists and is not an empty directory; name a new one")


def rename_backend(name: str, dest: Path, camel: str | None = None, prefix: str | None = None,
                   root: Path = ROOT) -> Rename:
    """Writes the renamed copy of `root`'s tracked files into `dest`, once every check passed."""
    new = Names.of(name, camel, prefix)
    check_dest(dest)
    check_name_is_free(name)
    files = tracked_files(root)
    rename = Rename(old_names(files), new)
    check_tree(files, rename)
    for path, text in files.items():
        target = dest / rename.word(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rename.apply(text), encoding="utf-8")
        target.chmod((root / path).stat().st_mode & 0o777)
    # A checkout whose tracked files are the copy's: its build, tests and this tool work there as here.
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    return rename


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/rename_backend.py", description=__doc__.split("\n")[0])
    parser.add_argument("name", metavar="NAME", help="the new device name, e.g. mydev")
    parser.add_argument("dest", metavar="DEST", type=Path, help="a new or empty directory for the copy")
    parser.add_argument("--camel", help="class and file name prefix (default: NAME in CamelCase)")
    parser.add_argument("--prefix", help="the runtime's C API prefix (default: NAME's first two letters)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # this backend need not be importable
    try:
        rename = rename_backend(args.name, args.dest, args.camel, args.prefix)
    except RenameError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    spellings = {**rename.table(), f"{rename.old.prefix}Malloc": f"{rename.new.prefix}Malloc"}
    print(f"wrote {args.dest}: " + ", ".join(f"{old} -> {new}" for old, new in spellings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
