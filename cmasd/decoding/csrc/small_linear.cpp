// y = x W^T + b (ReLU optional) for a few input rows: the linear layers of a decoding
// pass at batch size 1 (one to a few positions). oneDNN and MKL spend most of such a
// call on dispatch and blocking meant for large matrices; this kernel streams each
// weight row once, splitting the output features over torch's intra-op threads, and
// reuses the row for up to four input rows held in registers. AVX2 + FMA through GCC
// vector extensions (compiled with -mavx2 -mfma; the loader checks the CPU first).
#include <torch/extension.h>
#include <ATen/Parallel.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) { v8 v; __builtin_memcpy(&v, p, 32); return v; }

// acc[r] = dot(w, x + r * in) for the R input rows x .. x + (R - 1) * in
template <int R>
static inline void dots(const float* w, const float* x, int64_t in, float* acc) {
  v8 a[R][2];
  for (int r = 0; r < R; ++r) { a[r][0] = (v8){0}; a[r][1] = (v8){0}; }
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const v8 w0 = load8(w + i), w1 = load8(w + i + 8);
    for (int r = 0; r < R; ++r) {
      a[r][0] += w0 * load8(x + r * in + i);
      a[r][1] += w1 * load8(x + r * in + i + 8);
    }
  }
  for (int r = 0; r < R; ++r) {
    const v8 v = a[r][0] + a[r][1];
    float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    for (int64_t j = i; j < in; ++j) s += w[j] * x[r * in + j];
    acc[r] = s;
  }
}

torch::Tensor small_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, bool relu) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
              bias.scalar_type() == torch::kFloat, "small_linear: float32 only");
  TORCH_CHECK(weight.is_contiguous() && bias.is_contiguous() && !x.is_cuda(), "small_linear: contiguous CPU tensors");
  const int64_t out_features = weight.size(0), in = weight.size(1);
  TORCH_CHECK(x.size(-1) == in && bias.numel() == out_features, "small_linear: shapes do not match");
  const auto xc = x.contiguous();
  const int64_t rows = xc.numel() / in;
  auto sizes = x.sizes().vec();
  sizes.back() = out_features;
  auto out = torch::empty(sizes, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, out_features, 64, [&](int64_t begin, int64_t end) {
    float acc[4];
    for (int64_t o = begin; o < end; ++o) {
      const float* w = wp + o * in;
      for (int64_t m = 0; m < rows; m += 4) {
        const int64_t r = std::min<int64_t>(4, rows - m);
        if (r == 4) dots<4>(w, xp + m * in, in, acc);
        else if (r == 3) dots<3>(w, xp + m * in, in, acc);
        else if (r == 2) dots<2>(w, xp + m * in, in, acc);
        else dots<1>(w, xp + m * in, in, acc);
        for (int64_t k = 0; k < r; ++k) {
          const float v = acc[k] + bp[o];
          yp[(m + k) * out_features + o] = (relu && v < 0.f) ? 0.f : v;
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x W^T + b (ReLU optional) for a few rows, float32 on CPU");
}
