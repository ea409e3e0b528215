"""Graph capture and replay (torch.openreg.graph, OpenRegGraph, torch.accelerator.Graph,
make_graphed_callables), against torch.cuda's graphs' behaviour: docs/integration/graphs.md."""

import copy
import gc

import pytest
import torch

import torch_openreg  # noqa: F401

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


def captured(fn, *args, warm_up=False, **graph_kwargs):
    """Captures fn(*args) into a new graph, after a call on a side stream
    (`warm_up`, as CUDA's graphs ask); returns (graph, fn's result)."""
    if warm_up:
        side = torch.openreg.Stream()
        side.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(side):
            fn(*args)
        torch.openreg.current_stream().wait_stream(side)
    g = torch.openreg.OpenRegGraph()
    with torch.openreg.graph(g, **graph_kwargs):
        out = fn(*args)
    return g, out


def test_replay_recomputes_from_the_static_inputs():
    x = torch.zeros(64, device=DEV)
    w = torch.randn(64, 64)
    wd = w.to(DEV)

    def f(x):
        return torch.relu(wd @ x.sin() + 1).sum(0, keepdim=True) * x

    g, out = captured(f, x)
    for step in range(3):
        new = torch.randn(64)
        x.copy_(new.to(DEV))
        g.replay()
        torch.testing.assert_close(out.cpu(), torch.relu(w @ new.sin() + 1).sum(0, keepdim=True) * new)


def test_capture_records_and_does_not_run():
    x = torch.ones(8, device=DEV)
    y = torch.zeros(8, device=DEV)
    g = torch.openreg.OpenRegGraph()
    with torch.openreg.graph(g):
        assert torch.openreg.is_current_stream_capturing()
        y.add_(x)
    assert not torch.openreg.is_current_stream_capturing()
    assert y.cpu().tolist() == [0.0] * 8  # recorded, not run
    g.replay()
    g.replay()
    assert y.cpu().tolist() == [2.0] * 8


def test_torch_accelerator_graph_uses_openreg():
    x = torch.arange(6.0, device=DEV)
    s = torch.openreg.Stream()
    g = torch.accelerator.Graph()
    with torch.openreg.stream(s), g:
        y = x * 3
    x.fill_(2.0)
    g.replay()
    assert y.cpu().tolist() == [6.0] * 6


def test_replay_on_another_stream_and_keep_graph():
    x = torch.ones(4, device=DEV)
    g = torch.openreg.OpenRegGraph(keep_graph=True)
    with torch.openreg.graph(g):
        x.mul_(2)
    g.instantiate()
    for stream in (torch.openreg.Stream(), torch.openreg.current_stream(), torch.openreg.Stream()):
        with torch.openreg.stream(stream):
            g.replay()
    torch.openreg.synchronize()
    assert x.cpu().tolist() == [8.0] * 4  # each launch after the previous one


def test_random_operators_draw_afresh_at_each_replay_as_eagerly():
    """Each replay draws new numbers, from the generator's state at the replay:
    after manual_seed, the same numbers as eager code (and as CPU) draws."""
    src = torch.ones(32, device=DEV)

    def f(src):
        return torch.rand(5, device=DEV), torch.nn.functional.dropout(src, 0.5), torch.randn(20, device=DEV)

    g, (r, d, n) = captured(f, src)
    torch.manual_seed(7)
    expected = [t.cpu() for t in f(src)]
    torch.manual_seed(7)
    cpu = (torch.rand(5), torch.nn.functional.dropout(torch.ones(32), 0.5), torch.randn(20))
    torch.manual_seed(7)
    g.replay()
    for got, want, on_cpu in zip((r, d, n), expected, cpu):
        assert torch.equal(got.cpu(), want)
        assert torch.equal(got.cpu(), on_cpu)
    after_first = r.cpu().clone()
    g.replay()
    assert not torch.equal(r.cpu(), after_first)
    # The generator advanced at each replay as an eager call would have.
    torch.manual_seed(7)
    f(src)
    f(src)
    eager_next = torch.rand(3, device=DEV).cpu()
    torch.manual_seed(7)
    g.replay()
    g.replay()
    assert torch.equal(torch.rand(3, device=DEV).cpu(), eager_next)
    # A bad argument raises at the call, as eagerly, and draws nothing.
    torch.manual_seed(7)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        captured(lambda: torch.empty(4, device=DEV).normal_(0, -1.0))
    assert torch.equal(torch.rand(3, device=DEV).cpu(), expected[0][:3])


