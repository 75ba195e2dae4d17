// llama.cpp's attention numerics (attention_ggml.hpp). Facts from ggml-cpu of the pinned build
// (GGML_NATIVE off, AVX-512F/DQ on, no llamafile GEMM for one row):
//   ggml_vec_dot_f16: 4 accumulators of 16 lanes over blocks of 64 elements, each lane a fused
//     multiply-add chain; accumulators folded 0+2, 1+3, then 0+1; the 16 lanes by
//     _mm512_reduce_add_ps (GCC: upper 8 + lower 8, upper 4 + lower 4, [0]+[2] and [1]+[3],
//     then those two); the elements after the last block of 64 added one by one in double.
//   ggml_soft_max_ext with a causal mask: x * scale (+0 or -inf), the max, exp(x - max) 16 at a
//     time with ggml_v_expf, each 16's sum (the same lane fold) added in double, 1 / sum in
//     double rounded to float, times each exp.
//   The f32 inputs of both products (the query, the probabilities) are rounded to f16 (RNE) as
//   ggml_mul_mat converts src1 to the f16 dot's type; the key count of the KQV product is the
//   cache's n_kv: the used cells padded to 32 (at least 32), the extra cells' probabilities 0.
// Products of two f16 values are exact in float, so a fused multiply-add equals a multiply then an
// add here; the code writes them as that. Compiled with -ffp-contract=off (src/CMakeLists.txt).
#include "mixkv/kernels/attention_ggml.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

// The hot loops are compiled twice, for the baseline and for AVX2 + FMA (wider vectors, fused
// multiply-adds inline instead of libm's fmaf), and chosen once at run time; the arithmetic is
// the same written operations either way, so the bits are too.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXKV_GGML_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define MIXKV_GGML_INLINE [[gnu::always_inline]] inline
#else
#define MIXKV_GGML_INLINE inline
#endif

namespace mixkv::kernels {
namespace {

constexpr int kLanes = 16;  // one __m512 of floats
constexpr int kBlock = 64;  // GGML_F16_STEP: 4 accumulators of 16 lanes

// _mm512_reduce_add_ps as GCC 12 writes it.
MIXKV_GGML_INLINE float reduce16(const float* v) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// GGML_F16_VEC_REDUCE: the four 16-lane accumulators of a block folded, then the lanes.
MIXKV_GGML_INLINE float reduce64(const float* acc) {
  float s[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    s[l] = (acc[l] + acc[2 * kLanes + l]) + (acc[kLanes + l] + acc[3 * kLanes + l]);
  }
  return reduce16(s);
}

// ggml_vec_dot_f16 over n values already widened from f16.
MIXKV_GGML_INLINE float dot_f16(const float* x, const float* y, std::int64_t n) {
  const std::int64_t np = n & ~std::int64_t{kBlock - 1};
  float acc[kBlock] = {};
  for (std::int64_t i = 0; i < np; i += kBlock) {
    for (int a = 0; a < kBlock; ++a) acc[a] += x[i + a] * y[i + a];
  }
  double sum = reduce64(acc);
  for (std::int64_t i = np; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

// fp16 bits to float by a table of all 65536 values (fp16_to_float's, exact).
const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) t[b] = fp16_to_float(static_cast<std::uint16_t>(b));
    return t;
  }();
  return table.data();
}

void decode_f16_table(const std::byte* bytes, std::int64_t n, const float* table, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, 2);
    out[i] = table[bits];
  }
}

MIXKV_GGML_INLINE float expf_inline(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // _mm512_scalef_ps: j * 2^n rounded once (|n| <= 192 here, an integer). j lies in [0.7, 1.5),
  // so for n in [-125, 127] the product is normal and one multiply by 2^n is exact.
  const int e = static_cast<int>(n);
  if (e >= -125 && e <= 127)
    return j * std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
  return std::ldexp(j, e);
}

