// The fault handler that turns a host dereference of device memory into a
// message naming openreg and the allocation, instead of a bare segfault.
//
// Device addresses are mapped PROT_NONE (RuntimeMemory.cpp), so the access
// raises SIGSEGV with si_addr inside the device region. The handler prints,
// restores the handler that was installed before it (Python's faulthandler,
// if enabled, then prints the Python traceback) and returns, so the faulting
// instruction runs again and the process ends the way it would have.
//
// A handler installed later (faulthandler.enable() after openreg initialised,
// as pytest does) runs first and re-raises the signal without the fault
// address; orInstallFaultHandler puts this one first again.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "OpenRegRuntimeInternal.h"

namespace openreg::detail {
namespace {

struct sigaction previous_segv;
struct sigaction previous_bus;

void write_stderr(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, text, left);
    if (n <= 0) {
      return;
    }
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void on_fault(int signal, siginfo_t* info, void* /*context*/) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const Config* c = config();
  const bool device_address = info->si_code > 0 && c != nullptr && addr >= c->device_base &&
      addr - c->device_base < c->device_memory * c->device_count;
  if (device_address) {
    // snprintf is not async-signal-safe in general, but the process is about
    // to end and glibc's integer formatting does not allocate.
    static char message[512];
    int device = static_cast<int>((addr - c->device_base) / c->device_memory);
    uintptr_t base = 0;
    size_t size = 0;
    if (find_allocation(addr, /*try_only=*/true, &device, &base, &size)) {
      std::snprintf(
          message, sizeof(message),
          "openreg: host code accessed device memory at %p, %zu bytes into a %zu-byte allocation on "
          "openreg:%d. Device memory is only reachable from openreg kernels and copies: copy the tensor "
          "to the CPU first (tensor.cpu()).\n",
          info->si_addr, static_cast<size_t>(addr - base), size, device);
    } else {
      std::snprintf(
          message, sizeof(message),
          "openreg: host code accessed device memory at %p on openreg:%d, which is not a live allocation "
          "(freed, or never allocated). Device memory is only reachable from openreg kernels and copies.\n",
          info->si_addr, device);
    }
    write_stderr(message);
  }
  sigaction(SIGSEGV, &previous_segv, nullptr);
  sigaction(SIGBUS, &previous_bus, nullptr);
  if (info->si_code <= 0) {
    raise(signal); // sent by kill/raise: returning would not repeat it
  }
}

} // namespace

void install_fault_handler() {
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == &on_fault) {
    return; // already first in line; installing again would chain to itself
  }
  struct sigaction action {};
  action.sa_sigaction = &on_fault;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &action, &previous_segv);
  sigaction(SIGBUS, &action, &previous_bus);
}

} // namespace openreg::detail
