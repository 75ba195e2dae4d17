// Building a ModelDesc: from a HuggingFace config.json (any supported family, also nested under
// `text_config`), a drafter config, a built-in model, or a native mixkv model file; then tensor-
// parallel sharding, speculative-token state growth and cache dtype choices.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mixkv/core/dtype.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::model {

// A parsed model document and where it came from (used in every error message).
struct ModelSource {
  std::string name;    // what the user called it: built-in name or path
  std::string origin;  // "built-in qwen3-8b" or the file path, for errors
  std::shared_ptr<const nlohmann::json> doc;
};

// Parses `text` as a model document. Throws Error naming `origin` on invalid JSON.
ModelSource parse_model_source(std::string name, std::string origin, std::string_view text);

// The largest config.json or native model file mixkv reads (docs/model.md): real configs are a
// few KiB, and a native file of 4,096 layers a few MiB.
inline constexpr std::int64_t kMaxConfigFileBytes = std::int64_t{16} << 20;  // 16 MiB

// Resolves a model reference: a path to a JSON file, a directory holding config.json, or a
// built-in name. Throws Error when it is none of these, or when the file is not a regular file of
// at most kMaxConfigFileBytes.
ModelSource load_model_source(std::string_view ref);

// Uses the target's own multi-token-prediction layers as the drafter.
inline constexpr std::string_view kMtpDraft = "mtp";
// Self-speculative drafting: the target's first DescribeOptions::draft_layers layers, then its
// final norm and LM head; those layers' KV is the target's own (DraftKind::kSelf).
inline constexpr std::string_view kSelfDraft = "self";
// The default number of target layers a self drafter runs: on SmolLM2 (not trained for early
// exit) no depth pays, and 4 loses least (docs/engine.md, "Self-speculative drafting").
inline constexpr int kDefaultSelfDraftLayers = 4;

// A per-layer cache dtype override: layers whose name matches `pattern` (shell glob) use `dtype`.
struct LayerDtypeOverride {
  std::string pattern;
  DType dtype = DType::kBfloat16;
};

struct DescribeOptions {
  std::optional<int> tp;                // default 1 (or the native file's own value)
  std::optional<int> num_spec_tokens;   // default: 0 without a drafter, else the drafter's natural
  std::optional<DType> kv_dtype;        // attention cache dtype of target layers; nullopt = auto
  std::optional<DType> draft_kv_dtype;  // drafter layers; nullopt = follow kv_dtype
  std::optional<DType> ssm_dtype;       // recurrent temporal/SSM state; nullopt = auto
  std::vector<LayerDtypeOverride> layer_kv_dtypes;  // applied last, in order
  // kSelfDraft only: the target layers the drafter runs (--draft-layers); nullopt: the default.
  std::optional<int> draft_layers;
};

// Parses "NAME=DTYPE" (NAME may be a glob such as "draft.*"). Throws Error on bad syntax or dtype.
LayerDtypeOverride parse_layer_dtype_override(std::string_view text);

// Describes `target` and, when given, its drafter (a source, or nullopt). `draft_name` may be
// kMtpDraft to use the target's MTP layers. Throws Error on any bad input.
ModelDesc describe(const ModelSource& target, const std::optional<ModelSource>& draft,
                   const DescribeOptions& options);
ModelDesc describe_mtp(const ModelSource& target, const DescribeOptions& options);
// The target with a self-speculative drafter over its first draft_layers layers (kSelfDraft):
// no drafter layer, DraftInfo::shared_target_layers set. Throws Error when the count is not
// 1 .. layers - 1, or a shared layer keeps recurrent state (drafting would advance it).
ModelDesc describe_self(const ModelSource& target, const DescribeOptions& options);

// Resolves a model reference to a source; load_model_source is the default, a higher module may
// pass one that knows more kinds of file (weights::load_model_source reads GGUF files too).
using SourceLoader = ModelSource (*)(std::string_view ref);

// Convenience for the CLI and tests: resolves references (built-in, file, "mtp" or "self") and
// describes.
ModelDesc describe_refs(std::string_view target_ref, std::optional<std::string_view> draft_ref,
                        const DescribeOptions& options, SourceLoader load = load_model_source);

// The supported HuggingFace model_type values.
std::vector<std::string> supported_model_types();

}  // namespace mixkv::model
