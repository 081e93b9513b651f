// The C++ side of cmasd's decoding at a few rows (batch size 1: one to a few positions; a
// verify block of up to 16 positions; ragged rows at batch > 1).
//
// panel_linear: y = x W^T + b (ReLU optional) on weights packed once by pack_panels. oneDNN
// and MKL spend most of such a call on dispatch and blocking meant for large matrices, and a
// matrix-vector kernel reads the weights once per row or few rows; this one reads them once
// per call. The weights are stored in panels of 16 output features, each panel [in][16]
// (zero padded past out_features); torch's intra-op threads split the panels, and a thread
// takes CHUNK panels through every row of x before the next ones (they stay in L2 while the
// next chunk is prefetched). A register tile of a few rows x 16 to 64 outputs takes, per
// input feature i, x[r][i] broadcast and one fused multiply-add per vector of the panel's
// row i: no horizontal sums, and the FMA pipes busy from about 4 rows on. A pass over 16
// rows thus reads the weights once, as a pass over one row does, and costs more only where
// its arithmetic takes longer than that read. AVX2 + FMA (the build's -mavx2 -mfma; the loader checks the CPU
// first), and 512-bit vectors with twice the rows per tile where the CPU has AVX-512F
// (chosen at run time; the same results, bit for bit). The panels may hold bfloat16
// weights instead (pack_panels(weight, bf16=True): half the bytes to read), widened to
// float32 exactly as they are loaded (see Layout) into the float32 kernel's arithmetic, so
// that bfloat16 panels give what float32 panels of the rounded weights give, bit for bit.
//
// FusedDecoder: the C++ backend of cmasd.layers.transformer.TransformerLayer. The layers
// of a cmasd.layers.prepared.DecodingDecoder (PreparedLayers on gemv or bf16 kernels,
// post- or pre-norm, ReLU feed-forward) run in one call: TransformerLayer.forward
// transcribed (the same residual blocks, the same operations in the same order) with the
// block scorer's cache writes, so that a pass costs its arithmetic and torch's operator
// dispatch but no Python. Its parity with the Python layers is tested
// (tests/test_block_scoring.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) { v8 v; __builtin_memcpy(&v, p, 32); return v; }

// dot(a, b) over n floats: two 8-wide partial sums, reduced at the end (attend's q k)
static inline float dot(const float* a, const float* b, int64_t n) {
  v8 s0 = {0}, s1 = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
  }
  const v8 v = s0 + s1;
  float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ---- panel_linear ----
// Written once with GCC's generic vectors: 8 floats (a ymm register) for AVX2, 16 (a zmm
// register) in a function compiled for AVX-512F.

typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t u8 __attribute__((vector_size(32)));  // the same registers' bits
typedef uint32_t u16 __attribute__((vector_size(64)));

#define KERNEL inline __attribute__((always_inline))  // inlined into each ISA's entry point

constexpr int64_t PANEL = 16;  // output features per panel
constexpr int64_t CHUNK = 4;   // panels a thread takes through every row before the next ones (L2)

// The vectors and register tiles of an ISA: rows x panels with V accumulators each (V
// vectors per panel row), plus V per panel of weights and a broadcast, within its vector
// registers (16 ymm for AVX2: 6 rows x 1 panel = 12 accumulators; 32 zmm for AVX-512F:
// 12 x 2 = 24), more panels at fewer rows for more independent chains of fused
// multiply-adds (8 keep 2 pipes of 4 cycles busy) where GCC does not spill them.
template <bool WIDE> struct Isa {
  typedef typename std::conditional<WIDE, v16, v8>::type vec;
  typedef typename std::conditional<WIDE, u16, u8>::type bits;  // a vec's 32-bit words
  static constexpr int V = PANEL * sizeof(float) / sizeof(vec);
  static constexpr int rows = WIDE ? 12 : 6;
  static constexpr int panels(int r) { return WIDE ? (r == 1 ? 4 : 2) : (r == 1 ? 4 : r == 2 ? 2 : 1); }
};

// Rows in register tiles: ceil(rows / most) groups as even as can be (16 rows: 6 + 5 + 5
// with AVX2, 8 + 8 with AVX-512F; a small last group would run below the FMA pipes' rate).
// Group g has group_rows(...) rows.
static inline int64_t group_rows(int64_t rows, int64_t groups, int64_t g) {
  return rows / groups + (g < rows % groups ? 1 : 0);
}

