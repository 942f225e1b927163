// One exact linear layer in one call (`models.exact_kernel`): what `models.exact_sums.exact_linear` computes for a
// float32 input, each row put on its grid, its products summed in float64, the bias added, rounded to float32, but
// in one compiled call instead of nine tensor operations (at one row those operations cost three times the products).
//
// The same bits as `exact_linear` by construction: every product of a rounded input and a weight on its grid is
// exact in float64 and so is every partial sum of them (an integer times the grid steps), so neither the order of
// the sums nor a fused multiply-add can change a bit. The rounding to the grid is the same two float64 operations,
// `(x + shift) - shift` with `shift = max|x| * scale`, kept apart by `-ffp-contract=off` (a fused multiply-add there
// would round once where torch rounds twice). A NaN in a row makes its shift NaN, an infinity makes it infinite: the
// row's outputs are NaN, as torch's are.
//
// The products: the rows in blocks (up to 8 with AVX-512, 4 with AVX2), each block's sums for a tile of output
// columns held in vector registers over the whole reduction, so each weight is read once per block of rows instead
// of once per row; the columns past the last full vector as dot products over the reduction; float32 weights (every
// value of a grid of at most 24 bits is one) widened in the registers, half the bytes streamed. The kernel is chosen
// once per process by what the CPU has (`isa` = -1), or named (tests); without AVX2, one loop in plain C++.

#include <torch/extension.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CAPSULE_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum Isa : int64_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// The products in plain C++ (the compiler's baseline vectors), for a CPU without AVX2.
template <typename T>
void baseline_products(const double* xr, int64_t rows, int64_t k, const T* tp, int64_t out, double* acc) {
  std::fill(acc, acc + rows * out, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    const T* weights = tp + i * out;
    for (int64_t r = 0; r < rows; ++r) {
      const double xi = xr[r * k + i];
      double* a = acc + r * out;
      for (int64_t j = 0; j < out; ++j) a[j] += xi * static_cast<double>(weights[j]);
    }
  }
}

#ifdef CAPSULE_X86

// One instruction set's vector operations; a load gives float64 weights as they are and widens float32 ones.
struct Avx512 {
  using V = __m512d;
  static constexpr int64_t kLanes = 8;
  __attribute__((target("avx512f"))) static V load(const double* p) { return _mm512_loadu_pd(p); }
  __attribute__((target("avx512f"))) static V load(const float* p) {
    return _mm512_cvtps_pd(_mm256_loadu_ps(p));
  }
  __attribute__((target("avx512f"))) static V zero() { return _mm512_setzero_pd(); }
  __attribute__((target("avx512f"))) static V broadcast(const double* p) { return _mm512_set1_pd(*p); }
  __attribute__((target("avx512f"))) static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  __attribute__((target("avx512f"))) static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
};

struct Avx2 {
  using V = __m256d;
  static constexpr int64_t kLanes = 4;
  __attribute__((target("avx2,fma"))) static V load(const double* p) { return _mm256_loadu_pd(p); }
  __attribute__((target("avx2,fma"))) static V load(const float* p) {
    return _mm256_cvtps_pd(_mm_loadu_ps(p));
  }
  __attribute__((target("avx2,fma"))) static V zero() { return _mm256_setzero_pd(); }
  __attribute__((target("avx2,fma"))) static V broadcast(const double* p) {
    return _mm256_broadcast_sd(p);
  }
  __attribute__((target("avx2,fma"))) static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  __attribute__((target("avx2,fma"))) static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
};