// x rounded to the nearest fp16 value, ties to even (float_to_fp16 then back, faster): adding
// m = 2^(e + 13), e the exponent of |x| (at least fp16's -14), leaves |x| rounded to a multiple of
// 2^(e - 10), 11 significant bits, by the float add's own round-to-nearest-even; subtracting m
// again is exact (Sterbenz). At or above 65520 fp16 rounds to infinity.
MIXKV_GGML_INLINE float fp16_round_inline(float x) {
  const float a = std::fabs(x);
  if (!(a < 65520.0f)) return std::isnan(x) ? x : std::copysign(HUGE_VALF, x);
  const std::uint32_t e = std::max(std::bit_cast<std::uint32_t>(a) & 0x7F800000u, 0x38800000u);
  const float m = std::bit_cast<float>(e) * 8192.0f;
  return std::copysign((a + m) - m, x);
}

// One query head's attention over n keys (K and V widened from f16): scores, softmax, KQV.
struct HeadArgs {
  const float* q;  // the head's query, float
  const float* k;  // [n, d]
  const float* v;  // [n, dv]
  std::int64_t n = 0, np = 0, d = 0, dv = 0;
  float scale = 0;
  float* q16;  // [d] scratch
  float* p;    // [n rounded up to 16] scratch
  float* acc;  // [64 * dv] scratch
  float* out;  // [dv]
};

template <class Dot>
MIXKV_GGML_INLINE void attend_head_body(const HeadArgs& h, Dot dot) {
  const std::int64_t n = h.n, d = h.d, dv = h.dv;
  for (std::int64_t i = 0; i < d; ++i) h.q16[i] = fp16_round_inline(h.q[i]);
  float* p = h.p;
  float max = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    p[j] = dot(h.k + j * d, h.q16, d) * h.scale;
    max = p[j] > max ? p[j] : max;
  }
  const std::int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  for (std::int64_t j = n; j < padded; ++j) p[j] = 0.0f;
  double sum = 0.0;
  for (std::int64_t j = 0; j < n; j += kLanes) {
    const std::int64_t end = j + kLanes < n ? j + kLanes : n;
    for (std::int64_t l = j; l < end; ++l) p[l] = expf_inline(p[l] - max);
    sum += static_cast<double>(reduce16(p + j));
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t j = 0; j < n; ++j) p[j] = fp16_round_inline(p[j] * inv);

  // KQV: acc[a * dv + e] is lane a (of the 64) of dimension e's dot, over keys below np; keys
  // past n have probability 0 and add nothing.
  float* acc = h.acc;
  for (std::int64_t i = 0; i < kBlock * dv; ++i) acc[i] = 0.0f;
  const std::int64_t simd_end = n < h.np ? n : h.np;
  for (std::int64_t j = 0; j < simd_end; ++j) {
    float* a = acc + (j % kBlock) * dv;
    const float* vj = h.v + j * dv;
    const float pj = p[j];
    for (std::int64_t e = 0; e < dv; ++e) a[e] += vj[e] * pj;
  }
  // reduce64 of every dimension at once (rows of acc are lanes, columns dimensions), in place:
  // the accumulators folded into rows 0-15, then the lane tree into rows 0-7, 0-3, 0.
  for (int l = 0; l < kLanes; ++l) {
    float* r = acc + l * dv;
    const float* r16 = acc + (kLanes + l) * dv;
    const float* r32 = acc + (2 * kLanes + l) * dv;
    const float* r48 = acc + (3 * kLanes + l) * dv;
    for (std::int64_t e = 0; e < dv; ++e) r[e] = (r[e] + r32[e]) + (r16[e] + r48[e]);
  }
  for (int half = 8; half >= 4; half /= 2) {
    for (int i = 0; i < half; ++i) {
      float* r = acc + i * dv;
      const float* up = acc + (half + i) * dv;
      for (std::int64_t e = 0; e < dv; ++e) r[e] = up[e] + r[e];
    }
  }
  for (std::int64_t e = 0; e < dv; ++e) {
    double s = (acc[e] + acc[2 * dv + e]) + (acc[dv + e] + acc[3 * dv + e]);
    for (std::int64_t j = h.np; j < n; ++j) s += static_cast<double>(h.v[j * dv + e] * p[j]);
    h.out[e] = static_cast<float>(s);
  }
}

