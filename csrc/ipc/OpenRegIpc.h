// Storages shared between processes: the ATen side of orIpc*, as
// torch/csrc/StorageSharing.cpp (_share_cuda_, _new_shared_cuda) and
// torch/csrc/CudaIPCTypes.cpp are CUDA's. torch_openreg/openreg/ipc.py puts
// them behind torch.multiprocessing's pickler.
#pragma once

#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>

#include "runtime/OpenRegRuntime.h"

namespace openreg::ipc {

// One send of a storage, on the producer's side: the handle the receiver
// opens, and the storage itself, kept alive until the receiver lets go. A
// count in a small shared memory file says how many receivers still hold the
// memory: 1 when sent, decremented by the receiver's storage deleter (as
// torch's CUDA IPC ref counter file, CudaIPCSentData).
class SentStorage {
 public:
  // Throws c10::Error (RuntimeError) saying why a storage cannot be shared.
  explicit SentStorage(c10::Storage storage);
  ~SentStorage();
  SentStorage(const SentStorage&) = delete;
  SentStorage& operator=(const SentStorage&) = delete;

  const orIpcMemHandle& handle() const { return handle_; }
  // Bytes from the start of the runtime allocation to the storage's data.
  uint64_t storage_offset() const { return storage_offset_; }
  uint64_t nbytes() const { return storage_.nbytes(); }
  // The count's file, until close_counter_file (once the pickler dup'ed it).
  int counter_file() const { return counter_file_; }
  void close_counter_file();
  // Whether every receiver has let go, so the storage may be dropped.
  bool released() const;

 private:
  c10::Storage storage_;
  orIpcMemHandle handle_{};
  uint64_t storage_offset_ = 0;
  int counter_file_ = -1;
  std::atomic<int64_t>* counter_ = nullptr;
};

// The receiver's side: maps the handle (its fd valid in this process; the
// caller closes it afterwards) and returns a non-resizable storage of `nbytes`
// at `storage_offset` from the allocation's start on device handle.device.
// Its deleter unmaps the memory and decrements the count in `counter_file`.
c10::Storage open_storage(const orIpcMemHandle& handle, uint64_t storage_offset, uint64_t nbytes, int counter_file);

// A receiver that already holds the storage (it opened the same one before,
// or it is the producer) lets go of this send at once.
void release_send(int counter_file);

} // namespace openreg::ipc