// R rows by NV vectors of columns from `j0`: R * NV sums in registers over the whole reduction.
template <typename S, int R, int NV, typename T>
inline void tile(const double* xr, int64_t k, const T* tp, int64_t out, int64_t j0, double* acc) {
  typename S::V a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) a[r][v] = S::zero();
  const T* column = tp + j0;
  for (int64_t i = 0; i < k; ++i, column += out) {
    typename S::V w[NV];
    for (int v = 0; v < NV; ++v) w[v] = S::load(column + v * S::kLanes);
    for (int r = 0; r < R; ++r) {
      const typename S::V xb = S::broadcast(xr + r * k + i);
      for (int v = 0; v < NV; ++v) a[r][v] = S::fma(xb, w[v], a[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) S::store(acc + r * out + j0 + v * S::kLanes, a[r][v]);
}

// The columns from `j0` (fewer than a vector's lanes) as dot products over the reduction, from their weights laid
// out one column after another (`narrow`): R rows each, the rows' sums in vectors, added up across lanes at the end.
template <typename S, int R>
inline void dots(const double* xr, int64_t k, const double* narrow, int64_t out, int64_t j0, double* acc) {
  for (int64_t c = 0; c < out - j0; ++c) {
    const double* w = narrow + c * k;
    typename S::V a[R];
    for (int r = 0; r < R; ++r) a[r] = S::zero();
    int64_t i = 0;
    for (; i + S::kLanes <= k; i += S::kLanes) {
      const typename S::V wv = S::load(w + i);
      for (int r = 0; r < R; ++r) a[r] = S::fma(S::load(xr + r * k + i), wv, a[r]);
    }
    for (int r = 0; r < R; ++r) {
      double lanes[S::kLanes];
      S::store(lanes, a[r]);
      double sum = 0.0;
      for (int64_t l = 0; l < S::kLanes; ++l) sum += lanes[l];
      for (int64_t ii = i; ii < k; ++ii) sum += xr[r * k + ii] * w[ii];
      acc[r * out + j0 + c] = sum;
    }
  }
}

// A block of R rows: tiles of NV vectors, then of one, then the columns left as dot products.
template <typename S, int R, int NV, typename T>
inline void block(const double* xr, int64_t k, const T* tp, int64_t out, const double* narrow, double* acc) {
  int64_t j0 = 0;
  for (; j0 + NV * S::kLanes <= out; j0 += NV * S::kLanes) tile<S, R, NV>(xr, k, tp, out, j0, acc);
  for (; j0 + S::kLanes <= out; j0 += S::kLanes) tile<S, R, 1>(xr, k, tp, out, j0, acc);
  if (j0 < out) dots<S, R>(xr, k, narrow, out, j0, acc);
}

// The vectors per tile: enough independent sums to cover the multiply-add's latency, few enough to stay in registers
// (32 with AVX-512: 8 rows x 2 vectors and their 2 weight vectors; 16 with AVX2: 4 rows x 2).
template <int R, typename T>
__attribute__((target("avx512f"), flatten)) void block_avx512(const double* xr, int64_t k, const T* tp, int64_t out,
                                                             const double* narrow, double* acc) {
  block<Avx512, R, (R == 1 ? 8 : R <= 4 ? 4 : 2)>(xr, k, tp, out, narrow, acc);
}

template <int R, typename T>
__attribute__((target("avx2,fma"), flatten)) void block_avx2(const double* xr, int64_t k, const T* tp, int64_t out,
                                                           const double* narrow, double* acc) {
  block<Avx2, R, (R <= 2 ? 4 : 2)>(xr, k, tp, out, narrow, acc);
}

template <typename T>
using Block = void (*)(const double*, int64_t, const T*, int64_t, const double*, double*);

// The rows in blocks of up to `most`; the columns past the last full vector of `lanes` laid out once for the dot
// products.
template <typename T>
void products_in_blocks(const Block<T>* blocks, int64_t most, int64_t lanes, const double* xr, int64_t rows, int64_t k,
                        const T* tp, int64_t out, double* acc) {
  const int64_t j_narrow = out - out % lanes;
  std::vector<double> narrow((out - j_narrow) * k);
  for (int64_t c = 0; c < out - j_narrow; ++c)
    for (int64_t i = 0; i < k; ++i) narrow[c * k + i] = static_cast<double>(tp[i * out + j_narrow + c]);
  for (int64_t r = 0; r < rows; r += most) {
    const int64_t n = std::min(most, rows - r);
    blocks[n - 1](xr + r * k, k, tp, out, narrow.data(), acc + r * out);
  }
}

#endif  // CAPSULE_X86

bool supported(int64_t isa) {
#ifdef CAPSULE_X86
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
  }();
  return isa == kBaseline || (isa == kAvx2 && avx2) || (isa == kAvx512 && avx512);
#else
  return isa == kBaseline;
#endif
}

int64_t best_isa() {
  static const int64_t best = supported(kAvx512) ? kAvx512 : supported(kAvx2) ? kAvx2 : kBaseline;
  return best;
}

template <typename T>
void products(int64_t isa, const double* xr, int64_t rows, int64_t k, const T* tp, int64_t out, double* acc) {
#ifdef CAPSULE_X86
  static const Block<T> avx512[8] = {block_avx512<1, T>, block_avx512<2, T>, block_avx512<3, T>, block_avx512<4, T>,
                                     block_avx512<5, T>, block_avx512<6, T>, block_avx512<7, T>, block_avx512<8, T>};
  static const Block<T> avx2[4] = {block_avx2<1, T>, block_avx2<2, T>, block_avx2<3, T>, block_avx2<4, T>};
  if (isa == kAvx512) return products_in_blocks(avx512, 8, Avx512::kLanes, xr, rows, k, tp, out, acc);
  if (isa == kAvx2) return products_in_blocks(avx2, 4, Avx2::kLanes, xr, rows, k, tp, out, acc);
#endif
  baseline_products(xr, rows, k, tp, out, acc);
}

#if defined(CAPSULE_X86) && defined(__GNUC__) && !defined(__clang__)
#define CAPSULE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CAPSULE_CLONES
#endif

// Each row put on its grid. The row's largest magnitude from its float32 bits with the sign cleared (an integer
// maximum, which vectorizes where a floating-point one with NaN's rules does not): finite values and infinity order
// as their magnitudes do, and a NaN's bits lie above infinity's.
inline uint32_t magnitude_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

inline float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

CAPSULE_CLONES void round_rows(const float* xp, int64_t rows, int64_t k, double scale, double* rounded) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * k;
    uint32_t top_bits = 0;
    for (int64_t i = 0; i < k; ++i) top_bits = std::max(top_bits, magnitude_bits(row[i]));
    const double top = top_bits > 0x7f800000u ? NAN : static_cast<double>(from_bits(top_bits));
    const double shift = top * scale;
    double* rounded_row = rounded + r * k;
    for (int64_t i = 0; i < k; ++i) {
      const double up = static_cast<double>(row[i]) + shift;
      rounded_row[i] = up - shift;
    }
  }
}