@pytest.mark.parametrize("warm_up", [False, True])
def test_a_cpu_kernel_that_draws_is_refused(warm_up):
    """bernoulli with a tensor of probabilities draws inside CPU's kernel, which
    would draw the same numbers at every replay: refused, naming it."""
    p = torch.full((64, 3 + warm_up), 0.5, device=DEV)
    with pytest.raises(RuntimeError, match="bernoulli.*draws random numbers in CPU's kernel"):
        captured(torch.bernoulli, p, warm_up=warm_up)


def test_capture_allocates_from_the_graphs_pool_and_reset_gives_it_back():
    gc.collect()  # earlier tests' garbage, freed now rather than during the count
    torch.openreg.synchronize()
    torch.openreg.empty_cache()
    base = torch.openreg.memory_allocated()
    x = torch.randn(1000, device=DEV)
    g, out = captured(lambda x: (x * 2).exp() + 1, x)
    pool = g.pool()
    segments = [s for s in torch.openreg.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)]
    assert segments, "the capture's allocations are not in the graph's pool"
    out_ptr = out.data_ptr()
    assert any(s["address"] <= out_ptr < s["address"] + s["total_size"] for s in segments)
    # Eager allocations outside the capture never get the pool's blocks.
    for _ in range(4):
        t = torch.empty(1000, device=DEV)
        assert not any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segments)
    del out, t
    g.reset()
    del g, x
    torch.openreg.synchronize()
    torch.openreg.empty_cache()
    assert torch.openreg.memory_allocated() == base
    assert not [s for s in torch.openreg.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)]


def test_graphs_share_a_pool():
    handle = torch.openreg.graph_pool_handle()
    x = torch.ones(256, device=DEV)
    g1, a = captured(lambda x: x + 1, x, pool=handle)
    g2, b = captured(lambda a: a * 3, a, pool=handle)
    assert tuple(g1.pool()) == tuple(g2.pool()) == tuple(handle)
    g1.replay()
    g2.replay()
    assert b.cpu().tolist() == [6.0] * 256


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.sum().item(),
        lambda t: t.cpu(),
        lambda t: torch.openreg.current_stream().synchronize(),
        lambda t: torch.openreg.synchronize(),
        lambda t: torch.nonzero(t),
        lambda t: torch.unique(t),
        lambda t: torch.openreg.current_stream().query(),
        lambda t: torch.openreg.Event().record(),  # a fork into another stream
    ],
    ids=["item", "cpu", "stream_synchronize", "device_synchronize", "nonzero", "unique", "stream_query", "event"],
)
def test_a_call_that_waits_invalidates_the_capture(call):
    x = torch.ones(16, device=DEV)
    g = torch.openreg.OpenRegGraph()
    with pytest.raises(RuntimeError, match="capture") as info:
        with torch.openreg.graph(g):
            y = x + 1
            call(y)
    # The call's own error, then capture_end's (chained), as on CUDA.
    assert "operation not permitted when stream is capturing" in str(info.value.__context__ or info.value)
    assert "capture failed" in str(info.value)
    assert not torch.openreg.is_current_stream_capturing()
    # The device keeps working, and the graph captures again after reset().
    g.reset()
    with torch.openreg.graph(g):
        y = x + 1
    g.replay()
    assert y.cpu().tolist() == [2.0] * 16


