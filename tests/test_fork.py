"""openreg and child processes, as CUDA: a child forked after its parent initialised
openreg cannot use it and is told to use the spawn start method; a spawned child can.

Every child runs under a timeout, so a hang fails the test instead of the suite.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.multiprocessing

import torch_openreg  # noqa: F401  (spawned children import this module first)

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

TIMEOUT = 60  # seconds; a child normally finishes in well under 5
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def in_forked_child(fn) -> str:
    """Runs `fn` in a child forked from this process: "ok: <result>" or "<Error>: <message>"."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            message = f"ok: {fn()}"
        except BaseException as e:  # report everything, the parent decides
            message = f"{type(e).__name__}: {e}"
        sender.send(message)

    process = ctx.Process(target=child, daemon=True)
    process.start()
    sender.close()  # so that a child that dies makes recv() raise EOFError at once
    try:
        if not receiver.poll(TIMEOUT):
            pytest.fail(f"forked child sent nothing within {TIMEOUT} s")
        try:
            return receiver.recv()
        except EOFError:
            process.join(TIMEOUT)
            pytest.fail(f"forked child died without a result (exit code {process.exitcode})")
    finally:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
            process.join()


@pytest.fixture
def initialised():
    """The parent has used openreg, as the CUDA tests' parent has used CUDA."""
    torch.ones(1, device="openreg")
    assert torch.openreg.is_initialized()


# torch.cuda's words, with the device's name as PyTorch's tests of its OpenReg write it.
BAD_FORK = (
    "RuntimeError: Cannot re-initialize OpenReg in forked subprocess. "
    "To use OpenReg with multiprocessing, you must use the 'spawn' start method"
)


# --- a child forked after the parent initialised openreg ---------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.openreg._lazy_init(),
        lambda: torch.openreg.current_device(),
        lambda: torch.openreg.set_device(0),
        lambda: torch.openreg.synchronize(),
        lambda: torch.openreg.get_rng_state(),
        lambda: torch.openreg.initial_seed(),
    ],
    ids=["_lazy_init", "current_device", "set_device", "synchronize", "get_rng_state", "initial_seed"],
)
def test_torch_openreg_api_in_forked_child_raises_and_says_use_spawn(initialised, call):
    message = in_forked_child(call)
    assert message.startswith(BAD_FORK)
    assert "'spawn' start method" in message


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(1, device="openreg"),
        lambda: torch.rand(1, device="openreg:1"),
        lambda: torch.ones(1).to("openreg"),
    ],
    ids=["empty", "rand", "to"],
)
def test_creating_an_openreg_tensor_in_forked_child_raises_and_says_use_spawn(initialised, make):
    assert in_forked_child(make).startswith(BAD_FORK)


def test_forked_child_reports_openreg_uninitialised_and_in_bad_fork(initialised):
    assert in_forked_child(lambda: (torch.openreg.is_initialized(), torch.openreg._is_in_bad_fork())) == (
        "ok: (False, True)"
    )
    assert torch.openreg.is_initialized() and not torch.openreg._is_in_bad_fork()  # parent unaffected


def test_torch_manual_seed_in_forked_child_skips_openreg_as_it_skips_cuda(initialised):
    # torch.random._seed_custom_device asks torch.openreg._is_in_bad_fork first.
    assert in_forked_child(lambda: torch.manual_seed(1).initial_seed()) == "ok: 1"


def test_openreg_rng_setters_in_forked_child_do_nothing_as_on_cuda(initialised):
    # torch.cuda defers them until an initialisation that never comes in a bad fork.
    state = torch.openreg.get_rng_state()
    setters = [
        lambda: torch.openreg.manual_seed(1),
        lambda: torch.openreg.manual_seed_all(1),
        lambda: torch.openreg.seed(),
        lambda: torch.openreg.seed_all(),
        lambda: torch.openreg.set_rng_state(state),
        lambda: torch.openreg.set_rng_state_all([state] * torch.openreg.device_count()),
    ]
    assert in_forked_child(lambda: [setter() for setter in setters]) == f"ok: {[None] * len(setters)}"


# --- a process that has not initialised openreg ----------------------------------

SEED_WITHOUT_INIT = textwrap.dedent(
    """
    import json
    import torch
    import torch_openreg

    state = torch.Generator(device="openreg").get_state()
    torch.manual_seed(3)
    torch.openreg.manual_seed(3)
    torch.openreg.manual_seed_all(3)
    torch.openreg.seed()
    torch.openreg.seed_all()
    torch.openreg.set_rng_state(state, 1)
    torch.openreg.set_rng_state_all([state] * torch.openreg.device_count())
    after_setters = torch.openreg.is_initialized()
    torch.openreg.get_rng_state()
    print("RESULT " + json.dumps([after_setters, torch.openreg.is_initialized()]))
    """
)

FORK_BEFORE_INIT = textwrap.dedent(
    """
    import json, os
    import torch
    import torch_openreg

    torch.manual_seed(3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            values = torch.rand(3, device="openreg:1").tolist()
            message = json.dumps({"values": values, "bad_fork": torch.openreg._is_in_bad_fork()})
        except BaseException as e:
            message = json.dumps({"error": f"{type(e).__name__}: {e}"})
        os.write(w, message.encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 1 << 16).decode())
    os.waitpid(pid, 0)
    parent = torch.rand(3, device="openreg:1").tolist()  # the same seeded state
    print("RESULT " + json.dumps({"child": child, "parent": parent}))
    """
)


def run_python(code: str) -> object:
    """Runs `code` in a fresh interpreter; returns the JSON it printed after "RESULT "."""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT
    )
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(results[-1][len("RESULT ") :])


def test_rng_setters_do_not_initialise_openreg_and_getters_do_as_on_cuda():
    assert run_python(SEED_WITHOUT_INIT) == [False, True]


def test_child_forked_before_openreg_was_initialised_uses_it_with_the_seeded_stream():
    result = run_python(FORK_BEFORE_INIT)
    assert result["child"] == {"values": result["parent"], "bad_fork": False}


# --- a spawned child ------------------------------------------------------------------


def spawned_worker(seed: int) -> dict:
    """Runs in a spawned child: module level, so that spawn can pickle it by name."""
    torch.manual_seed(seed)
    x = torch.rand(4, device="openreg:1")
    return {
        "values": x.cpu(),  # openreg tensors cannot be pickled to another process yet
        "device": str(x.device),
        "bad_fork": torch.openreg._is_in_bad_fork(),
        "device_count": torch.openreg.device_count(),
    }


def test_spawned_child_uses_openreg_and_returns_results(initialised):
    ctx = torch.multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        result = pool.apply_async(spawned_worker, (5,)).get(timeout=TIMEOUT)
    torch.manual_seed(5)
    expected = torch.rand(4, device="openreg:1").cpu()
    assert result["device"] == "openreg:1" and result["bad_fork"] is False
    assert result["device_count"] == torch.openreg.device_count()
    assert torch.equal(result["values"], expected)
