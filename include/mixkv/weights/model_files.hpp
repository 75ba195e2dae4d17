// The real models `make deps` fetches (scripts/fetch-models.sh, checksums in deps/models.sha256)
// into a cache folder outside the source tree, and the built-in names that resolve to them.
// Nothing is downloaded at run time: a missing file is an Error telling to run `make deps`.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace mixkv::weights {

struct FetchedModel {
  std::string_view name;         // built-in name, e.g. "smollm2-135m"
  std::string_view file;         // file name in the model folder
  std::string_view description;  // one line for `mixkv models`
};

std::span<const FetchedModel> fetched_models();
const FetchedModel* find_fetched_model(std::string_view name);

// The model folder: $MIXKV_MODEL_DIR, else $XDG_CACHE_HOME/mixkv/models, else
// $HOME/.cache/mixkv/models (the same rule as scripts/fetch-models.sh).
std::string model_dir();

// The fetched file's path when it exists, else nullopt.
std::optional<std::string> find_fetched_file(const FetchedModel& model);
// The fetched file's path; Error (invalid input) saying to run `make deps` when it is missing.
std::string fetched_file(const FetchedModel& model);

// The GGUF file `ref` names: an existing file that starts with the GGUF magic, or a fetched
// model's name (Error telling to run `make deps` when its file is missing). nullopt otherwise.
std::optional<std::string> resolve_gguf(std::string_view ref);

}  // namespace mixkv::weights
