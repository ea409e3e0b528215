// cat's impl() (`structured: impl: cat_out` in the yaml). torch's meta()
// (at::meta::structured_cat) has checked the shapes, chosen dtype and memory
// format, allocated or resized the output and said whether every operand is
// contiguous in that format; this fills the output.
//
// CPU's impl copies small contiguous operands with memcpy from their data
// pointers, which CPU code cannot dereference on openreg, so openreg has its
// own impl, as CUDA does: the same block copies on kernel addresses, and
// otherwise, as CPU does then, CPU's copy kernel (copy_stub) on an iterator
// from each operand to its slice of the output, which converts dtypes and
// follows strides without a copy_ call per operand. Without the CPU aliases
// a CPU kernel needs, a small cat costs what it costs on CPU.
#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Copy.h>
#include <ATen/native/TensorShape.h>
#include <c10/util/accumulate.h>

#include "OpenRegNativeFunctions.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"
#include "device/OpenRegStream.h"
#include "kernels/CpuIterator.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {

void cat_out(
    const at::ITensorListRef& tensors,
    int64_t dim,
    int64_t /*valid*/,
    bool all_contiguous,
    bool all_same_dtype,
    bool /*all_same_sizes_and_stride*/,
    at::MemoryFormat memory_format,
    const at::Tensor& out) {
  auto materialized = tensors.materialize();
  // meta() does not compare devices (CPU's and CUDA's impls do). The output
  // is on the device of the tensors' first (meta() checked an out= against it).
  for (const at::Tensor& t : materialized) {
    if (t.device() != out.device()) {
      raise_two_devices("aten::cat", out.device(), "tensors", t.device(), "tensors");
    }
  }
  if (out.numel() == 0) {
    return;
  }
  // A small output, or one thread: CPU copies serially too. A large one goes
  // through CPU's copy kernel below, which runs in parallel.
  const bool serial = out.numel() < at::internal::GRAIN_SIZE || at::get_num_threads() == 1;
  // meta()'s all_contiguous (operands and output) is also false when an
  // operand is skipped (an empty one, as a key/value cache's first cat has);
  // the others may still be.
  const bool blocks = all_contiguous ||
      (out.is_contiguous() && std::all_of(materialized.begin(), materialized.end(), [](const at::Tensor& t) {
         return at::native::cat_should_skip_tensor(t) || t.is_contiguous();
       }));
  if (serial && blocks && all_same_dtype && memory_format == at::MemoryFormat::Contiguous) {
    // Row-major operands: for each index of the dimensions before `dim`,
    // every operand holds one block, and the output holds their blocks in
    // turn; a skipped operand holds none.
    struct Operand {
      const char* data;
      size_t block;
    };
    const int64_t outer = c10::multiply_integers(out.sizes().slice(0, dim));
    std::vector<Operand> operands;
    for (const at::Tensor& t : materialized) {
      if (const size_t block = t.nbytes() / static_cast<size_t>(outer); block > 0) {
        operands.push_back({static_cast<const char*>(orKernelAddress(t.const_data_ptr())), block});
      }
    }
    launch_kernel(
        out.device().index(), "openreg::cat", out.numel(),
        [dst = static_cast<char*>(orKernelAddress(out.mutable_data_ptr())), outer, operands = std::move(operands)] {
          char* to = dst;
          for (int64_t i = 0; i < outer; ++i) {
            for (const Operand& operand : operands) {
              std::memcpy(to, operand.data + static_cast<size_t>(i) * operand.block, operand.block);
              to += operand.block;
            }
          }
        });
    return;
  }
  // CPU's iterators (cat_out_cpu), built here so that their checks raise at
  // the call; one kernel runs copy_stub's CPU kernel over each.
  std::vector<KernelIterator> copies;
  int64_t offset = 0;
  for (const at::Tensor& t : materialized) {
    if (at::native::cat_should_skip_tensor(t)) {
      continue;
    }
    const int64_t size = t.size(dim);
    const at::Tensor slice = out.narrow(dim, offset, size);
    auto iter = at::TensorIteratorConfig()
                    .set_check_mem_overlap(false) // meta() checked it
                    .resize_outputs(false)
                    .add_output(slice)
                    .add_const_input(t)
                    .promote_inputs_to_common_dtype(true)
                    .cast_common_dtype_to_outputs(true)
                    .enforce_safe_casting_to_output(true)
                    .build();
    copies.emplace_back(iter);
    offset += size;
  }
  launch_kernel(out.device().index(), "openreg::cat", out.numel(), [copies = std::move(copies)]() mutable {
    for (const KernelIterator& copy : copies) {
      copy.run([](at::TensorIterator& iter) { run_cpu_stub(at::native::copy_stub, iter, /*non_blocking=*/false); });
    }
  });
}

} // namespace openreg::native