def test_relaxed_mode_lets_another_stream_synchronize():
    x = torch.ones(16, device=DEV)
    g = torch.openreg.OpenRegGraph()
    with torch.openreg.graph(g, capture_error_mode="relaxed"):
        y = x * 5
        torch.openreg.synchronize()  # waits for the other streams only
    g.replay()
    assert y.cpu().tolist() == [5.0] * 16


def test_bad_use_raises_clear_errors():
    g = torch.openreg.OpenRegGraph()
    with pytest.raises(RuntimeError, match="holds no capture"):
        g.replay()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="not capturing"):
        g.capture_end()
    with pytest.raises(RuntimeError, match="enable_debug_mode"):
        g.debug_dump("/nonexistent/graph.dot")
    x = torch.ones(4, device=DEV)
    g, _ = captured(lambda x: x + 1, x)
    with pytest.raises(RuntimeError, match="already holds a capture"):
        with torch.openreg.graph(g):
            pass
    # A second graph on a stream another one captures: refused, and the first
    # capture goes on allocating from its own pool.
    outer, inner = torch.openreg.OpenRegGraph(), torch.openreg.OpenRegGraph()
    with torch.openreg.graph(outer):
        with pytest.raises(RuntimeError, match="captured already"):
            inner.capture_begin()
        y = x * 4
    pool = tuple(outer.pool())
    assert any(s["address"] <= y.data_ptr() < s["address"] + s["total_size"]
               for s in torch.openreg.memory_snapshot() if tuple(s["segment_pool_id"]) == pool)
    outer.replay()
    assert y.cpu().tolist() == [4.0] * 4
    with pytest.raises(TypeError, match="OpenRegGraph"):
        torch.openreg.graph(object())


def test_debug_dump_lists_the_nodes(tmp_path):
    x = torch.ones(1 << 16, device=DEV)
    g = torch.openreg.OpenRegGraph()
    g.enable_debug_mode()
    with torch.openreg.graph(g):
        y = x.exp()
        y.add_(x)
    path = tmp_path / "graph.dot"
    g.debug_dump(str(path))
    text = path.read_text()
    assert text.startswith("digraph") and "exp" in text and "add" in text and "n0 -> n1" in text


def test_a_failing_kernel_fails_the_replay_not_the_capture():
    """A kernel's error inside a replay is reported at the next synchronization
    (at the replay with OPENREG_LAUNCH_BLOCKING=1), and the device keeps working."""
    idx = torch.zeros(4, dtype=torch.long, device=DEV)
    src = torch.ones(4, device=DEV)
    g, out = captured(lambda i: torch.zeros(4, device=DEV).index_add(0, i, src), idx)
    g.replay()
    assert out.cpu().tolist() == [4.0, 0.0, 0.0, 0.0]
    idx.fill_(10)  # out of range at the next replay
    with pytest.raises(torch.AcceleratorError, match="index"):
        g.replay()
        torch.openreg.synchronize()
    idx.fill_(1)
    g.replay()
    assert out.cpu().tolist() == [0.0, 4.0, 0.0, 0.0]


