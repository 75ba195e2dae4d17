// Orchestrates describing a target and its drafter: parse the documents, recognise the drafter,
// resolve cache dtypes and shard everything for one tensor-parallel rank.
#include "mixkv/model/describe.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "config_reader.hpp"
#include "layer_template.hpp"
#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/core/read_file.hpp"
#include "mixkv/model/model_json.hpp"
#include "weight_estimate.hpp"

namespace mixkv::model {
namespace {

// Speculative tokens per step when a chain drafter (EAGLE, draft model) gives no number itself.
constexpr int kDefaultChainSpecTokens = 3;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

bool mentions(const ConfigReader& root, std::string_view key, std::string_view needle) {
  if (!root.has(key)) return false;
  return lower(root.raw(key).dump()).find(needle) != std::string::npos;
}

DraftKind detect_draft_kind(const ConfigReader& root) {
  if (mentions(root, "architectures", "eagle3")) return DraftKind::kEagle3;
  if (mentions(root, "architectures", "eagle")) return DraftKind::kEagle;
  if (mentions(root, "architectures", "dflash") || mentions(root, "auto_map", "dflash") ||
      root.has("dflash_config")) {
    return DraftKind::kDflash;
  }
  // The EAGLE authors' own EAGLE-3 training configs say LlamaForCausalLM; a reduced draft
  // vocabulary (with its d2t/t2d maps) is what, of the remaining drafters, only EAGLE-3 has.
  if (root.has("draft_vocab_size")) return DraftKind::kEagle3;
  return DraftKind::kModel;
}

std::vector<int> to_ints(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

struct Drafter {
  FamilyLayers family;
  DraftInfo info;
};

// The family an EAGLE head's architecture names ("LlamaForCausalLMEagle3" -> llama,
// "GptOssForCausalLMEagle3" -> gpt_oss), if mixkv knows it. EAGLE heads are built by their
// architecture class whatever model_type their config borrows (SpecForge writes phi3 or qwen3
// model types beside LlamaForCausalLMEagle3), so the architecture decides how the head is read.
std::optional<std::string> eagle_architecture_family(const ConfigReader& root) {
  if (!root.has("architectures") || !root.raw("architectures").is_array()) return std::nullopt;
  const auto squash = [](std::string_view s) {
    std::string out;
    for (char ch : lower(s)) {
      if (ch != '_') out += ch;
    }
    return out;
  };
  for (const auto& entry : root.raw("architectures")) {
    if (!entry.is_string()) continue;
    std::string arch = squash(entry.get<std::string>());
    for (std::string_view prefix : {"eagle3", "eagle"}) {
      if (arch.starts_with(prefix)) arch = arch.substr(prefix.size());
    }
    const auto at = arch.find("forcausallm");
    if (at == std::string::npos || at == 0) continue;
    arch = arch.substr(0, at);
    for (const std::string& family : supported_model_types()) {
      if (squash(family) == arch) return family;
    }
  }
  return std::nullopt;
}

Drafter describe_drafter(const ConfigReader& root) {
  Drafter d;
  d.info.kind = detect_draft_kind(root);
  const bool eagle = d.info.kind == DraftKind::kEagle || d.info.kind == DraftKind::kEagle3;
  const std::optional<std::string> by_architecture =
      eagle ? eagle_architecture_family(root) : std::nullopt;
  d.family = by_architecture ? describe_family(root, *by_architecture) : describe_family(root);
  const std::optional<ConfigReader> dflash = root.optional_child("dflash_config");
  std::optional<bool> causal;
  switch (d.info.kind) {
    case DraftKind::kEagle:
    case DraftKind::kEagle3: {
      // EAGLE heads are plain causal decoder layers, whatever family their config borrows:
      // no window unless the config lists layer types explicitly, and no sinks.
      const ConfigReader& lm = root;
      for (auto& t : d.family.layers) {
        if (!lm.has("layer_types") && t.desc.kind == LayerKind::kSliding) {
          t.desc.kind = LayerKind::kFull;
          t.desc.window.reset();
        }
        t.desc.sinks = false;
      }
      if (auto eagle = root.optional_child("eagle_config")) {
        if (eagle->has("eagle_aux_hidden_state_layer_ids")) {
          d.info.target_layer_ids = to_ints(eagle->int_list("eagle_aux_hidden_state_layer_ids"));
        }
      }
      break;
    }
    case DraftKind::kDflash: {
      if (root.has("block_size")) {
        d.info.block_size = static_cast<int>(root.positive_int("block_size"));
      } else if (dflash && dflash->has("block_size")) {
        d.info.block_size = static_cast<int>(dflash->positive_int("block_size"));
      } else {
        root.fail("block_size",
                  "is missing; a DFlash drafter needs its block size (tokens per drafted block)");
      }
      if (*d.info.block_size < 2)
        root.fail("block_size", "must be at least 2 (an anchor and one drafted token)");
      if (dflash && dflash->has("target_layer_ids")) {
        d.info.target_layer_ids = to_ints(dflash->int_list("target_layer_ids"));
      } else if (root.has("target_layer_ids")) {
        d.info.target_layer_ids = to_ints(root.int_list("target_layer_ids"));
      }
      // DFlash attends bidirectionally within the block unless the config says otherwise.
      causal = root.optional_bool("is_causal");
      if (!causal && dflash) causal = dflash->optional_bool("is_causal");
      for (auto& t : d.family.layers) t.desc.causal = causal.value_or(false);
      break;
    }
    case DraftKind::kMtp:
    case DraftKind::kModel:
    case DraftKind::kSelf:  // never read from a config: describe_self
      break;
  }
  for (auto& t : d.family.layers) {
    t.desc.owner = Owner::kDraft;
    t.desc.name = fmt::format("draft.layers.{}", t.desc.index);
  }
  return d;
}

int default_spec_tokens(const std::optional<DraftInfo>& info, std::int64_t mtp_steps) {
  if (!info) return 0;
  switch (info->kind) {
    case DraftKind::kDflash:
      return *info->block_size - 1;  // one forward drafts the block minus its anchor
    case DraftKind::kMtp:
      return static_cast<int>(mtp_steps);  // one token per prediction step
    default:
      return kDefaultChainSpecTokens;
  }
}

void check_range(std::string_view option, int value, int min, int max) {
  if (value < min || value > max) {
    throw_invalid(fmt::format("{} is {}, expected {}..{}", option, value, min, max));
  }
}

// Applies --layer-kv-dtype overrides to attention layers; a pattern that matches none is an error.
void apply_overrides(std::vector<LayerDesc>& layers,
                     const std::vector<LayerDtypeOverride>& overrides) {
  for (const auto& o : overrides) {
    bool matched = false;
    for (auto& layer : layers) {
      // A DSA indexer's key cache keeps its own fp8 format (it is not a KV cache).
      if (is_attention(layer.kind) && !layer.indexer &&
          fnmatch(o.pattern.c_str(), layer.name.c_str(), 0) == 0) {
        layer.kv_dtype = o.dtype;
        matched = true;
      }
    }
    if (!matched) {
      std::vector<std::string> examples;
      for (const auto& layer : layers) {
        if (is_attention(layer.kind) && !layer.indexer && examples.size() < 3)
          examples.push_back(layer.name);
      }
      throw_invalid(
          fmt::format("--layer-kv-dtype '{}={}' matches no attention layer; attention layers "
                      "are named like {} (globs such as 'draft.*' work)",
                      o.pattern, to_string(o.dtype), fmt::join(examples, ", ")));
    }
  }
}

ModelDesc finalize(const std::string& model, const std::optional<std::string>& draft_name,
                   const FamilyLayers& target, const std::vector<LayerTemplate>& draft_layers,
                   std::optional<DraftInfo> draft_info, const DescribeOptions& options) {
  ModelDesc desc;
  desc.model = model;
  desc.draft = draft_name;
  desc.tp = options.tp.value_or(1);
  check_range("--tp", desc.tp, 1, kMaxTp);
  desc.num_spec_tokens =
      options.num_spec_tokens.value_or(default_spec_tokens(draft_info, target.mtp_steps));
  check_range("--num-spec-tokens", desc.num_spec_tokens, 0, kMaxSpecTokens);
  desc.draft_info = std::move(draft_info);

  // The drafter runs in the target's dtype (as serving engines load it), so "auto" means the
  // target's dtype for both.
  const DType model_dtype = target.model_dtype;
  FinalizeOptions fo;
  fo.tp = desc.tp;
  fo.num_spec_tokens = desc.num_spec_tokens;
  fo.conv_dtype = model_dtype;
  fo.ssm_dtype = options.ssm_dtype.value_or(target.ssm_dtype.value_or(model_dtype));
  fo.kv_dtype = options.kv_dtype.value_or(model_dtype);
  for (const auto& t : target.layers) desc.layers.push_back(finalize_layer(t, fo));
  fo.kv_dtype = options.draft_kv_dtype.value_or(options.kv_dtype.value_or(model_dtype));
  for (const auto& t : draft_layers) desc.layers.push_back(finalize_layer(t, fo));

  apply_overrides(desc.layers, options.layer_kv_dtypes);
  if (desc.draft_info) {
    // Hidden states are taken from target decoder layers; indices must exist.
    std::int64_t num_target_layers = target.num_hidden_layers;
    for (int id : desc.draft_info->target_layer_ids) {
      if (id >= num_target_layers) {
        throw_invalid(
            fmt::format("drafter {}: target_layer_ids names layer {}, but the target {} has {} "
                        "layers; the drafter was trained for another target",
                        draft_name.value_or("?"), id, model, num_target_layers));
      }
    }
  }
  validate(desc);
  return desc;
}

// A drafter shares the target's tokenizer (its token ids are the target's), and EAGLE and DFlash
// heads read the target's hidden states and embeddings, so these numbers must agree; a mismatch
// means the drafter was trained for another target, which would otherwise only show as garbage
// proposals at run time.
void check_drafter_fits(const std::string& target_name, const FamilyLayers& target,
                        const std::string& draft_name, const Drafter& drafter,
                        const ConfigReader& draft_root) {
  const auto mismatch = [&](std::string_view field, std::int64_t draft_value,
                            std::int64_t target_value) {
    throw_invalid(
        fmt::format("drafter {}: {} {} differs from the target {}'s {}; the drafter was "
                    "trained for another target",
                    draft_name, field, draft_value, target_name, target_value));
  };
  // EAGLE-3's reduced draft_vocab_size maps back into vocab_size, which is what must agree.
  if (drafter.family.vocab_size && target.vocab_size &&
      *drafter.family.vocab_size != *target.vocab_size) {
    mismatch("vocab_size", *drafter.family.vocab_size, *target.vocab_size);
  }
  if (drafter.info.kind == DraftKind::kModel || !target.hidden_size) return;
  // An EAGLE-3 head narrower than its target states the width it reads as target_hidden_size.
  std::string_view field = "hidden_size";
  std::optional<std::int64_t> fed = drafter.family.hidden_size;
  if (drafter.info.kind != DraftKind::kDflash && draft_root.has("target_hidden_size")) {
    field = "target_hidden_size";
    fed = draft_root.positive_int("target_hidden_size");
  }
  if (fed && *fed != *target.hidden_size) mismatch(field, *fed, *target.hidden_size);
}

// Applies options to a native model file, which is already sharded and sized.
ModelDesc adjust_native(ModelDesc desc, const DescribeOptions& options, std::string_view origin) {
  if (options.tp && *options.tp != desc.tp) {
    throw_invalid(
        fmt::format("{}: this model file is already per-rank for tp {}; --tp {} cannot be "
                    "applied to it (describe the source config with --tp instead)",
                    origin, desc.tp, *options.tp));
  }
  if (options.num_spec_tokens && *options.num_spec_tokens != desc.num_spec_tokens) {
    throw_invalid(
        fmt::format("{}: this model file is sized for {} speculative tokens; --num-spec-tokens "
                    "{} cannot be applied to it (describe the source config instead)",
                    origin, desc.num_spec_tokens, *options.num_spec_tokens));
  }
  for (auto& layer : desc.layers) {
    if (layer.indexer) continue;  // its fp8 key format is fixed
    if (is_attention(layer.kind)) {
      auto chosen =
          layer.owner == Owner::kDraft
              ? options.draft_kv_dtype.has_value() ? options.draft_kv_dtype : options.kv_dtype
              : options.kv_dtype;
      if (chosen) layer.kv_dtype = *chosen;
    } else if (options.ssm_dtype) {
      for (auto& tensor : layer.state) {
        if (!tensor.name.ends_with("conv")) tensor.dtype = *options.ssm_dtype;
      }
    }
  }
  apply_overrides(desc.layers, options.layer_kv_dtypes);
  validate(desc);
  return desc;
}

std::string read_file(const std::filesystem::path& path) {
  return read_regular_file(path.string(), kMaxConfigFileBytes, "model file");
}

}  // namespace

ModelSource parse_model_source(std::string name, std::string origin, std::string_view text) {
  nlohmann::json doc;
  try {
    doc = parse_config_json(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_invalid(fmt::format("{}: invalid JSON at byte {}; fix the file (is it truncated?)",
                              origin, e.byte));
  } catch (const nlohmann::json::out_of_range&) {
    // The parser reports a literal such as 1e400 this way rather than as a parse_error.
    throw_invalid(
        fmt::format("{}: invalid JSON: a number is too large to represent; fix the file", origin));
  }
  if (!doc.is_object())
    throw_invalid(fmt::format("{}: expected a JSON object at the top level", origin));
  if (!is_native_model_file(doc)) apply_family_defaults(doc);
  return ModelSource{std::move(name), std::move(origin),
                     std::make_shared<const nlohmann::json>(std::move(doc))};
}

ModelSource load_model_source(std::string_view ref) {
  namespace fs = std::filesystem;
  const fs::path path{std::string(ref)};
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path config = path / "config.json";
    if (!fs::exists(config, ec)) {
      throw_invalid(fmt::format("{} is a directory without a config.json; point at the config file",
                                path.string()));
    }
    return parse_model_source(std::string(ref), config.string(), read_file(config));
  }
  if (fs::exists(path, ec))
    return parse_model_source(std::string(ref), path.string(), read_file(path));
  if (const auto* builtin = builtin::find_builtin(ref)) {
    return parse_model_source(std::string(ref), fmt::format("built-in {}", ref),
                              builtin->config_json);
  }
  throw_invalid(
      fmt::format("unknown model '{}': it is neither a built-in model (`mixkv models` lists "
                  "them) nor an existing file or directory",
                  ref));
}

LayerDtypeOverride parse_layer_dtype_override(std::string_view text) {
  const auto eq = text.rfind('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size()) {
    throw_invalid(
        fmt::format("--layer-kv-dtype '{}' is not NAME=DTYPE (e.g. 'draft.layers.0=fp8')", text));
  }
  auto dtype = parse_dtype(text.substr(eq + 1));
  if (!dtype) {
    throw_invalid(fmt::format("--layer-kv-dtype '{}': unknown dtype '{}'; use one of {}", text,
                              text.substr(eq + 1), fmt::join(dtype_names(), ", ")));
  }
  return LayerDtypeOverride{std::string(text.substr(0, eq)), *dtype};
}

ModelDesc describe(const ModelSource& target, const std::optional<ModelSource>& draft,
                   const DescribeOptions& options) {
  if (is_native_model_file(*target.doc)) {
    ModelDesc desc = model_desc_from_json(*target.doc, target.origin);
    if (draft) {
      throw_invalid(
          fmt::format("{}: --draft is not supported with a native model file; list the "
                      "drafter's layers (owner \"draft\") in the file instead",
                      target.origin));
    }
    return adjust_native(std::move(desc), options, target.origin);
  }
  const ConfigReader target_root(*target.doc, target.origin);
  const FamilyLayers family = describe_family(target_root);
  if (!draft) {
    ModelDesc desc = finalize(target.name, std::nullopt, family, {}, std::nullopt, options);
    desc.facts = model_facts(target_root, family, std::nullopt, desc.tp);
    return desc;
  }
  if (is_native_model_file(*draft->doc)) {
    throw_invalid(
        fmt::format("{}: a native model file cannot be used as --draft; give the drafter's "
                    "config.json, or one native file that lists both",
                    draft->origin));
  }
  const ConfigReader draft_root(*draft->doc, draft->origin);
  Drafter drafter = describe_drafter(draft_root);
  if (drafter.info.kind == DraftKind::kEagle3 && drafter.info.target_layer_ids.empty()) {
    // EAGLE-3's default taps: early, middle and late target layers.
    const int n = static_cast<int>(family.num_hidden_layers);
    drafter.info.target_layer_ids = {std::min(2, n - 1), n / 2, std::max(0, n - 3)};
  }
  ModelDesc desc =
      finalize(target.name, draft->name, family, drafter.family.layers, drafter.info, options);
  // After finalize, so that a drafter tapping layers the target lacks is reported as such first.
  check_drafter_fits(target.name, family, draft->name, drafter, draft_root);
  desc.facts = model_facts(target_root, family,
                           DrafterShape{drafter.info.kind, &draft_root, &drafter.family,
                                        drafter.info.target_layer_ids.size()},
                           desc.tp);
  return desc;
}

ModelDesc describe_mtp(const ModelSource& target, const DescribeOptions& options) {
  if (is_native_model_file(*target.doc)) {
    throw_invalid(fmt::format("{}: --draft mtp needs a HuggingFace config that declares MTP layers",
                              target.origin));
  }
  const ConfigReader target_root(*target.doc, target.origin);
  const FamilyLayers family = describe_family(target_root);
  if (family.mtp_layers.empty()) {
    throw_invalid(
        fmt::format("{}: --draft mtp, but the config declares no MTP layers "
                    "(num_nextn_predict_layers or mtp_num_hidden_layers)",
                    target.origin));
  }
  ModelDesc desc = finalize(target.name, std::string(kMtpDraft), family, family.mtp_layers,
                            DraftInfo{DraftKind::kMtp, std::nullopt, {}}, options);
  desc.facts = model_facts(target_root, family, DrafterShape{DraftKind::kMtp}, desc.tp);
  return desc;
}

ModelDesc describe_self(const ModelSource& target, const DescribeOptions& options) {
  if (is_native_model_file(*target.doc)) {
    throw_invalid(fmt::format(
        "{}: --draft self needs a HuggingFace config or GGUF (a native model file lists its "
        "drafter's layers itself)",
        target.origin));
  }
  const ConfigReader target_root(*target.doc, target.origin);
  const FamilyLayers family = describe_family(target_root);
  const int layers = static_cast<int>(family.layers.size());
  const int shared = options.draft_layers.value_or(std::min(kDefaultSelfDraftLayers, layers - 1));
  if (shared < 1 || shared >= layers) {
    throw_invalid(fmt::format(
        "--draft-layers {}: a self drafter runs 1 to {} of {}'s {} layers (all of them would "
        "be the target itself)",
        shared, layers - 1, target.name, layers));
  }
  for (int i = 0; i < shared; ++i) {
    const LayerDesc& l = family.layers[static_cast<std::size_t>(i)].desc;
    if (is_recurrent(l.kind)) {
      throw_invalid(fmt::format(
          "--draft self --draft-layers {}: {}'s layer {} is {}, whose recurrent state drafting "
          "would advance; a self drafter shares attention layers only ({})",
          shared, target.name, l.name, to_string(l.kind),
          i == 0 ? "this model's first layer is recurrent: choose another drafter"
                 : fmt::format("use --draft-layers {} or fewer", i)));
    }
  }
  DraftInfo info{DraftKind::kSelf, std::nullopt, {}};
  info.shared_target_layers = shared;
  ModelDesc desc = finalize(target.name, std::string(kSelfDraft), family, {}, info, options);
  // The drafter's weights are the target's: nothing to add.
  desc.facts = model_facts(target_root, family, std::nullopt, desc.tp);
  return desc;
}

ModelDesc describe_refs(std::string_view target_ref, std::optional<std::string_view> draft_ref,
                        const DescribeOptions& options, SourceLoader load) {
  ModelSource target = load(target_ref);
  if (draft_ref && *draft_ref == kMtpDraft) return describe_mtp(target, options);
  if (draft_ref && *draft_ref == kSelfDraft) return describe_self(target, options);
  if (options.draft_layers) {
    throw_invalid(
        "--draft-layers is the number of target layers of --draft self; give --draft self");
  }
  std::optional<ModelSource> draft;
  if (draft_ref) draft = load(*draft_ref);
  return describe(target, draft, options);
}

}  // namespace mixkv::model
