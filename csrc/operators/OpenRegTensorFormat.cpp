#include "operators/OpenRegTensorFormat.h"

#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace openreg {
namespace {

constexpr std::string_view kKeyPrefix = "openreg.format.";
constexpr size_t kMaxFormatName = 64;

// Immutable once made: TensorImpl's shallow copies (detach, nn.Parameter,
// param.data = t) share it (BackendMeta::clone returns the same object).
struct FormatMeta final : c10::BackendMeta {
  explicit FormatMeta(std::string name) : format(std::move(name)) {}
  const std::string format;
};

const FormatMeta* format_meta(const at::Tensor& t) {
  if (!t.defined()) {
    return nullptr;
  }
  return dynamic_cast<const FormatMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= kMaxFormatName &&
      std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

} // namespace

std::optional<std::string> tensor_format(const at::Tensor& t) {
  const FormatMeta* meta = format_meta(t);
  return meta ? std::optional<std::string>(meta->format) : std::nullopt;
}

void set_tensor_format(const at::Tensor& t, const std::optional<std::string>& format) {
  TORCH_CHECK(t.defined(), "openreg tensor format: got an undefined tensor.");
  TORCH_CHECK(
      t.device().is_privateuseone(), "openreg tensor format: only openreg tensors carry a format, got a ",
      t.device().type(), " tensor; move it to openreg first.");
  if (!format) {
    if (format_meta(t) != nullptr) {
      t.unsafeGetTensorImpl()->set_backend_meta(c10::intrusive_ptr<c10::BackendMeta>());
    }
    return;
  }
  TORCH_CHECK_VALUE(
      valid_name(*format), "openreg tensor format: a format is a name of 1 to ", kMaxFormatName,
      " letters, digits and underscores, got '", *format, "'.");
  t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<FormatMeta>(*format));
}

void copy_tensor_format(const at::Tensor& src, const at::Tensor& dst) {
  const FormatMeta* meta = format_meta(src);
  if (meta == nullptr || !dst.device().is_privateuseone() || format_meta(dst) != nullptr) {
    return;
  }
  dst.unsafeGetTensorImpl()->set_backend_meta(src.unsafeGetTensorImpl()->get_backend_meta_intrusive_ptr());
}

void serialize_tensor_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (const FormatMeta* meta = format_meta(t)) {
    metadata[std::string(kKeyPrefix) + meta->format] = true;
  }
}

void deserialize_tensor_format(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    if (it->first.compare(0, kKeyPrefix.size(), kKeyPrefix) == 0 && it->second) {
      set_tensor_format(t, it->first.substr(kKeyPrefix.size()));
      metadata.erase(it);
      return;
    }
  }
}

} // namespace openreg