// The exact sums with the bias added, rounded to float32.
CAPSULE_CLONES void finish_rows(const double* acc, int64_t rows, int64_t out, const double* bias, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* a = acc + r * out;
    float* y_row = y + r * out;
    if (bias) {
      for (int64_t j = 0; j < out; ++j) y_row[j] = static_cast<float>(a[j] + bias[j]);
    } else {
      for (int64_t j = 0; j < out; ++j) y_row[j] = static_cast<float>(a[j]);
    }
  }
}

torch::Tensor exact_linear(const torch::Tensor& x_in, const torch::Tensor& t, const c10::optional<torch::Tensor>& bias,
                           double scale, int64_t isa) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == torch::kFloat32, "exact_linear: a float32 CPU input");
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == torch::kFloat64 || t.scalar_type() == torch::kFloat32) &&
                  t.dim() == 2 && t.is_contiguous(),
              "exact_linear: contiguous weights (k, out), float64 or their float32 copy");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->scalar_type() == torch::kFloat64 && bias->is_contiguous() &&
                            bias->numel() == t.size(1)), "exact_linear: a float64 bias of `out` values");
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == t.size(0), "exact_linear: the input's last dimension is t's first");
  if (isa < 0) isa = best_isa();
  TORCH_CHECK(isa <= kAvx512 && supported(isa), "exact_linear: kernel ", isa, " is not one this CPU runs");
  const torch::Tensor x = x_in.contiguous();
  const int64_t k = t.size(0), out = t.size(1);
  int64_t rows = 1;  // the leading dimensions' product (also where k is 0: each output is its bias)
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  torch::Tensor y = torch::empty(shape, x.options());
  const float* xp = x.data_ptr<float>();
  const double* bp = has_bias ? bias->data_ptr<double>() : nullptr;
  float* yp = y.data_ptr<float>();
  std::vector<double> rounded(rows * k), acc(rows * out);
  round_rows(xp, rows, k, scale, rounded.data());
  if (t.scalar_type() == torch::kFloat32) {
    products(isa, rounded.data(), rows, k, t.data_ptr<float>(), out, acc.data());
  } else {
    products(isa, rounded.data(), rows, k, t.data_ptr<double>(), out, acc.data());
  }
  finish_rows(acc.data(), rows, out, bp, yp);
  return y;
}

}  // namespace

// The kernels this CPU runs, one bit per `isa` value (`models.exact_kernel.kernels` reads it through ctypes: an
// operator returning a list could not be called while torch traces a model).
extern "C" int64_t capsule_rollout_exact_kernels() {
  int64_t mask = 0;
  for (int64_t isa : {kBaseline, kAvx2, kAvx512})
    if (supported(isa)) mask |= int64_t{1} << isa;
  return mask;
}

TORCH_LIBRARY(capsule_rollout, m) {
  m.def("exact_linear(Tensor x, Tensor t, Tensor? bias, float scale, int isa=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(capsule_rollout, CPU, m) {
  m.impl("exact_linear", &exact_linear);
}