MIXKV_GGML_INLINE void swiglu_body(const float* gate, float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) up[i] *= gate[i] / (1.0f + expf_inline(0.0f - gate[i]));
}

void attend_head_baseline(const HeadArgs& h) { attend_head_body(h, dot_f16); }
void swiglu_baseline(const float* gate, float* up, std::int64_t n) { swiglu_body(gate, up, n); }
#ifdef MIXKV_GGML_X86
#define MIXKV_GGML_AVX2 [[gnu::target("avx2,fma,f16c")]]
// dot_f16 in vectors: lanes 0-7 and 8-15 of each of the four accumulators, then the same folds.
MIXKV_GGML_AVX2 MIXKV_GGML_INLINE float dot_f16_avx2(const float* x, const float* y,
                                                     std::int64_t n) {
  const std::int64_t np = n & ~std::int64_t{kBlock - 1};
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < np; i += kBlock) {
    for (int a = 0; a < 8; ++a) {
      acc[a] = _mm256_add_ps(
          acc[a], _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * a), _mm256_loadu_ps(y + i + 8 * a)));
    }
  }
  // acc[2j] holds lanes 0-7 of accumulator j, acc[2j + 1] lanes 8-15.
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
  const __m256 t8 = _mm256_add_ps(hi, lo);
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  double sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  for (std::int64_t i = np; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}
MIXKV_GGML_AVX2 void attend_head_avx2(const HeadArgs& h) { attend_head_body(h, dot_f16_avx2); }
MIXKV_GGML_AVX2 void decode_f16_avx2(const std::byte* bytes, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; i += 8) {  // n: a multiple of 16 (is_served)
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
}
// swiglu_body eight lanes at a time: expf_inline's steps as vector instructions (each fma, add,
// multiply and divide the scalar one, so the same bits), for the lanes whose n lies in
// [-125, 127], where expf_inline ends in one multiply by 2^n. A vector with any other lane (very
// large |gate|, NaN) runs expf_inline itself, lane by lane.
MIXKV_GGML_AVX2 void swiglu_avx2(const float* gate, float* up, std::int64_t n) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 lo = _mm256_set1_ps(-125.0f), hi = _mm256_set1_ps(127.0f);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 x = _mm256_sub_ps(_mm256_setzero_ps(), g);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 nn = _mm256_sub_ps(z, r);
    const __m256 in_range =
        _mm256_and_ps(_mm256_cmp_ps(nn, lo, _CMP_GE_OQ), _mm256_cmp_ps(nn, hi, _CMP_LE_OQ));
    if (_mm256_movemask_ps(in_range) != 0xFF) {
      swiglu_body(gate + i, up + i, 8);
      continue;
    }
    const __m256 b = _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, one));
    const __m256i e = _mm256_cvttps_epi32(nn);  // n is an integer: exact
    const __m256 scale =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    const __m256 ex = _mm256_mul_ps(j, scale);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, ex));
    _mm256_storeu_ps(up + i, _mm256_mul_ps(_mm256_loadu_ps(up + i), silu));
  }
  swiglu_body(gate + i, up + i, n - i);
}
std::atomic<bool> avx2_allowed{true};
bool has_avx2_fma() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no name for it.
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return yes && avx2_allowed.load(std::memory_order_relaxed);
}
#endif

void decode_f16(const std::byte* bytes, std::int64_t n, const float* table, float* out) {
#ifdef MIXKV_GGML_X86
  if (has_avx2_fma()) return decode_f16_avx2(bytes, n, out);
#endif
  decode_f16_table(bytes, n, table, out);
}

void attend_head(const HeadArgs& h) {
#ifdef MIXKV_GGML_X86
  if (has_avx2_fma()) return attend_head_avx2(h);
#endif
  attend_head_baseline(h);
}

