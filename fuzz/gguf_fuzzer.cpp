// libFuzzer entry point for the GGUF reader and what reads a parsed GGUF (the model config, the
// tokenizer, dequantisation): any bytes must either be read or throw mixkv::Error. Anything else
// (another exception type, a crash, a sanitizer report, unbounded memory) is a finding. The seed
// corpus is written by the weights tests' builder, see fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/dequantize.hpp"
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/gguf_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const mixkv::weights::GgufFile file = mixkv::weights::GgufFile::parse(bytes, "fuzz.gguf");
    for (const auto& t : file.tensors()) {
      // One row of each tensor the reader can decode: the views must lie inside the input.
      if (!mixkv::weights::can_dequantize(t.type) || t.numel() == 0) continue;
      const std::int64_t row = t.row_elements();
      std::vector<float> out(static_cast<std::size_t>(row));
      mixkv::weights::dequantize(
          t.type, t.bytes.first(static_cast<std::size_t>(mixkv::weights::ggml_bytes(t.type, row))),
          out);
    }
    try {
      (void)mixkv::weights::hf_config_from_gguf(file);
    } catch (const mixkv::Error&) {
    }
    const auto tok = mixkv::tokenizer::tokenizer_from_gguf(file);
    (void)tok->encode("Hello <|im_start|> world 123 \xF0\x9F\x91\x8B");
  } catch (const mixkv::Error&) {
    // Rejecting bad input with a mixkv::Error is the expected outcome.
  }
  return 0;
}
