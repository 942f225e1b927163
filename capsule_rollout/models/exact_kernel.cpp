// One exact linear layer in one call (`models.exact_kernel`): what `models.exact_sums.exact_linear` computes for a
// float32 input, each row put on its grid, its products summed in float64, the bias added, rounded to float32, but
// in one loop instead of nine tensor operations (at one row those operations cost three times the products).
//
// The same bits as `exact_linear` by construction: every partial sum of the products is an integer times the grid
// steps that float64 holds exactly, so the order of the sums cannot matter; the rounding to the grid is the same two
// float64 operations, `(x + shift) - shift` with `shift = max|x| * scale`, kept apart by `-ffp-contract=off` (a fused
// multiply-add would round once where torch rounds twice). A NaN in a row makes its shift NaN, an infinity makes it
// infinite: the row's outputs are NaN, as torch's are.

#include <torch/extension.h>

#include <cmath>
#include <vector>

namespace {

// The products of one rounded row into `acc`, built for AVX-512, AVX2 and baseline x86-64, the CPU picking at load
// time (GCC's function multiversioning; elsewhere, the one baseline build). The sums are exact whatever the width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void accumulate(const double* rounded, const double* tp, int64_t k, int64_t out, double* acc) {
  for (int64_t i = 0; i < k; ++i) {
    const double xi = rounded[i];
    const double* column = tp + i * out;
    for (int64_t j = 0; j < out; ++j) acc[j] += xi * column[j];
  }
}

torch::Tensor exact_linear(const torch::Tensor& x_in, const torch::Tensor& t, const c10::optional<torch::Tensor>& bias,
                           double scale) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == torch::kFloat32, "exact_linear: a float32 CPU input");
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat64 && t.dim() == 2 && t.is_contiguous(),
              "exact_linear: contiguous float64 weights (k, out)");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->scalar_type() == torch::kFloat64 && bias->is_contiguous() &&
                            bias->numel() == t.size(1)), "exact_linear: a float64 bias of `out` values");
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == t.size(0), "exact_linear: the input's last dimension is t's first");
  const torch::Tensor x = x_in.contiguous();
  const int64_t k = t.size(0), out = t.size(1);
  const int64_t rows = k ? x.numel() / k : 0;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  torch::Tensor y = torch::empty(shape, x.options());
  const float* xp = x.data_ptr<float>();
  const double* tp = t.data_ptr<double>();
  const double* bp = has_bias ? bias->data_ptr<double>() : nullptr;
  float* yp = y.data_ptr<float>();
  std::vector<double> rounded(k), acc(out);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * k;
    double top = 0.0;
    bool nan = false;
    for (int64_t i = 0; i < k; ++i) {
      const double a = std::fabs(static_cast<double>(row[i]));
      nan = nan || std::isnan(a);
      top = a > top ? a : top;
    }
    const double shift = (nan ? NAN : top) * scale;
    for (int64_t i = 0; i < k; ++i) {
      const double up = static_cast<double>(row[i]) + shift;
      rounded[i] = up - shift;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    accumulate(rounded.data(), tp, k, out, acc.data());
    float* y_row = yp + r * out;
    for (int64_t j = 0; j < out; ++j) y_row[j] = static_cast<float>(has_bias ? acc[j] + bp[j] : acc[j]);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(capsule_rollout, m) {
  m.def("exact_linear(Tensor x, Tensor t, Tensor? bias, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(capsule_rollout, CPU, m) {
  m.impl("exact_linear", &exact_linear);
}
