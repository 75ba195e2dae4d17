#include "mixkv/tokenizer/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mixkv/core/error.hpp"

namespace mixkv::tokenizer {
namespace {

// GPT-2's word split (the regex of OpenAI's GPT-2 encoder), which llama.cpp applies to most
// byte-level BPE vocabularies. Text it leaves between matches stays a piece of its own.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

struct Family {
  std::vector<std::string_view> names;  // tokenizer.ggml.pre values
  std::vector<std::string_view> regexes;
};

// The pre-tokenizer families and their regex sequences, as llama.cpp's llama_vocab::impl::load
// assigns them to tokenizer.ggml.pre values.
const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {{"gpt2", "gpt-2", "mpt", "olmo", "jais"}, {kGpt2}},
      // Each digit on its own, then GPT-2's split (SmolLM, StarCoder and the like).
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"},
       {R"(\p{N})", kGpt2}},
  };
  return table;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name) {
  const Family* family = nullptr;
  for (const Family& f : families()) {
    for (std::string_view n : f.names) {
      if (n == name) family = &f;
    }
  }
  if (family == nullptr) {
    throw_unsupported(
        fmt::format("pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; "
                    "supported: {}",
                    name, fmt::join(names(), ", ")));
  }
  for (std::string_view pattern : family->regexes) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    // UCP: \s, \p{..} and friends follow Unicode properties, as the pre-tokenizer regexes mean.
    // MATCH_INVALID_UTF: invalid UTF-8 is never matched instead of failing the whole match.
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                                &error_offset, nullptr);
    if (regex->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      throw_internal(fmt::format("pre-tokenizer '{}': regex does not compile at offset {}: {}",
                                 name, error_offset,
                                 reinterpret_cast<const char*>(message.data())));
    }
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // optional: falls back to interpreting
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string_view> PreTokenizer::names() {
  std::vector<std::string_view> out;
  for (const Family& f : families()) out.insert(out.end(), f.names.begin(), f.names.end());
  return out;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  // One (start, end) pair is all a split needs: no regex here has capture groups that matter.
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  if (data == nullptr) throw_internal("pre-tokenizer: out of memory for PCRE2 match data");
  pcre2_match_data* match = data.get();
  for (const auto& regex : regexes_) {
    std::vector<std::string_view> next;
    next.reserve(pieces.size());
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      std::size_t start = 0;  // where the next unmatched gap begins
      std::size_t at = 0;     // where the next search begins
      while (at < piece.size()) {
        const int rc = pcre2_match(regex->code, subject, piece.size(), at, 0, match, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          std::array<PCRE2_UCHAR, 256> message{};
          pcre2_get_error_message(rc, message.data(), message.size());
          throw_internal(fmt::format("pre-tokenizer '{}': matching failed: {}", name_,
                                     reinterpret_cast<const char*>(message.data())));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const std::size_t begin = ovector[0], end = ovector[1];
        if (end == begin) {  // none of these regexes match empty text; step over it regardless
          at = begin + 1;
          while (at < piece.size() && (static_cast<unsigned char>(piece[at]) & 0xC0) == 0x80) ++at;
          continue;
        }
        if (begin > start) next.push_back(piece.substr(start, begin - start));
        next.push_back(piece.substr(begin, end - begin));
        start = at = end;
      }
      if (start < piece.size()) next.push_back(piece.substr(start));
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace mixkv::tokenizer
