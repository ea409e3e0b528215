// A per-tensor "format" tag kept in c10::BackendMeta: openreg's example of
// backend metadata on tensors (c10/core/TensorImpl.h: set_backend_meta), the
// place where a backend keeps what it knows about a tensor beyond sizes,
// strides and dtype (a real one: the physical layout of its data). openreg's
// kernels do not read it; docs/integration/device.md says where it travels.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace openreg {

// The tag of `t`, if it has one.
std::optional<std::string> tensor_format(const at::Tensor& t);

// Tags `t` (an openreg tensor) with `format`, a name of letters, digits and
// underscores; std::nullopt removes the tag. Throws c10::Error otherwise.
void set_tensor_format(const at::Tensor& t, const std::optional<std::string>& format);

// A copy of `src`'s data into `dst` is data in `src`'s format: `dst` takes
// the tag unless it has one of its own (copy_, .to(), clone()).
void copy_tensor_format(const at::Tensor& src, const at::Tensor& dst);

// torch.save / torch.load (torch::jit::TensorBackendMetaRegistry): the tag as
// the dict[str, bool] entry "openreg.format.<name>": true, and back.
void serialize_tensor_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata);
void deserialize_tensor_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata);

} // namespace openreg
