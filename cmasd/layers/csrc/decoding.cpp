// The C++ side of cmasd's decoding at a few rows (batch size 1: one to a few positions).
//
// small_linear: y = x W^T + b (ReLU optional). oneDNN and MKL spend most of such a call
// on dispatch and blocking meant for large matrices; this kernel streams each weight row
// once, splitting the output features over torch's intra-op threads, and reuses the row
// for up to four input rows held in registers. AVX2 + FMA through GCC vector extensions
// (compiled with -mavx2 -mfma; the loader checks the CPU first).
//
// FusedDecoder: the C++ backend of cmasd.layers.transformer.TransformerLayer. The layers
// of a cmasd.layers.prepared.DecodingDecoder (PreparedLayers on gemv kernels, post- or
// pre-norm, ReLU feed-forward) run in one call: TransformerLayer.forward transcribed (the
// same residual blocks, the same operations in the same order) with the block scorer's
// cache writes, so that a pass costs its arithmetic and torch's operator dispatch but no
// Python. Its parity with the Python layers is tested (tests/test_block_scoring.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

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

namespace {

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, bool relu) {
  return small_linear(x, w, b, relu);
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t heads) {  // (B, T, C) -> (B, H, T, d)
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

// Scaled dot-product attention for a few queries, written out: q (B, H, T, d) already
// scaled, k and v (B, H, Tk, d), bias broadcastable to (B, 1, T, Tk) (0 / -inf) or none.
// Returns (B, T, H d): the heads already merged. softmax(q k^T + bias) v as fairseq
// computes it (max-subtracted exponentials over their sum), in float32.
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "attend: the head dimension must be dense");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), Tk = k.size(2);
  auto out = torch::empty({B, T, H * d}, q.options());
  torch::Tensor mask;
  int64_t mb = 0, mt = 0;
  const float* mp = nullptr;
  if (bias.has_value()) {
    mask = bias->expand({B, 1, T, Tk});
    TORCH_CHECK(mask.stride(3) == 1, "attend: the mask's key dimension must be dense");
    mb = mask.stride(0), mt = mask.stride(2), mp = mask.data_ptr<float>();
  }
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::vector<float> scores(Tk);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const float* kb = kp + b * k.stride(0) + h * k.stride(1);
      const float* vb = vp + b * v.stride(0) + h * v.stride(1);
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = qp + b * q.stride(0) + h * q.stride(1) + t * q.stride(2);
        const float* mrow = mp ? mp + b * mb + t * mt : nullptr;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < Tk; ++j) {
          float acc;
          dots<1>(qt, kb + j * k.stride(2), d, &acc);
          scores[j] = mrow ? acc + mrow[j] : acc;
          top = std::max(top, scores[j]);
        }
        float total = 0.f;
        for (int64_t j = 0; j < Tk; ++j) total += (scores[j] = std::exp(scores[j] - top));
        float* o = op + (b * T + t) * H * d + h * d;
        for (int64_t e = 0; e < d; ++e) o[e] = 0.f;
        for (int64_t j = 0; j < Tk; ++j) {
          const float p = scores[j] / total;
          const float* vj = vb + j * v.stride(2);
          for (int64_t e = 0; e < d; ++e) o[e] += p * vj[e];
        }
      }
    }
  }
  return out;
}

struct Layer {
  torch::Tensor qkv_w, qkv_b, self_out_w, self_out_b, self_norm_w, self_norm_b;
  torch::Tensor cross_q_w, cross_q_b, cross_out_w, cross_out_b, cross_norm_w, cross_norm_b;
  torch::Tensor fc1_w, fc1_b, fc2_w, fc2_b, final_norm_w, final_norm_b;
  double self_scaling, cross_scaling, self_eps, cross_eps, final_eps;  // scaling 0: folded into the weights
  bool has_cross;
};

}  // namespace

class FusedDecoder {
 public:
  FusedDecoder(int64_t heads, bool normalize_before) : heads_(heads), normalize_before_(normalize_before) {}