// How a panel holds its weights of type W: K inputs a step, a step a cache line. float:
// step i holds input i's 16 weights. bfloat16 (W = uint16_t, their bits): step j holds
// inputs 2j and 2j + 1, a 32-bit word per output with input 2j's weight in its low half
// and 2j + 1's in its high half (zeros past in). A bfloat16 is the upper half of the
// float32 of the same value, so that one load of a step gives both inputs' weights as
// float32 with one instruction a vector: the words shifted left by 16, the words with
// their low halves cleared. (Widening 16-bit lanes input by input takes shuffles as well,
// vpmovzxwd: at one row more instructions than the fused multiply-adds, 1.2 to 1.8 times
// the float32 kernel's time on weights in cache, where this takes 0.7 to 0.95 of it.)
template <typename W> struct Layout;
template <> struct Layout<float> { static constexpr int K = 1; };
template <> struct Layout<uint16_t> { static constexpr int K = 2; };

// Input s K + k's weights as a vector of float32, from step s of a panel: the lanes' words
// (or floats) at p.
template <bool WIDE, typename W>
static KERNEL typename Isa<WIDE>::vec load_weights(const W* p, int k) {
  typename Isa<WIDE>::vec v;
  if constexpr (std::is_same<W, float>::value) {
    __builtin_memcpy(&v, p, sizeof(v));
  } else {
    typename Isa<WIDE>::bits u;
    __builtin_memcpy(&u, p, sizeof(u));
    u = k == 0 ? u << 16 : u & 0xffff0000u;
    __builtin_memcpy(&v, &u, sizeof(v));
  }
  return v;
}

// One panel_linear call: x (rows, in), panels of W (Layout), each ``stride`` elements
// (in rounded up to K, times 16), bias (out), y (rows, out).
template <typename W>
struct PanelCall {
  const float* x;
  const W* w;
  const float* bias;
  float* y;
  int64_t rows, in, out, stride;
  bool relu;
};

// y[o .. o + valid - 1] = s + bias (ReLU optional) for the last, partial panel: the same
// additions as the vector path, element by element
__attribute__((noinline)) static void finish_partial(const float* s, const float* bias, float* y, int64_t valid, bool relu) {
  for (int64_t k = 0; k < valid; ++k) {
    const float v = s[k] + bias[k];
    y[k] = (relu && v < 0.f) ? 0.f : v;
  }
}

// Inputs s K .. s K + N - 1 (step s, or the first N inputs of the last step) of the R rows
// from x into acc (C panels from w): per input, its weights' vectors, then for each row
// x[r][i] broadcast and one fused multiply-add per vector.
template <bool WIDE, int R, int C, int N, typename W>
static KERNEL void step(typename Isa<WIDE>::vec (&acc)[R][C * Isa<WIDE>::V], const PanelCall<W>& a, const float* x,
                        const W* w, int64_t s) {
  typedef typename Isa<WIDE>::vec vec;
  constexpr int V = Isa<WIDE>::V, L = PANEL / V;  // vectors per panel row, lanes per vector
  constexpr int K = Layout<W>::K;
#pragma GCC unroll 2
  for (int k = 0; k < N; ++k) {
    vec wv[C * V];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) wv[c * V + v] = load_weights<WIDE>(w + c * a.stride + (s * PANEL + v * L) * K, k);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float xs = x[r * a.in + s * K + k];
#pragma GCC unroll 16
      for (int j = 0; j < C * V; ++j) acc[r][j] += wv[j] * xs;  // contracted to one fused multiply-add
    }
  }
}

// Outputs o0 .. o0 + 16 C - 1 of the R rows from x: C panels from w (the first, panel o0 / 16),
// plus bias, ReLU optional (columns past out dropped). Each output is one chain of fused
// multiply-adds over i = 0 .. in - 1 in order, from 0, then + bias: the same operations
// whatever the tile, the ISA, the panels' type or the rows around it, so that a row's
// outputs do not depend on how many rows share the call (bit for bit). Prefetches C lines
// a step from ``ahead`` weights after w into L2 (the next chunk's lines of these panels: a
// step of a panel is a line).
template <bool WIDE, int R, int C, typename W>
static KERNEL void tile(const PanelCall<W>& a, const float* x, const W* w, float* y, int64_t o0, int64_t ahead) {
  typedef typename Isa<WIDE>::vec vec;
  constexpr int V = Isa<WIDE>::V, L = PANEL / V;  // vectors per panel row, lanes per vector
  constexpr int K = Layout<W>::K;                 // inputs per step
  const int64_t steps = a.in / K;                 // whole ones
  const W* next = w + ahead;                      // C lines a step
  vec acc[R][C * V] = {};
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) __builtin_prefetch(next + (s * C + c) * PANEL * K, 0, 2);
    step<WIDE, R, C, K>(acc, a, x, w, s);
  }
  if (K > 1 && steps * K < a.in) step<WIDE, R, C, 1>(acc, a, x, w, steps);  // the last input of an odd in
  const vec zero = {};