@pytest.mark.parametrize("warm_up", [False, True])
def test_cpu_kernels_and_fallback_operators_are_recorded(warm_up):
    """Operators bound to CPU's kernel (mean, std, flip: the cpu_kernels route)
    and on the CPU fallback (mse_loss_backward, nan_to_num) are recorded, whether
    or not a call with the same shapes ran before the capture; each replay runs
    them on the replay's inputs. An in-place one writes only at replays."""
    rows, cols = 6, 10 + warm_up  # shapes no other test used: the first call is the capture's
    x = torch.randn(rows, cols, device=DEV)
    t = torch.randn(rows, cols, device=DEV)
    acc = torch.zeros(rows, cols, device=DEV)
    index = torch.tensor([1], device=DEV)
    one = torch.ones((), device=DEV)

    def f(x, t, acc):
        grad = torch.ops.aten.mse_loss_backward(one, x, t, 1)
        acc.index_fill_(0, index, 1.0)
        return x.mean(1) * 2, x.std(0), x.flip(0), torch.nan_to_num(x / t), grad

    def f_cpu(x, t):
        grad = torch.ops.aten.mse_loss_backward(torch.ones(()), x, t, 1)
        return x.mean(1) * 2, x.std(0), x.flip(0), torch.nan_to_num(x / t), grad

    g, outs = captured(f, x, t, acc, warm_up=warm_up)
    if not warm_up:
        assert acc.cpu().abs().sum().item() == 0  # the capture wrote nothing
    acc.zero_()
    for _ in range(2):
        new_x, new_t = torch.randn(rows, cols), torch.randn(rows, cols)
        x.copy_(new_x.to(DEV))
        t.copy_(new_t.to(DEV))
        g.replay()
        for got, want in zip(outs, f_cpu(new_x, new_t)):
            torch.testing.assert_close(got.cpu(), want)
    assert acc.cpu()[1].tolist() == [1.0] * cols and acc.cpu()[0].tolist() == [0.0] * cols


@pytest.mark.filterwarnings("ignore:The openreg graph is empty")  # the refused capture's
def test_another_librarys_operators_are_recorded_if_they_could_be_queued():
    """A C++ operator from outside aten whose Meta kernel gives its results'
    shapes is recorded like torch's own; one whose CPU kernel is Python cannot
    run on the stream, and its capture says why."""
    x = torch.randn(13, 64, device=DEV)
    g, out = captured(torch.ops.quantized.embedding_bag_byte_prepack, x)
    for _ in range(2):
        new = torch.randn(13, 64)
        x.copy_(new.to(DEV))
        g.replay()
        assert torch.equal(out.cpu(), torch.ops.quantized.embedding_bag_byte_prepack(new))
    lib = torch.library.Library("openreg_test_graph_python", "DEF")
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CPU")
        with pytest.raises(RuntimeError, match="twice: .*as another library's operator, it has no C.. CPU kernel"):
            captured(torch.ops.openreg_test_graph_python.twice, x)
    finally:
        lib._destroy()
    assert torch.equal(torch.ops.quantized.embedding_bag_byte_prepack(x).cpu(), out.cpu())


def test_whole_training_step_captured_matches_cpu():
    """torch.cuda's whole-network capture example: forward, backward and an SGD
    step in one graph, replayed on new data; parameters as CPU's eager training."""
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(cpu_model).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    static_x = torch.randn(8, 16, device=DEV)
    static_y = torch.randn(8, 4, device=DEV)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        for _ in range(3):  # warm-up, also makes .grad exist
            step(model, opt, static_x, static_y)
    torch.openreg.current_stream().wait_stream(side)
    # The same warm-up steps on CPU, then both train on the same batches.
    for _ in range(3):
        step(cpu_model, cpu_opt, static_x.cpu(), static_y.cpu())
    g, static_loss = captured(step, model, opt, static_x, static_y, stream=side)
    for _ in range(4):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        static_x.copy_(x.to(DEV))
        static_y.copy_(y.to(DEV))
        g.replay()
        cpu_loss = step(cpu_model, cpu_opt, x, y)
        torch.testing.assert_close(static_loss.cpu(), cpu_loss.detach())
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


