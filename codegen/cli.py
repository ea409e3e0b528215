"""python -m codegen --source-yaml backend_functions.yaml --output-dir DIR [--csrc-dir DIR] [--dry-run] [--list]"""

from __future__ import annotations

import argparse
import os
import sys

from codegen.emit import generate
from codegen.load import load
from codegen.model import BackendConfig, YamlError


def write_if_changed(path: str, content: str) -> bool:
    """Writes `content` unless the file already holds it, so that an unchanged
    yaml leaves timestamps alone and incremental builds stay no-ops."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == content:
                return False
    except OSError:
        pass
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(content)
    os.replace(tmp, path)
    return True


def kernel_dir(source_yaml: str, csrc_dir: str | None) -> str:
    """Where the kernels the yaml names must be defined: --csrc-dir, or the
    csrc/ directory next to the yaml."""
    return csrc_dir or os.path.join(os.path.dirname(os.path.abspath(source_yaml)), "csrc")


def run(source_yaml: str, output_dir: str, dry_run: bool = False, csrc_dir: str | None = None) -> list[str]:
    """Generates every file (nothing is written if the yaml has an error);
    returns the paths written."""
    cfg = load(source_yaml, kernel_dir(source_yaml, csrc_dir))
    files = generate(cfg)
    if dry_run:
        return []
    os.makedirs(output_dir, exist_ok=True)
    return [
        path
        for name, content in sorted(files.items())
        if write_if_changed(path := os.path.join(output_dir, name), content)
    ]


def list_bindings(cfg: BackendConfig) -> str:
    rows = sorted(cfg.binding_of().items())
    width = max((len(name) for name, _ in rows), default=0)
    lines = [f"{name.ljust(width)}  {how}" for name, how in rows]
    lines.append(
        f"(every other operator: {'CPU fallback' if cfg.fallback.enabled else 'no kernel'})"
    )
    lines.append(
        "(every operator on a nested tensor of the strided layout: "
        + (
            "nested CPU fallback, its NestedTensorCPU kernel on device memory)"
            if cfg.fallback.nested
            else "refused, NotImplementedError)"
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codegen",
        description="Generate the openreg PrivateUse1 registrations from backend_functions.yaml.",
    )
    parser.add_argument("--source-yaml", required=True, help="path of backend_functions.yaml")
    parser.add_argument("--output-dir", help="where the generated C++ goes (required unless --list)")
    parser.add_argument(
        "--csrc-dir", help="where the kernels the yaml names are defined (default: csrc/ next to the yaml)"
    )
    parser.add_argument("--dry-run", action="store_true", help="check the yaml and generate, but write nothing")
    parser.add_argument("--list", action="store_true", help="print how each operator is bound and exit")
    args = parser.parse_args(argv)
    try:
        if args.list:
            print(list_bindings(load(args.source_yaml, kernel_dir(args.source_yaml, args.csrc_dir))))
            return 0
        if not args.output_dir and not args.dry_run:
            parser.error("--output-dir is required (or pass --dry-run or --list)")
        written = run(args.source_yaml, args.output_dir or "", dry_run=args.dry_run, csrc_dir=args.csrc_dir)
    except YamlError as e:
        print(f"{e.loc}: error: {e.message}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0