#pragma GCC unroll 16
  for (int j = 0; j < C * V; ++j) {
    const int64_t o = o0 + j * L, valid = std::min<int64_t>(L, a.out - o);
    if (valid <= 0) break;
    if (valid == L) {
      vec b;
      __builtin_memcpy(&b, a.bias + o, sizeof(vec));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        vec v = acc[r][j] + b;
        if (a.relu) v = v < zero ? zero : v;  // NaN stays NaN
        __builtin_memcpy(y + r * a.out + o, &v, sizeof(vec));
      }
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        float s[L];
        __builtin_memcpy(s, &acc[r][j], sizeof(vec));
        finish_partial(s, a.bias + o, y + r * a.out + o, valid, a.relu);
      }
    }
  }
}

// R rows through n panels from panel p: tiles of C panels, then of C / 2, ...
template <bool WIDE, int R, int C, typename W>
static KERNEL void panels_of(const PanelCall<W>& a, const float* x, float* y, int64_t p, int64_t n, int64_t ahead) {
  int64_t q = 0;
  for (; q + C <= n; q += C) tile<WIDE, R, C>(a, x, a.w + (p + q) * a.stride, y, (p + q) * PANEL, ahead);
  if constexpr (C > 1) panels_of<WIDE, R, C / 2>(a, x, y, p + q, n - q, ahead);
}

// the last rows of x (R or fewer: r of them) through n panels from panel p
template <bool WIDE, int R, typename W>
static KERNEL void row_group(const PanelCall<W>& a, int64_t m, int64_t r, int64_t p, int64_t n, int64_t ahead) {
  if (r == R || R == 1) {
    panels_of<WIDE, R, Isa<WIDE>::panels(R)>(a, a.x + m * a.in, a.y + m * a.out, p, n, ahead);
  } else if constexpr (R > 1) {
    row_group<WIDE, R - 1>(a, m, r, p, n, ahead);
  }
}

// Panels begin .. end - 1 for every row.
template <bool WIDE, typename W>
static KERNEL void panel_range(const PanelCall<W>& a, int64_t begin, int64_t end) {
  constexpr int64_t most = Isa<WIDE>::rows;
  const int64_t groups = (a.rows + most - 1) / most;
  for (int64_t p = begin; p < end; p += CHUNK) {
    const int64_t n = std::min(CHUNK, end - p);
    const int64_t ahead = p + CHUNK < end ? CHUNK * a.stride : 0;  // the next chunk's weights
    for (int64_t g = 0, m = 0; g < groups; m += group_rows(a.rows, groups, g++)) {
      row_group<WIDE, most>(a, m, group_rows(a.rows, groups, g), p, n, ahead);
    }
  }
}

template <typename W>
static void panel_range_avx2(const PanelCall<W>& a, int64_t begin, int64_t end) { panel_range<false>(a, begin, end); }

template <typename W>
__attribute__((target("avx512f"))) static void panel_range_avx512(const PanelCall<W>& a, int64_t begin, int64_t end) {
  panel_range<true>(a, begin, end);
}

static std::atomic<bool> use_avx512{__builtin_cpu_supports("avx512f")};

// The instruction set panel_linear uses ("avx512f" or "avx2"); ``choose``, if given, selects
// one (for tests and benchmarks: their results are the same, bit for bit).
std::string panel_isa(const std::string& choose) {
  if (!choose.empty()) {
    TORCH_CHECK(choose == "avx2" || (choose == "avx512f" && __builtin_cpu_supports("avx512f")),
                "panel_isa: avx2, or avx512f where the CPU has it; not ", choose);
    use_avx512 = choose == "avx512f";
  }
  return use_avx512 ? "avx512f" : "avx2";
}

// weight (out, in) -> float32 panels (ceil(out / 16), in, 16): panel p, row i holds
// weight[16 p .. 16 p + 15][i], zeros past out. With bf16, bfloat16 panels (ceil(out / 16),
// ceil(in / 2), 16, 2): [p][j][o][h] holds weight[16 p + o][2 j + h] rounded to bfloat16 (to
// nearest, ties to even: torch's float -> bfloat16 conversion), zeros past out and in
// (Layout).
torch::Tensor pack_panels(torch::Tensor weight, bool bf16) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat && !weight.is_cuda(),
              "pack_panels: a float32 CPU matrix (out, in)");
  const int64_t out_features = weight.size(0), in = weight.size(1), panels = (out_features + PANEL - 1) / PANEL;
  if (!bf16) {
    auto padded = torch::zeros({panels * PANEL, in}, weight.options());
    padded.slice(0, 0, out_features).copy_(weight);
    return padded.view({panels, PANEL, in}).transpose(1, 2).contiguous();  // (P, in, 16)
  }
  const int64_t pairs = (in + 1) / 2;
  auto padded = torch::zeros({panels * PANEL, 2 * pairs}, weight.options().dtype(torch::kBFloat16));
  padded.slice(0, 0, out_features).slice(1, 0, in).copy_(weight);  // rounded here
  return padded.view({panels, PANEL, pairs, 2}).transpose(1, 2).contiguous();  // (P, ceil(in / 2), 16, 2)
}