# The graphs keep the parameters' AccumulateGrad nodes of the capture stream
# alive, and torch warns when a later backward on another stream reaches them.
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream")
def test_make_graphed_callables_matches_eager():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).to(DEV)
    eager = copy.deepcopy(module)

    def fn(a, b):
        return (a * b).tanh(), a - b

    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    a = torch.randn(3, device=DEV, requires_grad=True)
    b = torch.randn(3, device=DEV)
    graphed_module, graphed_fn = torch.openreg.make_graphed_callables((module, fn), ((x,), (a, b)))
    assert graphed_module is module
    for _ in range(3):
        module.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        new = torch.randn(4, 8, device=DEV, requires_grad=True)
        new_eager = new.detach().clone().requires_grad_()
        graphed_module(new).square().sum().backward()
        eager(new_eager).square().sum().backward()
        torch.testing.assert_close(new.grad, new_eager.grad)
        for p, q in zip(module.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        na, nb = torch.randn(3, device=DEV, requires_grad=True), torch.randn(3, device=DEV)
        out1, out2 = graphed_fn(na, nb)
        (out1.sum() + out2.sum()).backward()
        ea = na.detach().clone().requires_grad_()
        e1, e2 = fn(ea, nb)
        (e1.sum() + e2.sum()).backward()
        torch.testing.assert_close(out1, e1)
        torch.testing.assert_close(na.grad, ea.grad)
    # The other training mode runs the module's own forward.
    module.eval()
    torch.testing.assert_close(module(x), eager.eval()(x))


def test_make_graphed_callables_refuses_what_it_cannot_graph():
    m = torch.nn.Linear(2, 2).to(DEV)
    m.register_forward_hook(lambda *args: None)
    with pytest.raises(ValueError, match="hooks"):
        torch.openreg.make_graphed_callables(m, (torch.ones(1, 2, device=DEV),))
    with pytest.raises(TypeError, match="only tensors"):
        torch.openreg.make_graphed_callables(lambda a, k: a, (torch.ones(2, device=DEV), 3))
    with torch.autocast("openreg", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="cache_enabled=False"):
            torch.openreg.make_graphed_callables(torch.nn.Linear(2, 2).to(DEV), (torch.ones(1, 2, device=DEV),))


class LossOf(torch.nn.Module):
    """A model's loss as a module of positional tensors, for make_graphed_callables."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors):
        return self.model(**dict(zip(self.keys, tensors))).loss


# GPT-2 and BERT are left out: transformers reads device values on the host in
# their forward (GPT-2's check for padding without an attention mask, BERT's
# `padding_mask.all()`), which no graph can capture, on CUDA either.
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream")
@pytest.mark.parametrize("name", ["llama", "t5", "vit", "rnn"])
def test_models_forward_and_training_step_in_graphs(name):
    """Real models: the forward captured into a graph gives the eager logits bit
    for bit; make_graphed_callables' forward and backward give eager's loss and
    gradients on two batches (the second copied into the captured inputs)."""
    import model_zoo as zoo

    spec = zoo.BY_NAME[name]
    batch = zoo.to_device(spec.batch(), DEV)
    inputs = zoo.forward_inputs(batch)
    model = spec.make().to(DEV).eval()
    with torch.no_grad():
        want = model(**inputs).logits
        g, logits = captured(lambda: model(**inputs).logits)
        g.replay()
    assert torch.equal(logits, want)

    graphed = spec.make().to(DEV).train()
    eager = spec.make().to(DEV).train()
    step = torch.openreg.make_graphed_callables(LossOf(graphed, list(batch)), tuple(batch.values()))
    for seed in (0, 1):
        if seed:
            batch = {k: v.flip(0) for k, v in batch.items()}  # another batch, same shapes
        graphed.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        loss = step(*batch.values())
        loss.backward()
        eager_loss = eager(**batch).loss
        eager_loss.backward()
        torch.testing.assert_close(loss, eager_loss)
        for (pname, p), q in zip(graphed.named_parameters(), eager.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"{pname}: {m}")


def test_compiled_function_in_a_graph():
    """Inductor's generated kernels are launched like any kernel: captured, then
    replayed on new inputs."""
    x = torch.randn(1000, device=DEV)

    @torch.compile(backend="inductor")
    def f(x):
        return (x.sin() * 2 + 1).relu()

    g, y = captured(f, x, warm_up=True)  # the warm-up compiles
    for _ in range(2):
        new = torch.randn(1000)
        x.copy_(new.to(DEV))
        g.replay()
        torch.testing.assert_close(y.cpu(), (new.sin() * 2 + 1).relu())