  // tensors: qkv w, b; self_out w, b; self_norm w, b; cross_q w, b; cross_out w, b;
  // cross_norm w, b; fc1 w, b; fc2 w, b; final_norm w, b (cross ones undefined/empty
  // when the layer has no encoder attention). numbers: self_scaling, cross_scaling,
  // the three layer norms' eps.
  void add_layer(std::vector<torch::Tensor> t, std::vector<double> numbers, bool has_cross) {
    TORCH_CHECK(t.size() == 18 && numbers.size() == 5, "FusedDecoder.add_layer: 18 tensors and 5 numbers");
    layers_.push_back(Layer{t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11],
                            t[12], t[13], t[14], t[15], t[16], t[17],
                            numbers[0], numbers[1], numbers[2], numbers[3], numbers[4], has_cross});
  }

  // x (B, T, C) at sequence positions ``where`` (B, 2H, T, d) (the scatter index of the
  // new keys/values into each layer's cache (B, 2H, capacity, d)); the queries see cache
  // positions < used, masked by self_bias (B, 1, T, used); cross: per layer encoder keys
  // and values (B, H, S, d), cross_bias (B, 1, 1, S). Returns (B, T, C).
  torch::Tensor states(torch::Tensor x, std::vector<torch::Tensor> kv, torch::Tensor where, int64_t used,
                       c10::optional<torch::Tensor> self_bias, std::vector<torch::Tensor> cross_k,
                       std::vector<torch::Tensor> cross_v, c10::optional<torch::Tensor> cross_bias) {
    torch::NoGradGuard no_grad;
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = heads_, d = C / H;
    TORCH_CHECK(kv.size() == layers_.size() && cross_k.size() == layers_.size() && cross_v.size() == layers_.size(),
                "FusedDecoder.states: one cache and one encoder key/value pair per layer");
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      x = residual(x, L.self_norm_w, L.self_norm_b, L.self_eps, [&](const torch::Tensor& h) {  // self_attention
        auto qkv = linear(h, L.qkv_w, L.qkv_b, false).view({B, T, 3 * H, d}).transpose(1, 2);  // (B, 3H, T, d)
        auto q = qkv.slice(1, 0, H);
        if (L.self_scaling != 0.0) q = q * L.self_scaling;
        kv[i].scatter_(2, where, qkv.slice(1, H, 3 * H));
        auto keys = kv[i].slice(1, 0, H).slice(2, 0, used);
        auto values = kv[i].slice(1, H, 2 * H).slice(2, 0, used);
        return linear(attend(q, keys, values, self_bias), L.self_out_w, L.self_out_b, false);
      });
      if (L.has_cross) {
        x = residual(x, L.cross_norm_w, L.cross_norm_b, L.cross_eps, [&](const torch::Tensor& h) {  // cross_attention
          auto q = split_heads(linear(h, L.cross_q_w, L.cross_q_b, false), H);
          if (L.cross_scaling != 0.0) q = q * L.cross_scaling;
          return linear(attend(q, cross_k[i], cross_v[i], cross_bias), L.cross_out_w, L.cross_out_b, false);
        });
      }
      x = residual(x, L.final_norm_w, L.final_norm_b, L.final_eps, [&](const torch::Tensor& h) {  // feed_forward
        return linear(linear(h, L.fc1_w, L.fc1_b, true), L.fc2_w, L.fc2_b, false);
      });
    }
    return x;
  }

 private:
  // TransformerLayer.residual: x + sublayer(x), the layer norm on the sublayer's input
  // (pre-norm) or on the sum (post-norm).
  template <typename Sublayer>
  torch::Tensor residual(const torch::Tensor& x, const torch::Tensor& norm_w, const torch::Tensor& norm_b,
                         double eps, Sublayer sublayer) const {
    const int64_t C = x.size(2);
    if (normalize_before_) return x + sublayer(at::layer_norm(x, {C}, norm_w, norm_b, eps));
    return at::layer_norm(x + sublayer(x), {C}, norm_w, norm_b, eps);
  }

  int64_t heads_;
  bool normalize_before_;
  std::vector<Layer> layers_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x W^T + b (ReLU optional) for a few rows, float32 on CPU");
  pybind11::class_<FusedDecoder>(m, "FusedDecoder")
      .def(pybind11::init<int64_t, bool>())
      .def("add_layer", &FusedDecoder::add_layer)
      .def("states", &FusedDecoder::states);
}