// panel_range on this call's instruction set for each of torch's intra-op threads
template <typename W>
static void run_panels(const PanelCall<W>& a, int64_t panels) {
  const bool wide = use_avx512;
  at::parallel_for(0, panels, CHUNK, [&](int64_t begin, int64_t end) {
    if (wide) panel_range_avx512(a, begin, end);
    else panel_range_avx2(a, begin, end);
  });
}

// x (..., in), panels of pack_panels (float32 (P, in, 16) or bfloat16 (P, ceil(in / 2), 16,
// 2)), bias (out,) -> (..., out)
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels, torch::Tensor bias, bool relu) {
  const bool bf16 = panels.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(x.scalar_type() == torch::kFloat && (panels.scalar_type() == torch::kFloat || bf16) &&
              bias.scalar_type() == torch::kFloat, "panel_linear: float32 inputs and bias, float32 or bfloat16 panels");
  TORCH_CHECK(panels.is_contiguous() && bias.is_contiguous() && !x.is_cuda() && !panels.is_cuda() && !bias.is_cuda(),
              "panel_linear: contiguous CPU tensors");
  const bool panel_shape = bf16 ? panels.dim() == 4 && panels.size(3) == 2 && x.dim() >= 1 &&
                                      panels.size(1) == (x.size(-1) + 1) / 2
                                : panels.dim() == 3 && x.dim() >= 1 && panels.size(1) == x.size(-1);
  TORCH_CHECK(panel_shape && panels.size(2) == PANEL && bias.dim() == 1 &&
              panels.size(0) == (bias.numel() + PANEL - 1) / PANEL, "panel_linear: shapes do not match");
  const auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = bias.numel();
  auto out = torch::empty(sizes, x.options());
  const int64_t rows = xc.numel() ? xc.numel() / xc.size(-1) : out.numel() ? out.numel() / bias.numel() : 0;
  if (out.numel() == 0) return out;
  const int64_t in = x.size(-1), stride = panels.numel() / panels.size(0);
  if (bf16) {
    const auto* w = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());  // the bits
    run_panels(PanelCall<uint16_t>{xc.data_ptr<float>(), w, bias.data_ptr<float>(), out.data_ptr<float>(),
                                   rows, in, bias.numel(), stride, relu}, panels.size(0));
  } else {
    run_panels(PanelCall<float>{xc.data_ptr<float>(), panels.data_ptr<float>(), bias.data_ptr<float>(),
                                out.data_ptr<float>(), rows, in, bias.numel(), stride, relu}, panels.size(0));
  }
  return out;
}

namespace {

// x (..., in) -> (..., out) on panels of pack_panels (float32 or bfloat16)
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& panels, const torch::Tensor& b, bool relu) {
  return panel_linear(x, panels, b, relu);
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
          const float acc = dot(qt, kb + j * k.stride(2), d);
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

struct Layer {  // the linear layers' *_w: panels of pack_panels (float32 or bfloat16)
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
  // when the layer has no encoder attention); the linear layers' weights as panels of
  // pack_panels (float32 or bfloat16), their biases dense (out,). numbers: self_scaling,
  // cross_scaling, the three layer norms' eps.
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
  m.def("pack_panels", &pack_panels, pybind11::arg("weight"), pybind11::arg("bf16") = false,
        "weight (out, in) -> float32 panels (ceil(out / 16), in, 16) for panel_linear; bf16: bfloat16 panels "
        "(ceil(out / 16), ceil(in / 2), 16, 2) of the weights rounded to bfloat16");
  m.def("panel_linear", &panel_linear, "x W^T + b (ReLU optional) on packed panels (float32 or bfloat16), float32 on CPU");
  m.def("panel_isa", &panel_isa, pybind11::arg("choose") = "",
        "the instruction set of panel_linear (avx512f or avx2); choose: select one");
  pybind11::class_<FusedDecoder>(m, "FusedDecoder")
      .def(pybind11::init<int64_t, bool>())
      .def("add_layer", &FusedDecoder::add_layer)
      .def("states", &FusedDecoder::states);
}
