// libFuzzer entry point for the config parser: any bytes, as a config.json or a native model file,
// must either describe or throw mixkv::Error. Anything else escaping (another exception type, a
// crash, a sanitizer report, a timeout on a tiny input) is a finding. See fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const mixkv::model::ModelSource source =
        mixkv::model::parse_model_source("fuzz", "fuzz.json", text);
    const mixkv::model::ModelDesc desc = mixkv::model::describe(source, std::nullopt, {});
    // A described model must satisfy its own invariants.
    mixkv::model::validate(desc);
  } catch (const mixkv::Error&) {
    // Rejecting bad input with a mixkv::Error is the expected outcome.
  }
  return 0;
}
