// libFuzzer entry point for the planner: a model document (a native model file or a config.json)
// up to its last newline, then plan options in the bytes after it (none: the defaults), planned
// and laid out. Each input must plan or throw a mixkv::Error that is not kInternal; anything else
// escaping (another exception, an internal error, a crash, a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace {

// Reads option bytes in order, zero past the end, so a short tail keeps the later defaults.
struct Tail {
  std::string_view bytes;
  std::size_t at = 0;
  std::uint64_t next(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      v = (v << 8) | (at < bytes.size() ? static_cast<unsigned char>(bytes[at]) : 0u);
      ++at;
    }
    return v;
  }
};

mixkv::plan::PlanOptions options_from(std::string_view tail_bytes) {
  Tail t{tail_bytes};
  mixkv::plan::PlanOptions o;
  const std::uint64_t flags = t.next(1);
  o.policy = (flags & 1) != 0 ? mixkv::plan::Policy::kVllm : mixkv::plan::Policy::kMixkv;
  const auto backends = mixkv::backend::backend_names();
  o.backend = *mixkv::backend::parse_backend(backends[(flags >> 1) % backends.size()]);
  // Memory: 1 GiB by default, else any size the bytes give (up to 2^40, the CLI's TiB range).
  const std::uint64_t memory = t.next(5);
  o.memory_bytes = memory == 0 ? std::int64_t{1} << 30 : static_cast<std::int64_t>(memory);
  if (const std::uint64_t block = t.next(2); block != 0) {
    o.block_size = static_cast<std::int64_t>(block);
  }
  // Raw signed 32-bit lengths: negative, zero and huge ones are bad input the planner must name.
  o.max_model_len = static_cast<std::int32_t>(static_cast<std::uint32_t>(t.next(4)));
  if (const auto len = static_cast<std::int32_t>(static_cast<std::uint32_t>(t.next(4))); len != 0) {
    o.request_len = len;
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.rfind('\n');
  const std::string_view doc = newline == std::string_view::npos ? input : input.substr(0, newline);
  const std::string_view tail =
      newline == std::string_view::npos ? std::string_view() : input.substr(newline + 1);
  try {
    const mixkv::model::ModelSource source =
        mixkv::model::parse_model_source("fuzz", "fuzz.json", doc);
    const mixkv::model::ModelDesc desc = mixkv::model::describe(source, std::nullopt, {});
    const mixkv::plan::CachePlan plan = mixkv::plan::make_plan(desc, options_from(tail));
    const auto groups = mixkv::attn::build_attention_groups(desc, plan);
    mixkv::layout::make_geometry(desc, plan, groups);
  } catch (const mixkv::Error& e) {
    // Rejecting bad input is the expected outcome; an internal error on any input is a bug.
    if (e.code() == mixkv::ErrorCode::kInternal) {
      std::fprintf(stderr, "internal error: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
