// Stream-related tensor operators.
#include "OpenRegNativeFunctions.h"
#include "memory/OpenRegAllocator.h"

namespace openreg::native {

// The memory must not be reused before the work queued on `s` has finished
// (c10::DeviceAllocator::recordStream, as torch.cuda's record_stream).
void record_stream(at::Tensor& self, at::Stream s) {
  device_allocator()->recordStream(self.storage().data_ptr(), s);
}

} // namespace openreg::native
