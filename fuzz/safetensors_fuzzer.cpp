// libFuzzer entry point for the safetensors reader (drafter checkpoints): any bytes must either be
// read or throw mixkv::Error. What is read must hold one value per shape element and come back
// the same when written and read again. Anything else (another exception type, a crash, a
// sanitizer report, unbounded memory) is a finding. Seeds: fuzz/safetensors-seeds/, written by
// fuzz/make_safetensors_seeds.py; see fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  mixkv::weights::TensorMap tensors;
  try {
    tensors = mixkv::weights::parse_safetensors(bytes, "fuzz.safetensors");
  } catch (const mixkv::Error& e) {
    // Rejecting bad input is the expected outcome; an internal error is a finding.
    if (e.code() == mixkv::ErrorCode::kInternal) std::abort();
    return 0;
  }
  for (const auto& [name, t] : tensors) {
    if (static_cast<std::int64_t>(t.values.size()) != t.numel()) std::abort();
  }
  const std::vector<std::byte> written = mixkv::weights::serialize_safetensors(tensors);
  const auto again = mixkv::weights::serialize_safetensors(
      mixkv::weights::parse_safetensors(written, "fuzz.safetensors (written again)"));
  if (again != written) std::abort();
  return 0;
}
