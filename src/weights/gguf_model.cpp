#include "mixkv/weights/gguf_model.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/model_files.hpp"

namespace mixkv::weights {
namespace {

// Reads `<arch>.<suffix>` keys of one GGUF with the key named in every error.
class ArchKeys {
 public:
  ArchKeys(const GgufFile& file, std::string arch) : f_(file), arch_(std::move(arch)) {}

  std::string key(std::string_view suffix) const { return fmt::format("{}.{}", arch_, suffix); }

  std::optional<std::uint64_t> optional_count(std::string_view suffix) const {
    const std::string k = key(suffix);
    const GgufValue* v = f_.find(k);
    if (v != nullptr && v->is_array()) {
      throw_unsupported(
          fmt::format("{}: metadata '{}' varies per layer (an array); mixkv reads "
                      "GGUF files whose layers all share one value",
                      f_.origin(), k));
    }
    const auto n = f_.get_uint(k);
    if (n && (*n == 0 || *n > std::uint64_t{1} << 31)) {
      throw_invalid(
          fmt::format("{}: metadata '{}' is {}, expected a positive count", f_.origin(), k, *n));
    }
    return n;
  }
  std::uint64_t count(std::string_view suffix) const {
    if (auto n = optional_count(suffix)) return *n;
    throw_invalid(
        fmt::format("{}: metadata '{}' is missing; the GGUF does not describe its {} "
                    "model",
                    f_.origin(), key(suffix), arch_));
  }
  std::optional<double> number(std::string_view suffix) const { return f_.get_float(key(suffix)); }
  std::optional<std::string> string(std::string_view suffix) const {
    return f_.get_string(key(suffix));
  }

 private:
  const GgufFile& f_;
  std::string arch_;
};

std::string cache_dtype_of(const GgufFile& file) {
  // general.file_type follows llama_ftype: 0 is all F32, 32 is mostly BF16.
  const auto ftype = file.get_uint("general.file_type");
  if (ftype == 0u) return "float32";
  if (ftype == 32u) return "bfloat16";
  return "float16";
}

}  // namespace

nlohmann::json hf_config_from_gguf(const GgufFile& file) {
  const auto arch = file.get_string("general.architecture");
  if (!arch) {
    throw_invalid(fmt::format("{}: metadata 'general.architecture' is missing; not a model GGUF",
                              file.origin()));
  }
  if (*arch != "llama") {
    throw_unsupported(fmt::format("{}: GGUF architecture '{}' is not supported; supported: llama",
                                  file.origin(), *arch));
  }
  const ArchKeys k(file, *arch);
  nlohmann::json c;
  c["model_type"] = *arch;
  c["hidden_size"] = k.count("embedding_length");
  c["intermediate_size"] = k.count("feed_forward_length");
  c["num_hidden_layers"] = k.count("block_count");
  const std::uint64_t heads = k.count("attention.head_count");
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = k.optional_count("attention.head_count_kv").value_or(heads);
  if (auto head_dim = k.optional_count("attention.key_length")) c["head_dim"] = *head_dim;
  c["max_position_embeddings"] = k.count("context_length");
  c["rope_theta"] = k.number("rope.freq_base").value_or(10000.0);  // llama.cpp's default
  if (auto eps = k.number("attention.layer_norm_rms_epsilon")) c["rms_norm_eps"] = *eps;

  const auto scaling = k.string("rope.scaling.type");
  if (scaling && *scaling != "none") {
    nlohmann::json s;
    s["rope_type"] = *scaling;
    if (auto factor = k.number("rope.scaling.factor")) s["factor"] = *factor;
    if (auto n = k.optional_count("rope.scaling.original_context_length")) {
      s["original_max_position_embeddings"] = *n;
    }
    c["rope_scaling"] = s;
  } else if (auto factor = k.number("rope.scale_linear"); factor && *factor != 1.0) {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", *factor}};  // older converters
  }

  // The vocabulary is the token list; <arch>.vocab_size, when present, must agree with it.
  const std::vector<std::string>* tokens = file.get_string_array("tokenizer.ggml.tokens");
  const auto stated = k.optional_count("vocab_size");
  if (tokens != nullptr) {
    if (stated && *stated != tokens->size()) {
      throw_invalid(
          fmt::format("{}: metadata '{}' is {} but tokenizer.ggml.tokens lists {} "
                      "tokens",
                      file.origin(), k.key("vocab_size"), *stated, tokens->size()));
    }
    c["vocab_size"] = tokens->size();
  } else if (stated) {
    c["vocab_size"] = *stated;
  }
  // llama.cpp ties the output projection to the embedding when the file has no output.weight.
  c["tie_word_embeddings"] = file.find_tensor("output.weight") == nullptr;
  c["torch_dtype"] = cache_dtype_of(file);
  return c;
}

model::ModelSource model_source_from_gguf(const GgufFile& file, std::string name) {
  return model::ModelSource{std::move(name), file.origin(),
                            std::make_shared<const nlohmann::json>(hf_config_from_gguf(file))};
}

model::ModelSource load_model_source(std::string_view ref) {
  if (auto path = resolve_gguf(ref))
    return model_source_from_gguf(GgufFile::open(*path), std::string(ref));
  return model::load_model_source(ref);
}

model::ModelDesc describe_refs(std::string_view target_ref,
                               std::optional<std::string_view> draft_ref,
                               const model::DescribeOptions& options) {
  return model::describe_refs(target_ref, draft_ref, options, load_model_source);
}

}  // namespace mixkv::weights