bool is_served(const AttentionSpec& spec) {
  const attn::AttentionParams& p = spec.params;
  return p.kv_dtype == DType::kFloat16 && p.causal && p.window_left < 0 && !p.soft_cap &&
         !p.sinks && !spec.mla && spec.head_size % kLanes == 0 && spec.head_size_v % kLanes == 0;
}

struct Scratch {
  std::vector<float> k, v, q, p, acc;
};

}  // namespace

float ggml_expf(float x) { return expf_inline(x); }

float ggml_silu(float x) { return x / (1.0f + expf_inline(0.0f - x)); }

void ggml_swiglu(std::span<const float> gate, std::span<float> up) {
  if (gate.size() != up.size()) {
    throw_invalid(
        fmt::format("ggml_swiglu: {} gate values for {} up values", gate.size(), up.size()));
  }
  const auto n = static_cast<std::int64_t>(up.size());
#ifdef MIXKV_GGML_X86
  if (has_avx2_fma()) return swiglu_avx2(gate.data(), up.data(), n);
#endif
  swiglu_baseline(gate.data(), up.data(), n);
}

float fp16_round(float x) { return fp16_round_inline(x); }

bool set_ggml_avx2(bool enabled) {
#ifdef MIXKV_GGML_X86
  avx2_allowed.store(enabled);
  return has_avx2_fma();
#else
  (void)enabled;
  return false;
#endif
}

bool ggml_attention_serves(const AttentionSpec& spec) { return is_served(spec); }

