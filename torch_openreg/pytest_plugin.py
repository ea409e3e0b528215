"""pytest plugin: run an existing test suite on openreg and learn what would break on
an accelerator (docs/ci.md). pytest loads it through the package's ``pytest11``
entry point; it does nothing unless one of its options is given.

- ``--openreg``: the run's default device is openreg (``torch.set_default_device``),
  so tensors a library makes without ``device=`` are made there;
- ``--openreg-leak-check``: a test that ends with more openreg memory allocated than
  it started with fails, naming the bytes (and the allocating stacks, when
  ``torch.openreg.memory._record_memory_history`` is on), as PyTorch's own CUDA
  leak check does;
- ``--openreg-strict``: a CPU fallback, a sanitizer report
  (``TORCH_OPENREG_SANITIZER=1``) or a leak fails the test that caused it.

With any of them, the terminal summary lists the tests that ran operators on the CPU
fallback (and which), the tests that made the host wait for the device most often,
and the sanitizer's reports.
"""

from __future__ import annotations

import gc

import pytest

OPTIONS = ("openreg", "openreg_leak_check", "openreg_strict")
SHOWN = 10  # tests per summary section


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("openreg", "the openreg device (torch_openreg, docs/ci.md)")
    group.addoption("--openreg", action="store_true", help="make openreg the default device of every test")
    group.addoption(
        "--openreg-leak-check", action="store_true",
        help="fail a test that ends with more openreg memory allocated than it started with",
    )
    group.addoption(
        "--openreg-strict", action="store_true",
        help="fail a test that runs an operator on the CPU fallback, has a sanitizer report or leaks",
    )


def pytest_configure(config: pytest.Config) -> None:
    if any(config.getoption(name) for name in OPTIONS):
        config.pluginmanager.register(OpenRegRun(config), "openreg-run")


class OpenRegRun:
    """The state of a run with the plugin's options: what each test did on openreg."""

    def __init__(self, config: pytest.Config):
        import torch

        import torch_openreg  # noqa: F401 (a suite may run with TORCH_DEVICE_BACKEND_AUTOLOAD=0)

        self.torch = torch
        self.strict = config.getoption("openreg_strict")
        self.leak_check = self.strict or config.getoption("openreg_leak_check")
        self.fallbacks: dict[str, dict[str, int]] = {}
        self.syncs: dict[str, int] = {}
        self.sanitizer: dict[str, str] = {}
        if config.getoption("openreg"):
            torch.set_default_device("openreg")

    def _allocated(self) -> list[int]:
        openreg = self.torch.openreg
        for i in range(openreg.device_count()):
            openreg.synchronize(i)
        gc.collect()
        return [openreg.memory_allocated(i) for i in range(openreg.device_count())]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        from torch_openreg import _C

        openreg = self.torch.openreg
        before = self._allocated() if self.leak_check else None
        openreg.reset_fallback_stats()
        syncs = _C._sync_count()
        result = yield  # the test's own failure propagates from here
        self.syncs[item.nodeid] = _C._sync_count() - syncs
        fell_back = openreg.fallback_stats()
        if fell_back:
            self.fallbacks[item.nodeid] = fell_back
        problems = []
        if self.strict and fell_back:
            problems.append(
                "ran on the CPU fallback: " + ", ".join(f"{op} ({n}x)" for op, n in sorted(fell_back.items()))
                + "; a device without a kernel for these would fail here (python -m torch_openreg info --fallbacks)"
            )
        if before is not None:
            after = self._allocated()
            leaked = {i: a - b for i, (a, b) in enumerate(zip(after, before)) if a > b}
            if leaked:
                problems.append(self._leak_message(leaked))
        if problems:
            pytest.fail("openreg: " + "\n".join(problems), pytrace=False)
        return result

    def _leak_message(self, leaked: dict[int, int]) -> str:
        where = ", ".join(f"{n} bytes on openreg:{i}" for i, n in leaked.items())
        message = f"the test ended with more device memory allocated than it started with: {where}"
        stacks = []
        for segment in self.torch.openreg.memory._snapshot()["segments"]:
            for block in segment["blocks"]:
                if block["state"] == "active_allocated" and block.get("frames"):
                    top = "; ".join(f"{f['filename']}:{f['line']} in {f['name']}" for f in block["frames"][:3])
                    stacks.append(f"  {block['size']} bytes allocated at {top}")
        if stacks:
            message += "\nlive blocks and their stacks:\n" + "\n".join(stacks[:5])
        else:
            message += " (torch.openreg.memory._record_memory_history() makes this name the stacks)"
        return message

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if call.excinfo is not None and type(call.excinfo.value).__name__ == "CUDASanitizerErrors":
            self.sanitizer[item.nodeid] = str(call.excinfo.value).strip().splitlines()[0]
        return report

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        terminalreporter.section("openreg")
        write(f"{len(self.fallbacks)} test(s) ran operators on the CPU fallback"
              + (":" if self.fallbacks else ""))
        for nodeid, ops in sorted(self.fallbacks.items(), key=lambda kv: -sum(kv[1].values()))[:SHOWN]:
            write(f"  {nodeid}: {', '.join(f'{op} ({n}x)' for op, n in sorted(ops.items()))}")
        busiest = sorted(((n, nodeid) for nodeid, n in self.syncs.items() if n), reverse=True)[:SHOWN]
        write(f"host synchronisations: {sum(self.syncs.values())} in {len(self.syncs)} test(s)"
              + (", most in:" if busiest else ""))
        for n, nodeid in busiest:
            write(f"  {n:6d}  {nodeid}")
        if self.sanitizer:
            write(f"sanitizer reports in {len(self.sanitizer)} test(s):")
            for nodeid, message in self.sanitizer.items():
                write(f"  {nodeid}: {message}")
