// Graph capture and replay (torch.accelerator.Graph, torch.openreg.graph), as
// CUDA graphs: what a stream launches between capture_begin and capture_end
// is recorded by the runtime (orStreamBeginCapture), not run, and each
// replay queues it again on the current stream. Allocations on the captured
// stream come from the graph's private memory pool, so replays find their
// tensors where the capture put them. docs/integration/graphs.md.
#pragma once

#include <functional>

#include <c10/core/Device.h>

namespace openreg {

// What a replay does on the host before it queues the graph's kernels: a
// step does its work (a random operator's draws) and returns what to commit
// once every step succeeded (handing the draws to the recorded kernel that
// copies them), so a failed replay queues nothing and leaves no draws.
using ReplayStep = std::function<std::function<void()>()>;
// While the current stream of `device` is captured into a graph: each replay
// of that graph runs `step`, in the thread that replays it.
void add_replay_step(c10::DeviceIndex device, ReplayStep step);

// Registers openreg's graph for at::accelerator::Graph (torch.accelerator.Graph)
// under the backend's name; called once the backend is renamed to openreg.
void register_graph_impl();

} // namespace openreg