void ggml_attention(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                    const AttentionInputs& inputs, std::span<float> out) {
  const std::string who = fmt::format("ggml_attention, layer {}", layer.layer);
  validate(spec, who);
  if (!is_served(spec)) {
    throw_unsupported(fmt::format(
        "{}: llama.cpp's attention numerics serve causal fp16 caches without window, soft cap "
        "or sinks and head sizes a multiple of 16 (got {} cache, head sizes {}/{}); use the "
        "paged kernel",
        who, to_string(spec.params.kv_dtype), spec.head_size, spec.head_size_v));
  }
  const std::int64_t hq = spec.params.num_q_heads;
  const std::int64_t hkv = spec.params.num_kv_heads;
  const std::int64_t group = hq / hkv;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  const std::int64_t kt = layer.kernel_tokens;
  if (layer.recurrent || kt <= 0 || layer.kernel_page_stride <= 0 || layer.offset < 0 ||
      layer.v_offset < 0 || layer.k_token_bytes != hkv * d * 2 ||
      layer.v_token_bytes != hkv * dv * 2) {
    throw_invalid(fmt::format(
        "{}: its geometry ({} K / {} V bytes per token, pages of {} tokens) is not that of {} "
        "fp16 KV heads of {}/{}",
        who, layer.k_token_bytes, layer.v_token_bytes, kt, hkv, d, dv));
  }
  // A KV head's rows: a token's apart (NHD) or side by side (HND), as the geometry says.
  if (layer.num_kv_heads != hkv) {
    throw_invalid(fmt::format("{}: its geometry splits a token into {} KV heads, not {}", who,
                              layer.num_kv_heads, hkv));
  }
  const std::int64_t k_row = layer.k_row_stride();
  const std::int64_t v_row = layer.v_row_stride();
  const std::int64_t k_head = layer.k_head_stride();
  const std::int64_t v_head = layer.v_head_stride();
  const auto size = static_cast<std::int64_t>(inputs.cache.size());
  const std::int64_t span =
      std::max(kt * layer.k_token_bytes, layer.v_offset + kt * layer.v_token_bytes);
  std::int64_t total = 0;
  for (std::size_t r = 0; r < inputs.batch.size(); ++r) {
    const PagedSequence& s = inputs.batch[r];
    if (s.num_queries < 1 || s.num_queries > s.kv_len) {
      throw_invalid(fmt::format("{}: request {} has {} queries over {} cached tokens", who, r,
                                s.num_queries, s.kv_len));
    }
    const std::int64_t pages = (s.kv_len + kt - 1) / kt;
    if (pages > static_cast<std::int64_t>(s.kernel_pages.size())) {
      throw_invalid(fmt::format("{}: request {} has {} tokens but {} kernel pages of {}", who, r,
                                s.kv_len, s.kernel_pages.size(), kt));
    }
    for (std::int64_t i = 0; i < pages; ++i) {
      const std::int64_t page = s.kernel_pages[static_cast<std::size_t>(i)];
      if (page < 0 || size < layer.offset + span ||
          page > (size - layer.offset - span) / layer.kernel_page_stride) {
        throw_invalid(fmt::format("{}: kernel page {} lies outside the {}-byte cache tensor", who,
                                  page, size));
      }
    }
    total += s.num_queries;
  }
  if (inputs.queries.size() != static_cast<std::size_t>(total * hq * d) ||
      out.size() != static_cast<std::size_t>(total * hq * dv) || !inputs.sinks.empty()) {
    throw_invalid(fmt::format(
        "{}: {} queries of {} heads need {} query values and {} outputs "
        "(and no sinks), got {} and {}",
        who, total, hq, total * hq * d, total * hq * dv, inputs.queries.size(), out.size()));
  }

  // One task per (query row, KV head): its query heads share each K/V row read.
  struct Task {
    const PagedSequence* seq;
    std::int64_t row;   // query row of the call
    std::int64_t keys;  // keys this query sees: its position + 1
  };
  std::vector<Task> tasks;
  tasks.reserve(static_cast<std::size_t>(total));
  std::int64_t row = 0;
  for (const PagedSequence& s : inputs.batch) {
    for (std::int64_t i = 0; i < s.num_queries; ++i, ++row) {
      tasks.push_back({&s, row, s.kv_len - s.num_queries + i + 1});
    }
  }
  const auto scale = static_cast<float>(spec.params.scale);
  const float* table = fp16_table();
  const int workers = inputs.pool != nullptr ? inputs.pool->size() : 1;
  std::vector<Scratch> scratch(static_cast<std::size_t>(workers));
  const auto run = [&](std::int64_t index, int worker) {
    const Task& t = tasks[static_cast<std::size_t>(index / hkv)];
    const std::int64_t g = index % hkv;
    Scratch& sc = scratch[static_cast<std::size_t>(worker)];
    const std::int64_t n = t.keys;
    // ggml's n_kv: the cells in use padded to 32, at least 32; the KQV dot's blocks of 64 and
    // its one-by-one tail follow from it.
    const std::int64_t n_kv = std::max<std::int64_t>(32, (n + 31) / 32 * 32);
    const std::int64_t np = n_kv & ~std::int64_t{kBlock - 1};
    sc.k.resize(static_cast<std::size_t>(n * d));
    sc.v.resize(static_cast<std::size_t>(n * dv));
    sc.q.resize(static_cast<std::size_t>(d));
    sc.acc.resize(static_cast<std::size_t>(kBlock * dv));
    sc.p.resize(static_cast<std::size_t>((n + kLanes - 1) / kLanes * kLanes));
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t page = t.seq->kernel_pages[static_cast<std::size_t>(j / kt)];
      const std::int64_t base = layer.offset + page * layer.kernel_page_stride;
      const std::byte* kp = inputs.cache.data() + base + (j % kt) * k_row + g * k_head;
      const std::byte* vp =
          inputs.cache.data() + base + layer.v_offset + (j % kt) * v_row + g * v_head;
      decode_f16(kp, d, table, sc.k.data() + j * d);
      decode_f16(vp, dv, table, sc.v.data() + j * dv);
    }
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      attend_head({inputs.queries.data() + (t.row * hq + h) * d, sc.k.data(), sc.v.data(), n, np, d,
                   dv, scale, sc.q.data(), sc.p.data(), sc.acc.data(),
                   out.data() + (t.row * hq + h) * dv});
    }
  };
  const auto count = static_cast<std::int64_t>(tasks.size()) * hkv;
  if (inputs.pool != nullptr) {
    inputs.pool->parallel_for(count, run);
  } else {
    for (std::int64_t i = 0; i < count; ++i) run(i, 0);
  }
}

}  // namespace mixkv::kernels
