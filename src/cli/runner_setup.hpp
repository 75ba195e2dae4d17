// How `generate` and `serve` turn MODEL and --draft into a runner: a GGUF model (smollm2-135m or
// a path: the runner views its mapped tensors, with its tokenizer), a tiny model (generated
// weights) or a checkpoint directory; a drafter model whose layers join the target's plan, or the
// target's own MTP layers; then the drafter object that proposes tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/matmul.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/gguf.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace mixkv::cli {

struct RunnerSetup {
  model::ModelSource source;
  weights::TensorMap weights;
  // A GGUF model: the runner views its tensors; its tokenizer and chat template make prompts.
  std::shared_ptr<const weights::GgufFile> gguf;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // the GGUF's; null for the others
  runner::RunnerOptions options;

  runner::ModelRunner make_runner() const;
};

// MODEL and --draft (empty: none) as a runner's config, weights and options. `max_model_len` 0:
// the model's context, at most 2048 for a GGUF model. Throws Error naming the model or drafter
// that is unknown or does not fit the target.
// `draft_layers`: --draft self's --draft-layers (absent: model::kDefaultSelfDraftLayers; 1 to
// the target's layers - 1).
RunnerSetup prepare_runner(const std::string& model, const std::string& draft, int num_spec_tokens,
                           std::int64_t memory_bytes, std::int64_t max_model_len = 0,
                           int threads = 0, std::optional<int> draft_layers = std::nullopt);

// The drafter object for --draft over `runner` (built from prepare_runner's result): ngram,
// random (seeded), mtp, self, a drafter model (EAGLE-style or DFlash). Null for an empty --draft.
// "oracle" needs the plain outputs and is the caller's; any other name is an Error.
std::unique_ptr<spec::Drafter> make_drafter(const std::string& draft, runner::ModelRunner& runner,
                                            std::uint64_t seed);

// Every id the tokenizer calls an end of generation (EOS, end-of-turn markers): the scheduler's
// stop tokens.
std::vector<tokenizer::TokenId> end_of_generation_ids(const tokenizer::Tokenizer& tok);

bool is_directory(const std::string& ref);

// --weight-order TEXT of generate, bench-generate and serve: the reduction order of the block-
// format weight products (q8_0, q4_0, q4_1; docs/kernels.md). "blocksum" (the default: one
// integer sum per block over packed weights, so plain decoding outruns llama.cpp and several token
// rows cost little more than one; rounded otherwise than llama.cpp) or "ggml" (llama.cpp's bits,
// for agreement with it). `order` holds the text (kDefaultWeightOrder); anything else is refused
// by the option, and by parse_weight_order with an Error naming the flag.
inline constexpr const char* kDefaultWeightOrder = "blocksum";
void add_weight_order_option(CLI::App& cmd, std::string& order);
kernels::ReductionOrder parse_weight_order(const std::string& text);

// --attention-order TEXT of generate, bench-generate and serve (kernels::AttentionOrder):
// "float" (the default) or "bf16-pairs" (q and the softmax weights rounded to bf16, products
// summed in pairs on VDPBF16PS where the CPU has it: verify rows cost less; needs
// --kv-dtype bfloat16 and head sizes that are multiples of 32). Parsed by
// kernels::parse_attention_order with an Error naming the flag.
void add_attention_order_option(CLI::App& cmd, std::string& order);

// --kv-layout TEXT of generate, bench-generate and serve: "NHD" (the default) or "HND"
// (RunnerOptions::kv_layout), parsed by attn::parse_kv_layout.
void add_kv_layout_option(CLI::App& cmd, std::string& kv_layout);

// --kv-dtype TEXT of generate, bench-generate and serve: "auto" (the model's) or a dtype, read
// by dtype_option (model_options.hpp) into RunnerOptions::kv_dtype.
void add_kv_dtype_option(CLI::App& cmd, std::string& dtype);

}  // namespace mixkv::cli
