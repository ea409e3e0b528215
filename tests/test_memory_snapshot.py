"""Memory history and snapshots, as torch.cuda.memory._record_memory_history,
_snapshot and _dump_snapshot: the snapshot has CUDA's layout, and torch's own
viewers (torch.cuda._memory_viz) read it."""

import gc
import os
import pickle
import subprocess
import sys
import threading

import pytest
import torch

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEVICE = "openreg:1"  # tests elsewhere use device 0's allocator; this one's segments stay few
MEMORY = torch.openreg.memory


@pytest.fixture
def recording():
    """Records the history of this test only; off and cleared afterwards."""
    torch.openreg.synchronize(1)
    gc.collect()
    MEMORY._record_memory_history(max_entries=100_000, clear_history=True)
    try:
        yield
    finally:
        MEMORY._record_memory_history(enabled=None)


def train_step():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters())
    loss = model(torch.randn(32, 64, device=DEVICE)).square().mean()
    loss.backward()
    optimizer.step()
    torch.openreg.synchronize(1)
    return model, optimizer


def device_trace(snapshot):
    return snapshot["device_traces"][1]


def test_a_snapshot_has_cuda_s_layout_and_the_stacks_of_live_blocks(recording):
    model, optimizer = train_step()
    snapshot = MEMORY._snapshot()
    assert set(snapshot) >= {"segments", "device_traces"}
    assert len(snapshot["device_traces"]) == torch.openreg.device_count()
    segments = [s for s in snapshot["segments"] if s["device"] == 1]
    assert segments
    for segment in segments:
        assert set(segment) >= {"device", "address", "total_size", "allocated_size", "active_size",
                                "requested_size", "stream", "segment_type", "segment_pool_id", "blocks", "frames"}
        assert segment["segment_type"] in ("small", "large")
        blocks = segment["blocks"]
        assert sum(b["size"] for b in blocks) == segment["total_size"]
        assert blocks[0]["address"] == segment["address"]
        for before, after in zip(blocks, blocks[1:]):
            assert after["address"] == before["address"] + before["size"]  # the segment, block by block
        live = [b for b in blocks if b["state"] == "active_allocated"]
        assert segment["allocated_size"] == sum(b["size"] for b in live)
        assert segment["requested_size"] == sum(b["requested_size"] for b in live)
        for block in blocks:
            assert set(block) >= {"address", "size", "requested_size", "state", "frames"}
            assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
    # A parameter's block: the stack that allocated it names this file's train_step.
    weight = model[0].weight.untyped_storage().data_ptr()
    block = next(b for s in segments for b in s["blocks"] if b["address"] == weight)
    assert block["state"] == "active_allocated"
    assert any(f["name"] == "train_step" and f["filename"] == __file__ for f in block["frames"])
    assert all(set(f) >= {"filename", "line", "name"} for f in block["frames"])
    # As many live blocks as the allocator counts.
    live = sum(b["state"] == "active_allocated" for s in segments for b in s["blocks"])
    assert live == torch.openreg.memory_stats(1)["allocation.all.current"]
    del model, optimizer


def test_the_trace_records_every_allocation_and_free_in_order(recording):
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
    address = x.untyped_storage().data_ptr()
    del x
    snapshot = MEMORY._snapshot()
    actions = [(e["action"], e["addr"]) for e in device_trace(snapshot) if e["addr"] == address]
    assert ("alloc", address) in actions
    assert actions.index(("alloc", address)) < actions.index(("free_requested", address)) < actions.index(
        ("free_completed", address))
    entries = device_trace(snapshot)
    assert entries[-1]["action"] == "snapshot"
    assert all(set(e) >= {"action", "addr", "size", "stream", "frames", "time_us"} for e in entries)
    assert [e["time_us"] for e in entries] == sorted(e["time_us"] for e in entries)
    alloc = next(e for e in entries if e["action"] == "alloc" and e["addr"] == address)
    assert alloc["size"] == 1 << 20
    assert any(f["filename"] == __file__ for f in alloc["frames"])


def test_a_free_pending_on_another_stream_completes_when_the_stream_is_done(recording):
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
    address = x.untyped_storage().data_ptr()
    side = torch.openreg.Stream(device=DEVICE)
    with torch.openreg.stream(side):
        torch.openreg._sleep(200)
    x.record_stream(side)
    del x
    pending = MEMORY._snapshot()
    block = next(b for s in pending["segments"] for b in s["blocks"] if b["address"] == address)
    assert block["state"] == "active_pending_free"
    actions = [e["action"] for e in device_trace(pending) if e["addr"] == address]
    assert "free_requested" in actions and "free_completed" not in actions
    side.synchronize()
    done = MEMORY._snapshot()
    block = next(b for s in done["segments"] for b in s["blocks"] if b["address"] == address)
    assert block["state"] == "inactive"
    assert [e["action"] for e in device_trace(done) if e["addr"] == address][-1] == "free_completed"


