// libFuzzer entry point for what a prefill/decode transfer peer sends: any bytes as the peer's
// layout descriptor (JSON), against a real local side (tiny-swa with tiny-eagle). The peer is the
// prefill side for inputs of even length and the decode side for odd ones. descriptor_from_json,
// reconcile and plan_pull must refuse with a bad-input mixkv::Error or plan runs inside both
// sides' tensors; anything else (another exception, an internal error, a crash, a sanitizer
// report) is a finding. tests/transfer/descriptor_fuzz_test.cpp does the same in CI. Seeds:
// fuzz/descriptor-seeds/, see fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "mixkv/core/error.hpp"
#include "mixkv/transfer/layout_descriptor.hpp"
#include "mixkv/transfer/transfer_plan.hpp"
#include "transfer/transfer_test_support.hpp"

namespace {

namespace tr = mixkv::transfer;

constexpr std::int64_t kTokens = 200;

// A block table for `d`'s groups: one block per block_size tokens, one for a recurrent group.
bool blocks_for(const tr::LayoutDescriptor& d, tr::RequestBlocks& out) {
  std::int64_t next = 1;
  for (const tr::GroupLayout& g : d.groups) {
    const bool recurrent = g.behaviour == "recurrent";
    if (!recurrent && (g.block_size <= 0 || kTokens / g.block_size > 4096)) return false;
    const std::int64_t n = recurrent ? 1 : (kTokens + g.block_size - 1) / g.block_size;
    std::vector<std::int64_t> ids;
    for (std::int64_t i = 0; i < n; ++i) ids.push_back(next++);
    out.groups.push_back(std::move(ids));
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static tr::testing::Side local =
      tr::testing::make_side(tr::testing::side("tiny-swa", "tiny-eagle"));
  static const tr::RequestBlocks local_blocks = tr::testing::make_blocks(local, kTokens, 3);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool peer_is_prefill = size % 2 == 0;
  try {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return 0;
    const tr::LayoutDescriptor peer = tr::descriptor_from_json(j);
    const tr::LayoutDescriptor& pre = peer_is_prefill ? peer : local.descriptor;
    const tr::LayoutDescriptor& dec = peer_is_prefill ? local.descriptor : peer;
    tr::reconcile(pre, dec);
    tr::RequestBlocks peer_blocks;
    if (!blocks_for(peer, peer_blocks)) return 0;
    const tr::PullPlan plan =
        tr::plan_pull(pre, dec, peer_is_prefill ? peer_blocks : local_blocks,
                      peer_is_prefill ? local_blocks : peer_blocks, {kTokens, 0});
    if (!tr::testing::run_outside_tensors(plan, pre, dec).empty()) std::abort();
  } catch (const mixkv::Error& e) {
    if (e.code() != mixkv::ErrorCode::kInvalidInput) std::abort();
  }
  return 0;
}
