#include "mixkv/weights/model_files.hpp"

#include <array>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/gguf.hpp"

namespace mixkv::weights {
namespace {

constexpr std::array<FetchedModel, 1> kModels{{
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
     "SmolLM2-135M-Instruct (llama, 30 layers, Q4_1 GGUF; fetched by `make deps`)"},
}};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::span<const FetchedModel> fetched_models() { return kModels; }

const FetchedModel* find_fetched_model(std::string_view name) {
  for (const FetchedModel& m : kModels) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string model_dir() {
  if (std::string dir = env("MIXKV_MODEL_DIR"); !dir.empty()) return dir;
  if (std::string cache = env("XDG_CACHE_HOME"); !cache.empty()) return cache + "/mixkv/models";
  return env("HOME") + "/.cache/mixkv/models";
}

std::optional<std::string> find_fetched_file(const FetchedModel& model) {
  const std::filesystem::path path = std::filesystem::path(model_dir()) / model.file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  return path.string();
}

std::string fetched_file(const FetchedModel& model) {
  if (auto path = find_fetched_file(model)) return *path;
  throw_invalid(
      fmt::format("{}: {} is not in {}; run `make deps` to fetch it (or set "
                  "MIXKV_MODEL_DIR to the folder that holds it)",
                  model.name, model.file, model_dir()));
}

std::optional<std::string> resolve_gguf(std::string_view ref) {
  std::error_code ec;
  const std::string path(ref);
  if (std::filesystem::is_regular_file(path, ec) && GgufFile::file_has_magic(path)) return path;
  if (const FetchedModel* model = find_fetched_model(ref)) return fetched_file(*model);
  return std::nullopt;
}

}  // namespace mixkv::weights