def test_segments_allocated_and_freed_and_an_oom_are_in_the_trace(recording):
    torch.openreg.empty_cache()
    big = torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE)
    segment = big.untyped_storage().data_ptr()
    del big
    torch.openreg.empty_cache()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 40, dtype=torch.uint8, device=DEVICE)
    entries = device_trace(MEMORY._snapshot())
    actions = [e["action"] for e in entries if e["addr"] == segment and "segment" in e["action"]]
    start = actions.index("segment_alloc")  # the empty_cache() above may free an older segment there
    assert actions[start:] == ["segment_alloc", "segment_free"]
    oom = [e for e in entries if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 1 << 40 and oom[0]["device_free"] > 0


def test_max_entries_keeps_the_newest_and_enabled_none_stops_recording():
    MEMORY._record_memory_history(max_entries=4, clear_history=True)
    try:
        tensors = [torch.empty(1024, device=DEVICE) for _ in range(10)]
        addresses = [t.untyped_storage().data_ptr() for t in tensors]
        entries = device_trace(MEMORY._snapshot())
        assert len(entries) == 4
        assert [e["addr"] for e in entries[:3]] == addresses[-3:]  # the newest, then the snapshot
        assert entries[-1]["action"] == "snapshot"
    finally:
        MEMORY._record_memory_history(enabled=None)
    late = torch.empty(1024, device=DEVICE)
    snapshot = MEMORY._snapshot()
    assert device_trace(snapshot) == []
    block = next(b for s in snapshot["segments"] for b in s["blocks"]
                 if b["address"] == late.untyped_storage().data_ptr())
    assert block["frames"] == []
    del tensors, late


def test_context_state_keeps_the_stacks_of_live_blocks_without_a_trace():
    MEMORY._record_memory_history(enabled="state", context="state", stacks="python")
    try:
        x = torch.empty(1024, device=DEVICE)
        snapshot = MEMORY._snapshot()
    finally:
        MEMORY._record_memory_history(enabled=None)
    assert device_trace(snapshot) == []
    block = next(b for s in snapshot["segments"] for b in s["blocks"]
                 if b["address"] == x.untyped_storage().data_ptr())
    frames = block["frames"]
    assert frames and all(not f["filename"].endswith((".cpp", ".c", ".h")) for f in frames)  # Python only
    assert any(f["name"] == "test_context_state_keeps_the_stacks_of_live_blocks_without_a_trace" for f in frames)


def python_stack():
    """The caller's Python stack, innermost frame first, as a snapshot's frames name it."""
    frame, stack = sys._getframe(1), []
    while frame is not None:
        stack.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return stack


def named(frames):
    return [{k: f[k] for k in ("name", "filename", "line")} for f in frames]


@pytest.fixture
def recording_python_stacks():
    torch.openreg.synchronize(1)
    gc.collect()
    MEMORY._record_memory_history(stacks="python", max_entries=100_000, clear_history=True)
    try:
        yield
    finally:
        MEMORY._record_memory_history(enabled=None)


def test_every_event_keeps_the_python_stack_it_came_from(recording_python_stacks):
    # The same few stacks again and again, as a loop makes them: each event
    # still names its own line, allocations and frees alike.
    expected = []
    for _ in range(3):
        for size in (256, 512):
            if size == 256:
                stack, x = python_stack(), torch.empty(size, device=DEVICE)
            else:
                stack, x = python_stack(), torch.empty(size, device=DEVICE)
            expected.append(("alloc", x.untyped_storage().data_ptr(), stack))
            address = x.untyped_storage().data_ptr()
            stack, x = python_stack(), None
            expected.append(("free_requested", address, stack))
    snapshot = MEMORY._snapshot()
    addresses = {address for _, address, _ in expected}
    events = [(e["action"], e["addr"], named(e["frames"])) for e in device_trace(snapshot)
              if e["action"] in ("alloc", "free_requested") and e["addr"] in addresses]
    assert events == expected


def test_a_thread_s_blocks_keep_that_thread_s_stack(recording_python_stacks):
    in_thread = {}

    def allocate():
        in_thread["stack"], in_thread["x"] = python_stack(), torch.empty(768, device=DEVICE)

    thread = threading.Thread(target=allocate)
    stack, x = python_stack(), torch.empty(768, device=DEVICE)
    thread.start()
    thread.join()
    blocks = {b["address"]: b for s in MEMORY._snapshot()["segments"] for b in s["blocks"]}
    assert named(blocks[x.untyped_storage().data_ptr()]["frames"]) == stack
    assert named(blocks[in_thread["x"].untyped_storage().data_ptr()]["frames"]) == in_thread["stack"]
    assert in_thread["stack"][0]["name"] == "allocate"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"enabled": "everything"}, "enabled must be None, 'state' or 'all'"),
        ({"context": "some"}, "context must be None, 'state', 'alloc' or 'all'"),
        ({"stacks": "cpp"}, "stacks must be 'python' or 'all'"),
    ],
)
def test_bad_settings_name_the_argument_and_the_accepted_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MEMORY._record_memory_history(**kwargs)
    with pytest.raises(TypeError, match="not a bool"):
        MEMORY._record_memory_history(True)
    assert device_trace(MEMORY._snapshot()) == []  # still off


def test_torch_s_memory_viewers_render_a_training_step(recording, tmp_path):
    model, optimizer = train_step()
    path = tmp_path / "snapshot.pickle"
    MEMORY._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert device_trace(snapshot)
    for plot in ("trace_plot", "segment_plot"):
        out = tmp_path / f"{plot}.html"
        subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", plot, str(path), "-o", str(out)],
                       check=True, timeout=120, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        html = out.read_text()
        assert "<html" in html.lower() and len(html) > 10_000
    from torch.cuda import _memory_viz

    stats = _memory_viz.segsum(snapshot)
    assert "segments:" in stats and "total_allocated" in stats
    flamegraph_lines = []
    _memory_viz.memory(snapshot, format_flamegraph=flamegraph_lines.append)
    assert flamegraph_lines and "train_step" in flamegraph_lines[0]
    del model, optimizer
