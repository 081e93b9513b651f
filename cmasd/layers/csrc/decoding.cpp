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
// post- or pre-norm, ReLU or GELU feed-forward) run in one call: TransformerLayer.forward
// transcribed (the same residual blocks in the same order) with the block scorer's cache
// writes, on raw pointers into one workspace: no ATen operator and no allocation a step (at
// batch 1 a pass of ATen operators, a thousand of 0.3 to 3 us each, cost more than its
// arithmetic). Layer norms, residual additions, the cache writes and the attention are
// loops here; the linear layers run the panel kernel on a range of panels a thread. The
// threads of one at::parallel_for run the whole pass as a team (Member), sharing each
// step, instead of a parallel region a linear layer. The queries see the positions up to
// their own (``causal``: no mask to build) and/or an additive mask. Its parity with the
// Python layers is tested (tests/test_block_scoring.py), to float32 tolerance (the
// attention's sums and exponentials, and the layer norms', are not torch's).
// ATen's tensor, the three operators used and torch's pybind11 casters, not <torch/extension.h>:
// that header (the whole C++ frontend) was two thirds of the build (45 of 66 s on a 2-core
// Zen 3 host; the build is paid on first use on every fresh machine, CI's included).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
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
at::Tensor pack_panels(at::Tensor weight, bool bf16) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && !weight.is_cuda(),
              "pack_panels: a float32 CPU matrix (out, in)");
  const int64_t out_features = weight.size(0), in = weight.size(1), panels = (out_features + PANEL - 1) / PANEL;
  if (!bf16) {
    auto padded = at::zeros({panels * PANEL, in}, weight.options());
    padded.slice(0, 0, out_features).copy_(weight);
    return padded.view({panels, PANEL, in}).transpose(1, 2).contiguous();  // (P, in, 16)
  }
  const int64_t pairs = (in + 1) / 2;
  auto padded = at::zeros({panels * PANEL, 2 * pairs}, weight.options().dtype(at::kBFloat16));
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
at::Tensor panel_linear(at::Tensor x, at::Tensor panels, at::Tensor bias, bool relu) {
  const bool bf16 = panels.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.scalar_type() == at::kFloat && (panels.scalar_type() == at::kFloat || bf16) &&
              bias.scalar_type() == at::kFloat, "panel_linear: float32 inputs and bias, float32 or bfloat16 panels");
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
  auto out = at::empty(sizes, x.options());
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

// ---- FusedDecoder's pieces: loops on raw pointers into one workspace, no ATen operator a step ----

// A linear layer of the fused decoder: panels of pack_panels (float32 or bfloat16) and a dense
// bias, checked once (add_layer); y = x W^T + b (ReLU optional) on dense rows, a range of
// panels at a time (the team's threads share them), through panel_linear's kernel.
struct PanelLinear {
  at::Tensor panels, bias;  // held: the pointers below point into them
  const float* wf = nullptr;
  const uint16_t* wb = nullptr;  // bfloat16 panels: their bits
  const float* b = nullptr;
  int64_t in = 0, out = 0, stride = 0, count = 0;  // count: panels

  PanelLinear() = default;
  PanelLinear(const at::Tensor& p, const at::Tensor& bias_, int64_t in_features, int64_t out_features,
              const char* what)
      : panels(p), bias(bias_), in(in_features), out(out_features) {
    TORCH_CHECK(p.defined() && bias_.defined() && !p.is_cuda() && !bias_.is_cuda() && p.is_contiguous() &&
                bias_.is_contiguous() && bias_.scalar_type() == at::kFloat && bias_.dim() == 1 &&
                bias_.numel() == out_features, "FusedDecoder.add_layer: ", what, ": contiguous CPU panels and a float32 bias of ",
                out_features, " features");
    const bool bf16 = p.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || p.scalar_type() == at::kFloat, "FusedDecoder.add_layer: ", what,
                ": float32 or bfloat16 panels of pack_panels");
    const bool shape = bf16 ? p.dim() == 4 && p.size(1) == (in_features + 1) / 2 && p.size(3) == 2
                            : p.dim() == 3 && p.size(1) == in_features;
    TORCH_CHECK(shape && p.size(2) == PANEL && p.size(0) == (out_features + PANEL - 1) / PANEL,
                "FusedDecoder.add_layer: ", what, ": panels of a ", in_features, " -> ", out_features, " layer expected");
    count = p.size(0);
    stride = count ? p.numel() / count : 0;
    b = bias_.data_ptr<float>();
    if (bf16) wb = reinterpret_cast<const uint16_t*>(p.data_ptr<at::BFloat16>());
    else wf = p.data_ptr<float>();
  }

  // panels begin .. end - 1 of y = x W^T + b on the calling thread
  void range(const float* x, int64_t rows, float* y, bool relu, int64_t begin, int64_t end) const {
    if (rows == 0 || begin >= end) return;
    const bool wide = use_avx512;
    if (wb) {
      const PanelCall<uint16_t> a{x, wb, b, y, rows, in, out, stride, relu};
      if (wide) panel_range_avx512(a, begin, end);
      else panel_range_avx2(a, begin, end);
    } else {
      const PanelCall<float> a{x, wf, b, y, rows, in, out, stride, relu};
      if (wide) panel_range_avx512(a, begin, end);
      else panel_range_avx2(a, begin, end);
    }
  }

};

struct Norm {  // a layer norm's weight and bias (C,), float32
  at::Tensor weight, bias;
  const float *w = nullptr, *b = nullptr;
  float eps = 0.f;
  Norm() = default;
  Norm(const at::Tensor& w_, const at::Tensor& b_, double eps_, int64_t C, const char* what)
      : weight(w_), bias(b_), eps(static_cast<float>(eps_)) {
    for (const auto* t : {&w_, &b_}) {
      TORCH_CHECK(t->defined() && t->scalar_type() == at::kFloat && !t->is_cuda() && t->is_contiguous() &&
                  t->dim() == 1 && t->numel() == C, "FusedDecoder.add_layer: ", what, ": float32 weight and bias (", C, ",)");
    }
    w = w_.data_ptr<float>();
    b = b_.data_ptr<float>();
  }
};

// sum of x[0 .. n - 1]: 16 partial sums, reduced at the end
static inline float sum_of(const float* x, int64_t n) {
  v8 s0 = {0}, s1 = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += load8(x + i);
    s1 += load8(x + i + 8);
  }
  const v8 v = s0 + s1;
  float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  for (; i < n; ++i) s += x[i];
  return s;
}

// sum of (x[i] - mean)^2 over i < n, as sum_of
static inline float squares_about(const float* x, float mean, int64_t n) {
  v8 s0 = {0}, s1 = {0};
  const v8 m = {mean, mean, mean, mean, mean, mean, mean, mean};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const v8 a = load8(x + i) - m, c = load8(x + i + 8) - m;
    s0 += a * a;
    s1 += c * c;
  }
  const v8 v = s0 + s1;
  float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// torch.nn.functional.layer_norm over rows of C floats (y may be x): the mean, the biased
// variance, (x - mean) / sqrt(variance + eps) * w + b, in float32
static void layer_norm(const float* x, float* y, int64_t rows, int64_t C, const Norm& n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float mean = sum_of(xr, C) / static_cast<float>(C);
    const float var = squares_about(xr, mean, C) / static_cast<float>(C);
    const float rstd = 1.f / std::sqrt(var + n.eps);
    for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - mean) * rstd * n.w[i] + n.b[i];
  }
}

static inline void add_to(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// An additive 0 / -inf mask broadcast to (B, 1, T, keys): row (b, t) at p + b * sb + t * st,
// the keys dense; p null: none.
struct Mask {
  const float* p = nullptr;
  int64_t sb = 0, st = 0;
};

static Mask mask_of(const c10::optional<at::Tensor>& bias, int64_t B, int64_t T, int64_t Tk, const char* what) {
  Mask m;
  if (!bias.has_value() || !bias->defined()) return m;
  const at::Tensor& t = *bias;
  TORCH_CHECK(t.scalar_type() == at::kFloat && !t.is_cuda() && t.dim() <= 4,
              "FusedDecoder.states: ", what, ": a float32 CPU mask broadcastable to (B, 1, T, keys)");
  int64_t size[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
  for (int64_t k = 0, o = 4 - t.dim(); k < t.dim(); ++k) size[o + k] = t.size(k), stride[o + k] = t.stride(k);
  const int64_t want[4] = {B, 1, T, Tk};
  for (int k = 0; k < 4; ++k) {
    TORCH_CHECK(size[k] == want[k] || size[k] == 1, "FusedDecoder.states: ", what, ": a mask of shape ", t.sizes(),
                " does not broadcast to (", B, ", 1, ", T, ", ", Tk, ")");
  }
  TORCH_CHECK(Tk <= 1 || (size[3] == Tk && stride[3] == 1), "FusedDecoder.states: ", what,
              ": the mask's key dimension must be dense");
  m.p = t.data_ptr<float>();
  m.sb = size[0] == 1 ? 0 : stride[0];
  m.st = size[2] == 1 ? 0 : stride[2];
  return m;
}

struct Heads {  // (B, H, keys, d) float32 with element (b, h, j, e) at p + b * sb + h * sh + j * sj + e
  const float* p;
  int64_t sb, sh, sj;
};

// q . k for 4 keys at once, k0 .. k3 (d floats each, d a multiple of 8): 8 independent
// chains of fused multiply-adds (two a key), each reduced at the end
static inline void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3,
                        int64_t d, float* out) {
  v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
  int64_t e = 0;
  for (; e + 16 <= d; e += 16) {
    const v8 x = load8(q + e), y = load8(q + e + 8);
    a0 += x * load8(k0 + e), b0 += y * load8(k0 + e + 8);
    a1 += x * load8(k1 + e), b1 += y * load8(k1 + e + 8);
    a2 += x * load8(k2 + e), b2 += y * load8(k2 + e + 8);
    a3 += x * load8(k3 + e), b3 += y * load8(k3 + e + 8);
  }
  if (e < d) {  // the last 8
    const v8 x = load8(q + e);
    a0 += x * load8(k0 + e), a1 += x * load8(k1 + e), a2 += x * load8(k2 + e), a3 += x * load8(k3 + e);
  }
  const v8 s[4] = {a0 + b0, a1 + b1, a2 + b2, a3 + b3};
  for (int i = 0; i < 4; ++i) {
    const v8 v = s[i];
    out[i] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  }
}

// o[0 .. 8 NV - 1] = sum over j < keys of p[j] v[j sj + 0 .. 8 NV - 1], in registers
template <int NV>
static inline void weighted_sum(const float* p, int64_t keys, const float* v, int64_t sj, float* o) {
  v8 acc[NV] = {};
  for (int64_t j = 0; j < keys; ++j) {
    const float w = p[j];
    const float* vj = v + j * sj;
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) acc[u] += load8(vj + 8 * u) * w;
  }
  __builtin_memcpy(o, acc, sizeof(acc));
}

// exp(x) for 8 floats: Cephes' expf (x = n ln 2 + r, |r| <= ln 2 / 2, a polynomial of degree 6
// in r, times 2^n through the exponent bits), within 1 unit in the last place of std::exp;
// 0 below -87 (where a float's exponent ends: e^-87 is 1.6e-38), -inf included
static inline v8 exp8(v8 x) {
  const v8 hi = {88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f};
  x = x > hi ? hi : x;
  const v8 lo = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f};
  const auto underflow = x < lo;
  x = underflow ? lo : x;
  v8 n = x * 1.44269504088896341f;
  n = __builtin_ia32_roundps256(n, 0x08);  // to nearest
  v8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8 y = 1.9875691500e-4f * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.f;
  typedef int32_t i8 __attribute__((vector_size(32)));
  const i8 e = (__builtin_convertvector(n, i8) + 127) << 23;
  v8 scale;
  __builtin_memcpy(&scale, &e, sizeof(scale));
  const v8 zero = {0};
  return underflow ? zero : y * scale;
}

// s[j] = exp(s[j] - top) for j < n; returns their sum
static inline float exp_minus(float* s, int64_t n, float top) {
  const v8 t = {top, top, top, top, top, top, top, top};
  v8 acc = {0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8 v = exp8(load8(s + j) - t);
    __builtin_memcpy(s + j, &v, sizeof(v));
    acc += v;
  }
  if (j < n) {  // the last few, through a padded vector
    float tail[8];
    for (int i = 0; i < 8; ++i) tail[i] = j + i < n ? s[j + i] - top : -std::numeric_limits<float>::infinity();
    v8 v;
    __builtin_memcpy(&v, tail, sizeof(v));
    v = exp8(v);
    __builtin_memcpy(tail, &v, sizeof(v));
    for (int i = 0; j + i < n; ++i) s[j + i] = tail[i];
    acc += v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Scaled dot-product attention of query (b, h, t) (already scaled) at q + b * qb + t * qt + h d,
// for (b, h) = bh0 .. bh1 - 1 (b H + h), T queries each, over keys and values (b, h, j), j < Tk,
// masked by ``mask`` and, where ``limit`` is given, to j <= limit[b T + t] (the causal rule: a
// query sees the positions up to its own; the keys past it would weigh 0). softmax(q k^T +
// mask) v as fairseq computes it (max-subtracted exponentials over their sum), in float32,
// into out + b * ob + t * ot + h d (the heads merged). ``scores``: room for Tk floats.
struct Attention {
  float* q;
  int64_t qb, qt;
  float scale;  // not 0: the queries still to be multiplied by it (each unit its own, in place)
  Heads k, v;
  int64_t Tk;
  Mask mask;
  const int64_t* limit;
  float* out;
  int64_t ob, ot, H, T, d;

  // the cache lines of (b, h)'s keys and values into the caches (they come from L3 or memory:
  // a pass reads megabytes of weights between two reads of them)
  void prefetch(int64_t bh) const {
    const int64_t b = bh / H, h = bh % H;
    const float* kb = k.p + b * k.sb + h * k.sh;
    const float* vb = v.p + b * v.sb + h * v.sh;
    for (int64_t j = 0; j < Tk; ++j) {
      for (int64_t e = 0; e < d; e += 16) {
        __builtin_prefetch(kb + j * k.sj + e, 0, 3);
        __builtin_prefetch(vb + j * v.sj + e, 0, 3);
      }
    }
  }

  void operator()(int64_t bh0, int64_t bh1, float* scores) const {
    const bool vectors = d % 8 == 0;
    if (bh0 < bh1) prefetch(bh0);
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      if (bh + 1 < bh1) prefetch(bh + 1);
      const int64_t b = bh / H, h = bh % H;
      const float* kb = k.p + b * k.sb + h * k.sh;
      const float* vb = v.p + b * v.sb + h * v.sh;
      for (int64_t t = 0; t < T; ++t) {
        float* qr = q + b * qb + t * qt + h * d;
        if (scale != 0.f) {
          for (int64_t e = 0; e < d; ++e) qr[e] *= scale;
        }
        const float* mrow = mask.p ? mask.p + b * mask.sb + t * mask.st : nullptr;
        const int64_t keys = limit ? std::min(Tk, limit[b * T + t] + 1) : Tk;
        int64_t j = 0;
        if (vectors) {
          for (; j + 4 <= keys; j += 4) {
            dot4(qr, kb + j * k.sj, kb + (j + 1) * k.sj, kb + (j + 2) * k.sj, kb + (j + 3) * k.sj, d, scores + j);
          }
        }
        for (; j < keys; ++j) scores[j] = dot(qr, kb + j * k.sj, d);
        float top = -std::numeric_limits<float>::infinity();
        for (j = 0; j < keys; ++j) {
          if (mrow) scores[j] += mrow[j];
          top = std::max(top, scores[j]);
        }
        const float total = exp_minus(scores, keys, top);
        for (j = 0; j < keys; ++j) scores[j] /= total;
        float* o = out + b * ob + t * ot + h * d;
        int64_t e = 0;
        if (vectors) {
          for (; e + 64 <= d; e += 64) weighted_sum<8>(scores, keys, vb + e, v.sj, o + e);
          for (; e + 32 <= d; e += 32) weighted_sum<4>(scores, keys, vb + e, v.sj, o + e);
          for (; e + 16 <= d; e += 16) weighted_sum<2>(scores, keys, vb + e, v.sj, o + e);
          for (; e + 8 <= d; e += 8) weighted_sum<1>(scores, keys, vb + e, v.sj, o + e);
        }
        if (e < d) {
          for (int64_t i = e; i < d; ++i) o[i] = 0.f;
          for (j = 0; j < keys; ++j) {
            const float* vj = vb + j * v.sj;
            for (int64_t i = e; i < d; ++i) o[i] += scores[j] * vj[i];
          }
        }
      }
    }
  }
};

// A team: the threads of one at::parallel_for run a pass, every one the same sequence of
// steps. A step's items (shares of a linear layer's panels, of the attention's (row, head)
// pairs, of the rows) are claimed with an atomic counter, and a thread goes on to the next
// step once all of the step's items are done (it waits spinning, then yielding). Whatever
// threads the region gets (one does every item), the same items: the results do not depend
// on the threads. One region a pass instead of one a linear layer (an empty at::parallel_for
// costs about 0.5 us on 2 threads, 36 of them a 6-layer pass; measured on an AMD EPYC, 2
// threads: a verifier pass at 1 row 0.21 -> 0.19 ms, 16 rows 0.75 -> 0.72, a 1-layer draft
// model's step 37 -> 32 us), and the attention shared at every size. Nothing in a step may
// throw: a thread left waiting would wait forever.
struct alignas(64) Step {
  std::atomic<int64_t> next{0}, done{0};
};

struct Member {  // one thread of the team
  Step* steps;
  int64_t tid;  // 0 .. threads - 1
  int64_t threads;
  int64_t at = 0;  // the next step

  template <typename F>
  void step(int64_t items, const F& f) {
    Step& s = steps[at++];
    for (int64_t i; (i = s.next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      f(i);
      s.done.fetch_add(1, std::memory_order_release);
    }
    for (int64_t spins = 0; s.done.load(std::memory_order_acquire) < items; ++spins) {
      if (spins < 4096) __builtin_ia32_pause();
      else std::this_thread::yield();
    }
  }

  // 0 .. n - 1 in a share a thread (or fewer, if n is): f(first, end)
  template <typename F>
  void shares(int64_t n, const F& f) {
    const int64_t items = std::min(n, threads);
    step(items, [&](int64_t i) { f(i * n / items, (i + 1) * n / items); });
  }

  // x (R rows) through a linear layer into y, its panels in a share a thread
  void linear(const PanelLinear& l, const float* x, int64_t R, float* y, bool relu) {
    const int64_t chunks = (l.count + CHUNK - 1) / CHUNK, items = std::min(chunks, threads);
    step(items, [&](int64_t i) {
      const int64_t begin = i * chunks / items * CHUNK, end = std::min(l.count, (i + 1) * chunks / items * CHUNK);
      l.range(x, R, y, relu, begin, end);
    });
  }
};

struct Layer {
  PanelLinear qkv, self_out, cross_q, cross_out, fc1, fc2;
  Norm self_norm, cross_norm, final_norm;
  float self_scaling, cross_scaling;  // 0: folded into the weights
  bool has_cross;
  bool gelu;  // the feed-forward's activation: GELU (erf's, fairseq's "gelu"), else ReLU
};

// fairseq's "gelu" (torch.nn.functional.gelu, the exact one: x/2 (1 + erf(x / sqrt 2))) for 8
// floats, with erf as torch's vectorized CPU kernel computes it (Abramowitz and Stegun 7.1.26:
// 1 - t (p1 + p2 t + ... + p5 t^4) exp(-z^2), t = 1 / (1 + p |z|), absolute error below 1.5e-7;
// the same operations in the same order, exp8 for Sleef's expf): equal to torch's GELU to float
// tolerance. std::erf cost 12-16 ns a float on a Zen 4 core (docs/results/kernels.md): about
// 0.08 ms of a 1-row pass of a 6-layer decoder with 1,024-wide feed-forwards, about 4 ms of an
// 80-row pass on 2 threads; this, about 1 ns.
static inline v8 gelu8(v8 x) {
  typedef int32_t i8 __attribute__((vector_size(32)));
  const v8 z = x * 0.70710678118654752f;
  i8 bits;
  __builtin_memcpy(&bits, &z, sizeof(bits));
  const i8 sign = bits & static_cast<int32_t>(0x80000000u);
  bits ^= sign;
  v8 a;  // |z|
  __builtin_memcpy(&a, &bits, sizeof(a));
  const v8 t = 1.f / (0.3275911f * a + 1.f);
  v8 r = 1.061405429f * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const v8 e = (-exp8(-(z * z)) * t) * r + 1.f;  // erf(|z|)
  i8 ebits;
  __builtin_memcpy(&ebits, &e, sizeof(ebits));
  ebits ^= sign;
  v8 erf;
  __builtin_memcpy(&erf, &ebits, sizeof(erf));
  return 0.5f * x * (1.f + erf);
}

// gelu8 over n floats in place; the last few through a padded vector, so that a float's GELU
// does not depend on where a thread's share begins or how many rows the pass has
static void gelu_in_place(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8 y = gelu8(load8(x + i));
    __builtin_memcpy(x + i, &y, sizeof(y));
  }
  if (i < n) {
    float tail[8] = {0};
    std::memcpy(tail, x + i, (n - i) * sizeof(float));
    const v8 y = gelu8(load8(tail));
    std::memcpy(x + i, &y, (n - i) * sizeof(float));
  }
}

}  // namespace

at::Tensor embed_rows(at::Tensor tokens, at::Tensor start, at::Tensor token_table,
                      c10::optional<at::Tensor> position_table, double scale, int64_t offset, int64_t last);
at::Tensor panel_linear(at::Tensor x, at::Tensor panels, at::Tensor bias, bool relu);

class FusedDecoder {
 public:
  FusedDecoder(int64_t heads, bool normalize_before) : heads_(heads), normalize_before_(normalize_before) {
    TORCH_CHECK(heads > 0, "FusedDecoder: heads > 0");
  }

  // tensors: qkv w, b; self_out w, b; self_norm w, b; cross_q w, b; cross_out w, b;
  // cross_norm w, b; fc1 w, b; fc2 w, b; final_norm w, b (cross ones undefined/empty
  // when the layer has no encoder attention); the linear layers' weights as panels of
  // pack_panels (float32 or bfloat16), their biases dense (out,). numbers: self_scaling,
  // cross_scaling, the three layer norms' eps. Every layer of one width C (qkv: C -> 3C).
  void add_layer(std::vector<at::Tensor> t, std::vector<double> numbers, bool has_cross, bool gelu) {
    TORCH_CHECK(t.size() == 18 && numbers.size() == 5, "FusedDecoder.add_layer: 18 tensors and 5 numbers");
    TORCH_CHECK(t[1].defined() && t[1].dim() == 1 && t[1].numel() % 3 == 0, "FusedDecoder.add_layer: a qkv bias (3C,)");
    const int64_t C = t[1].numel() / 3;
    TORCH_CHECK(C % heads_ == 0 && (layers_.empty() || C == width_), "FusedDecoder.add_layer: a width C that the ",
                heads_, " heads divide, the same in every layer");
    TORCH_CHECK(t[13].defined() && t[13].dim() == 1, "FusedDecoder.add_layer: an fc1 bias (F,)");
    const int64_t F = t[13].numel();
    Layer L;
    L.qkv = PanelLinear(t[0], t[1], C, 3 * C, "qkv");
    L.self_out = PanelLinear(t[2], t[3], C, C, "self_out");
    L.self_norm = Norm(t[4], t[5], numbers[2], C, "self_norm");
    if (has_cross) {
      L.cross_q = PanelLinear(t[6], t[7], C, C, "cross_q");
      L.cross_out = PanelLinear(t[8], t[9], C, C, "cross_out");
      L.cross_norm = Norm(t[10], t[11], numbers[3], C, "cross_norm");
    }
    L.fc1 = PanelLinear(t[12], t[13], C, F, "fc1");
    L.fc2 = PanelLinear(t[14], t[15], F, C, "fc2");
    L.final_norm = Norm(t[16], t[17], numbers[4], C, "final_norm");
    L.self_scaling = static_cast<float>(numbers[0]);
    L.cross_scaling = static_cast<float>(numbers[1]);
    L.has_cross = has_cross;
    L.gelu = gelu;
    width_ = C;
    layers_.push_back(std::move(L));
  }

  // x (B, T, C) at sequence positions ``index`` (B, T) int64 (or the scatter index (B, 2H,
  // T, d) of the new keys/values, whose [b, 0, t, 0] it reads): the block's new keys and
  // values go into each layer's cache (B, 2H, capacity, d) at those positions. The queries
  // see cache positions < used, masked by self_bias (broadcastable to (B, 1, T, used); none:
  // all) and, with ``causal``, only those <= their own position; or, with ``limits`` (B, T)
  // int64, only those <= the query's limit (the Spec-Drafter's slots see every slot of their
  // row, past their own position). cross: per layer encoder keys and values (B, H, S, d),
  // cross_bias (broadcastable to (B, 1, 1, S)). Returns (B, T, C).
  at::Tensor states(const at::Tensor& x, const std::vector<at::Tensor>& kv, const at::Tensor& index,
                       int64_t used, const c10::optional<at::Tensor>& self_bias,
                       const std::vector<at::Tensor>& cross_k, const std::vector<at::Tensor>& cross_v,
                       const c10::optional<at::Tensor>& cross_bias, bool causal,
                       const c10::optional<at::Tensor>& limits) {
    const size_t n_layers = layers_.size();
    TORCH_CHECK(kv.size() == n_layers && cross_k.size() == n_layers && cross_v.size() == n_layers,
                "FusedDecoder.states: one cache and one encoder key/value pair per layer");
    TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && !x.is_cuda() && (n_layers == 0 || x.size(2) == width_),
                "FusedDecoder.states: x (B, T, C) float32 on the CPU, C the layers' width");
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = heads_, d = C / H, R = B * T;
    auto result = at::empty({B, T, C}, x.options());
    float* xs = result.data_ptr<float>();
    {  // x's rows into the result, where the layers update them
      const float* xp = x.data_ptr<float>();
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) {
          const float* src = xp + b * x.stride(0) + t * x.stride(1);
          float* dst = xs + (b * T + t) * C;
          if (x.stride(2) == 1) std::copy(src, src + C, dst);
          else for (int64_t c = 0; c < C; ++c) dst[c] = src[c * x.stride(2)];
        }
      }
    }
    if (R == 0 || n_layers == 0) return result;

    // the positions, (B, T)
    TORCH_CHECK(index.scalar_type() == at::kLong && !index.is_cuda() &&
                ((index.dim() == 2 && index.size(0) == B && index.size(1) == T) ||
                 (index.dim() == 4 && index.size(0) == B && index.size(2) == T)),
                "FusedDecoder.states: positions (B, T) int64 (or the scatter index (B, 2H, T, d))");
    positions_.resize(R);
    {
      const int64_t* ip = index.data_ptr<int64_t>();
      const int64_t sb = index.stride(0), st = index.stride(index.dim() == 2 ? 1 : 2);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) positions_[b * T + t] = ip[b * sb + t * st];
      }
    }
    const int64_t lowest = *std::min_element(positions_.begin(), positions_.end());
    const int64_t highest = *std::max_element(positions_.begin(), positions_.end());
    TORCH_CHECK(lowest >= 0 && used >= 1, "FusedDecoder.states: positions >= 0, used >= 1");
    const Mask self_mask = mask_of(self_bias, B, T, used, "self_bias");
    const int64_t* limit = causal ? positions_.data() : nullptr;
    if (limits.has_value() && limits->defined()) {
      const at::Tensor& l = *limits;
      TORCH_CHECK(!causal && l.scalar_type() == at::kLong && !l.is_cuda() && l.dim() == 2 && l.size(0) == B &&
                  l.size(1) == T, "FusedDecoder.states: limits (B, T) int64 on the CPU, and not causal");
      limits_.resize(R);
      const int64_t* lp = l.data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) limits_[b * T + t] = lp[b * l.stride(0) + t * l.stride(1)];
      }
      limit = limits_.data();
    }

    // the workspace: h (R, C) the sublayers' input (pre-norm), qkv (R, 3C), att (R, C), sub (R, C)
    // the sublayers' output, cq (R, C), ff (R, F), scores (the most keys)
    int64_t F = 0, most_keys = used;
    for (size_t i = 0; i < n_layers; ++i) {
      F = std::max(F, layers_[i].fc1.out);
      if (layers_[i].has_cross) {
        const at::Tensor &k = cross_k[i], &v = cross_v[i];
        TORCH_CHECK(k.defined() && v.defined() && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() &&
                    (k.size(0) == B || k.size(0) == 1) && k.size(1) == H && k.size(3) == d &&
                    k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat && !k.is_cuda() &&
                    !v.is_cuda() && k.stride(3) == 1 && v.stride(3) == 1,
                    "FusedDecoder.states: encoder keys and values (B, H, S, d) float32 on the CPU, the head dimension dense");
        most_keys = std::max(most_keys, k.size(2));
      }
    }
    const size_t need = static_cast<size_t>(R * (C + 3 * C + C + C + C + F) + most_keys * at::get_num_threads());
    if (work_.size() < need) work_.resize(need);
    float* h = work_.data();
    float* qkv = h + R * C;
    float* att = qkv + R * 3 * C;
    float* sub = att + R * C;
    float* cq = sub + R * C;
    float* ff = cq + R * C;
    float* scores = ff + R * F;

    views_.resize(n_layers);
    for (size_t i = 0; i < n_layers; ++i) {
      const at::Tensor& cache = kv[i];
      TORCH_CHECK(cache.dim() == 4 && cache.size(0) == B && cache.size(1) == 2 * H && cache.size(3) == d &&
                  cache.scalar_type() == at::kFloat && !cache.is_cuda() && cache.stride(3) == 1,
                  "FusedDecoder.states: caches (B, 2H, capacity, d) float32 on the CPU, the head dimension dense");
      TORCH_CHECK(used <= cache.size(2) && highest < cache.size(2), "FusedDecoder.states: the block reaches position ",
                  std::max(used - 1, highest), ", past the cache's capacity ", cache.size(2));
      View& w = views_[i];
      w.kv = cache.data_ptr<float>();
      w.cb = cache.stride(0), w.ch = cache.stride(1), w.cj = cache.stride(2);
      if (layers_[i].has_cross) {
        const at::Tensor &k = cross_k[i], &v = cross_v[i];
        w.ck = Heads{k.data_ptr<float>(), k.size(0) == 1 ? 0 : k.stride(0), k.stride(1), k.stride(2)};
        w.cv = Heads{v.data_ptr<float>(), v.size(0) == 1 ? 0 : v.stride(0), v.stride(1), v.stride(2)};
        w.S = k.size(2);
        w.cross_mask = mask_of(cross_bias, B, T, w.S, "cross_bias");
      }
    }

    // the pass, run by every thread of the team (TransformerLayer.forward: the residual blocks'
    // layer norms and additions in row steps, each block's output added and normalised
    // (post-norm) in the same step as the next block's input normalised (pre-norm))
    const bool pre_norm = normalize_before_;
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    const int64_t n_steps = 1 + 13 * static_cast<int64_t>(n_layers);  // at most 13 a layer (12 and GELU)
    if (n_steps > steps_size_) {
      steps_.reset(new Step[n_steps]);
      steps_size_ = n_steps;
    }
    for (int64_t i = 0; i < n_steps; ++i) steps_[i].next = 0, steps_[i].done = 0;
    const float* in = pre_norm ? h : xs;  // the sublayers' input
    auto pass = [&](Member& m) {
      float* my_scores = scores + m.tid * most_keys;
      if (pre_norm) m.shares(R, [&](int64_t r0, int64_t r1) {
        layer_norm(xs + r0 * C, h + r0 * C, r1 - r0, C, layers_[0].self_norm);
      });
      for (size_t i = 0; i < n_layers; ++i) {
        const Layer& L = layers_[i];
        const View& w = views_[i];
        // self-attention
        m.linear(L.qkv, in, R, qkv, false);  // (B, T, 3H, d): queries, keys, values
        m.shares(R, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            float* row = qkv + r * 3 * C;
            if (L.self_scaling != 0.f) {
              for (int64_t c = 0; c < C; ++c) row[c] *= L.self_scaling;
            }
            float* dst = w.kv + (r / T) * w.cb + positions_[r] * w.cj;  // the new keys and values into the cache
            for (int64_t g = 0; g < 2 * H; ++g) std::copy(row + C + g * d, row + C + (g + 1) * d, dst + g * w.ch);
          }
        });
        const Attention self{qkv, T * 3 * C, 3 * C, 0.f, Heads{w.kv, w.cb, w.ch, w.cj},
                             Heads{w.kv + H * w.ch, w.cb, w.ch, w.cj}, used, self_mask, limit, att, T * C, C, H, T, d};
        m.shares(B * H, [&](int64_t u0, int64_t u1) { self(u0, u1, my_scores); });
        m.linear(L.self_out, att, R, sub, false);
        const Norm& after_self = L.has_cross ? L.cross_norm : L.final_norm;
        m.shares(R, [&](int64_t r0, int64_t r1) { residual(xs, sub, h, r0, r1, C, L.self_norm, after_self); });
        if (L.has_cross) {  // encoder attention
          m.linear(L.cross_q, in, R, cq, false);
          const Attention cross{cq, T * C, C, L.cross_scaling, w.ck, w.cv, w.S, w.cross_mask, nullptr, att, T * C, C,
                                H, T, d};
          m.shares(B * H, [&](int64_t u0, int64_t u1) { cross(u0, u1, my_scores); });
          m.linear(L.cross_out, att, R, sub, false);
          m.shares(R, [&](int64_t r0, int64_t r1) { residual(xs, sub, h, r0, r1, C, L.cross_norm, L.final_norm); });
        }
        // feed-forward
        m.linear(L.fc1, in, R, ff, !L.gelu);
        if (L.gelu) {
          const int64_t width = L.fc1.out;
          m.shares(R, [&](int64_t r0, int64_t r1) { gelu_in_place(ff + r0 * width, (r1 - r0) * width); });
        }
        m.linear(L.fc2, ff, R, sub, false);
        const Norm* next = i + 1 < n_layers ? &layers_[i + 1].self_norm : nullptr;
        m.shares(R, [&](int64_t r0, int64_t r1) { residual(xs, sub, h, r0, r1, C, L.final_norm, next ? *next : L.final_norm, next != nullptr); });
      }
    };
    if (threads == 1 || at::in_parallel_region()) {
      Member m{steps_.get(), 0, 1};
      pass(m);
    } else {
      at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t) {
        Member m{steps_.get(), begin, threads};
        pass(m);
      });
    }
    return result;
  }

  // A draft model's greedy steps after its feed, one call in place of a Python loop of
  // about ten operator calls a step. From ``last`` (B, 1, C), each row's state after the layers
  // at its last token, ``steps`` times: the head (the decoder's final layer norm where
  // ``norm_weight`` is given, at::layer_norm as torch.nn.LayerNorm runs it; the output
  // projection on its panels) gives each row's logits (B, 1, N); their argmax (at::argmax,
  // torch's choice among equals), read through ``ids`` (N,) where given (a shortlist's
  // vocabulary ids), is step i's token; before every step but the first, the last token's
  // input (embed_rows: sequence index lengths + i - 1, fairseq position that + ``offset``, at
  // most ``last_position``) runs through the layers there (``states``, causal), seeing cache
  // positions < longest + i, its keys and values written into the cache. The same calls on the
  // same shapes as the Python loop it replaces (AutoregressiveDrafter.draft), so the same
  // values. Returns the tokens (B, steps) int64 and the logits (B, steps, N).
  //
  // With ``feed_tokens`` (B, W) int64, the feed before the steps runs here too, as the Python
  // feed (AutoregressiveDrafter.draft, BlockScorer.states) runs it: each row's last ``fed``
  // tokens (start = max(lengths - fed, 0), token indices start + j, at most W - 1) through the
  // layers at sequence index start onwards (embed_rows, then ``states``, causal, seeing cache
  // positions < ``feed_used``); ``last`` is then each row's state at its last token (index
  // lengths - 1 - start of the fed block), and the ``last`` given is not read (None).
  std::vector<at::Tensor> greedy(const c10::optional<at::Tensor>& given_last, int64_t steps, const at::Tensor& lengths,
                                 int64_t longest,
                                 const std::vector<at::Tensor>& kv, const std::vector<at::Tensor>& cross_k,
                                 const std::vector<at::Tensor>& cross_v, const c10::optional<at::Tensor>& cross_bias,
                                 const at::Tensor& token_table, const c10::optional<at::Tensor>& position_table,
                                 double scale, int64_t offset, int64_t last_position,
                                 const c10::optional<at::Tensor>& norm_weight,
                                 const c10::optional<at::Tensor>& norm_bias, double eps, const at::Tensor& panels,
                                 const at::Tensor& bias, const c10::optional<at::Tensor>& ids,
                                 const c10::optional<at::Tensor>& feed_tokens, int64_t fed, int64_t feed_used) {
    TORCH_CHECK(steps >= 1, "FusedDecoder.greedy: steps >= 1");
    TORCH_CHECK(lengths.dim() == 1 && lengths.scalar_type() == at::kLong && !lengths.is_cuda(),
                "FusedDecoder.greedy: lengths (B,) int64 on the CPU");
    const int64_t B = lengths.size(0);
    at::Tensor last;
    if (feed_tokens.has_value() && feed_tokens->defined()) {
      const at::Tensor& tokens = *feed_tokens;
      TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == B && tokens.size(1) >= 1 &&
                  tokens.scalar_type() == at::kLong && !tokens.is_cuda() && fed >= 1,
                  "FusedDecoder.greedy: feed tokens (B, W) int64 on the CPU and fed >= 1");
      const int64_t W = tokens.size(1), C = width_;
      const auto lens = lengths.contiguous(), toks = tokens.contiguous();
      const int64_t* lp = lens.data_ptr<int64_t>();
      const int64_t* tp = toks.data_ptr<int64_t>();
      at::Tensor start = at::empty({B}, lengths.options()), chosen = at::empty({B, fed}, lengths.options());
      at::Tensor positions = at::empty({B, fed}, lengths.options());
      int64_t* sp = start.data_ptr<int64_t>();
      int64_t* cp = chosen.data_ptr<int64_t>();
      int64_t* pp = positions.data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        sp[b] = std::max<int64_t>(lp[b] - fed, 0);
        for (int64_t j = 0; j < fed; ++j) {
          cp[b * fed + j] = tp[b * W + std::min(sp[b] + j, W - 1)];  // token index start + j, at most W - 1
          pp[b * fed + j] = sp[b] + j;
        }
      }
      const at::Tensor input = embed_rows(chosen, start, token_table, position_table, scale, offset,
                                          last_position);  // (B, fed, C)
      const at::Tensor fed_states = states(input, kv, positions, feed_used, c10::nullopt, cross_k, cross_v, cross_bias,
                                           true, c10::nullopt);  // (B, fed, C)
      if (fed == 1) {
        last = fed_states;
      } else {  // each row's state at its last token
        last = at::empty({B, 1, C}, fed_states.options());
        const float* fs = fed_states.data_ptr<float>();
        float* ls = last.data_ptr<float>();
        for (int64_t b = 0; b < B; ++b) {
          const int64_t t = lp[b] - 1 - sp[b];
          TORCH_CHECK(t >= 0 && t < fed, "FusedDecoder.greedy: a row's last token outside the fed block");
          std::copy(fs + (b * fed + t) * C, fs + (b * fed + t + 1) * C, ls + b * C);
        }
      }
    } else {
      TORCH_CHECK(given_last.has_value() && given_last->defined(), "FusedDecoder.greedy: last or the feed's tokens");
      last = *given_last;
    }
    TORCH_CHECK(last.dim() == 3 && last.size(0) == B && last.size(1) == 1 && last.scalar_type() == at::kFloat &&
                !last.is_cuda(), "FusedDecoder.greedy: last (B, 1, C) float32 on the CPU");
    const bool normed = norm_weight.has_value() && norm_weight->defined();
    const bool mapped = ids.has_value() && ids->defined();
    std::vector<at::Tensor> tokens, logits;
    tokens.reserve(steps), logits.reserve(steps);
    at::Tensor x = last;
    for (int64_t i = 0; i < steps; ++i) {
      if (i > 0) {  // the last token through the layers at sequence index lengths + i - 1
        const at::Tensor start = lengths.add(i - 1);  // (B,)
        const at::Tensor input = embed_rows(tokens.back().unsqueeze(1), start, token_table,
                                            position_table, scale, offset, last_position);  // (B, 1, C)
        x = states(input, kv, start.unsqueeze(1), longest + i, c10::nullopt, cross_k, cross_v, cross_bias, true, c10::nullopt);
      }
      const at::Tensor h = normed ? at::layer_norm(x, {x.size(2)}, norm_weight, norm_bias, eps) : x;
      const at::Tensor step = panel_linear(h, panels, bias, false).select(1, 0);  // (B, N)
      const at::Tensor best = step.argmax(-1);  // (B,)
      tokens.push_back(mapped ? ids->index_select(0, best) : best);
      logits.push_back(step);
    }
    return {at::stack(tokens, 1), at::stack(logits, 1)};
  }

 private:
  // Rows r0 .. r1 - 1 between two residual blocks (TransformerLayer.residual): x += the
  // block's output ``sub``, normalised by the block's norm ``done`` (post-norm); then the next
  // block's input normalised by its norm ``next`` into h (pre-norm; unless ``more`` is false:
  // no next block).
  void residual(float* x, const float* sub, float* h, int64_t r0, int64_t r1, int64_t C, const Norm& done,
                const Norm& next, bool more = true) const {
    add_to(x + r0 * C, sub + r0 * C, (r1 - r0) * C);
    if (!normalize_before_) layer_norm(x + r0 * C, x + r0 * C, r1 - r0, C, done);
    else if (more) layer_norm(x + r0 * C, h + r0 * C, r1 - r0, C, next);
  }

  int64_t heads_;
  bool normalize_before_;
  int64_t width_ = 0;
  std::vector<Layer> layers_;
  struct View {  // a layer's caches and encoder keys/values in a pass
    float* kv;
    int64_t cb, ch, cj;
    Heads ck, cv;
    int64_t S;
    Mask cross_mask;
  };
  std::vector<View> views_;
  std::unique_ptr<Step[]> steps_;    // a pass's steps
  int64_t steps_size_ = 0;
  std::vector<float> work_;          // the workspace of states, grown as needed
  std::vector<int64_t> positions_;   // the block's positions (B T)
  std::vector<int64_t> limits_;      // the queries' last visible positions (B T), where given
};

// embed_rows: a decoder's plain input, fairseq's arithmetic in its order: each token's row of
// the token table times the scale, rounded, then its position's row added (position start[b] +
// j + offset, at most last). One call in place of an index computation, two lookups, a multiply
// and an add (about 15 us of operator calls at batch 1, the arithmetic well under one). The
// multiply and the add stay two roundings: no fused multiply-add here (fp-contract off), so
// that the result is torch's bit for bit.
__attribute__((optimize("fp-contract=off")))
at::Tensor embed_rows(at::Tensor tokens, at::Tensor start, at::Tensor token_table,
                         c10::optional<at::Tensor> position_table, double scale, int64_t offset, int64_t last) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && start.dim() == 1 &&
              start.scalar_type() == at::kLong && start.size(0) == tokens.size(0),
              "embed_rows: tokens (B, n) and start (B,), int64");
  TORCH_CHECK(token_table.dim() == 2 && token_table.scalar_type() == at::kFloat && token_table.is_contiguous() &&
              !token_table.is_cuda() && !tokens.is_cuda(), "embed_rows: a contiguous float32 token table (V, C) on CPU");
  const bool positions = position_table.has_value() && position_table->defined();
  if (positions)
    TORCH_CHECK(position_table->dim() == 2 && position_table->scalar_type() == at::kFloat &&
                position_table->is_contiguous() && position_table->size(1) == token_table.size(1) &&
                last < position_table->size(0), "embed_rows: a contiguous float32 position table (P, C), P > last");
  const auto tok = tokens.contiguous(), first = start.contiguous();
  const int64_t B = tok.size(0), n = tok.size(1), C = token_table.size(1), V = token_table.size(0);
  auto out = at::empty({B, n, C}, token_table.options());
  const int64_t* t = tok.data_ptr<int64_t>();
  const int64_t* s = first.data_ptr<int64_t>();
  const float* table = token_table.data_ptr<float>();
  const float* ptable = positions ? position_table->data_ptr<float>() : nullptr;
  float* y = out.data_ptr<float>();
  const float f = static_cast<float>(scale);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t id = t[b * n + j];
      TORCH_CHECK(id >= 0 && id < V, "embed_rows: token ", id, " outside the table's ", V, " rows");
      const float* e = table + id * C;
      float* o = y + (b * n + j) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] * f;
      if (positions) {
        const float* p = ptable + std::min(s[b] + j + offset, last) * C;
        for (int64_t c = 0; c < C; ++c) o[c] += p[c];
      }
    }
  }
  return out;
}

// top1: the greedy token of every row of x (N, V), float32: the index torch.topk(row, 2) gives
// first, as fairseq's --beam 1 chooses it. Where a row's largest value is unique and no value
// is NaN that is its index, found in two vectorised passes (the largest value with each lane's
// first index of it and a NaN check, then a count of the values equal to it); a row with a tie
// for the largest, or a NaN, is handed to torch.topk itself, whose order among equals is its
// own (not the first index's), so that every row gets what topk gives it. torch.topk at one
// row of 8,000 values took 26 us here, these passes about 1 (a 5-position block: 77 us).
typedef int32_t i8v __attribute__((vector_size(32)));

// the index of the largest of row[0 .. V), or -1 where it is not unique or a value is NaN
static int64_t unique_largest(const float* row, int64_t V) {
  const float lowest = -std::numeric_limits<float>::infinity();
  const v8 low = {lowest, lowest, lowest, lowest, lowest, lowest, lowest, lowest};
  v8 b0 = low, b1 = low, b2 = low, b3 = low;  // four chains: the comparisons' latency overlaps
  i8v nan = {0};
  int64_t i = 0;
  for (; i + 32 <= V; i += 32) {
    const v8 x0 = load8(row + i), x1 = load8(row + i + 8), x2 = load8(row + i + 16), x3 = load8(row + i + 24);
    nan |= (x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3);
    b0 = x0 > b0 ? x0 : b0;
    b1 = x1 > b1 ? x1 : b1;
    b2 = x2 > b2 ? x2 : b2;
    b3 = x3 > b3 ? x3 : b3;
  }
  for (; i + 8 <= V; i += 8) {
    const v8 x = load8(row + i);
    nan |= (x != x);
    b0 = x > b0 ? x : b0;
  }
  b0 = b1 > b0 ? b1 : b0;
  b2 = b3 > b2 ? b3 : b2;
  b0 = b2 > b0 ? b2 : b0;
  float m = lowest;
  for (int l = 0; l < 8; ++l) {
    if (nan[l]) return -1;
    m = std::max(m, b0[l]);
  }
  for (; i < V; ++i) {
    if (row[i] != row[i]) return -1;
    m = std::max(m, row[i]);
  }
  // the values equal to it: the first one's index, and whether there is another
  const v8 top = {m, m, m, m, m, m, m, m};
  int64_t first = -1, equal = 0, j = 0;
  for (; j + 8 <= V; j += 8) {
    const int mask = _mm256_movemask_ps((__m256)(load8(row + j) == top));
    if (mask) {
      if (first < 0) first = j + __builtin_ctz(mask);
      equal += __builtin_popcount(mask);
    }
  }
  for (; j < V; ++j) {
    if (row[j] == m) {
      if (first < 0) first = j;
      ++equal;
    }
  }
  return equal == 1 ? first : -1;  // every value -inf: a tie, which topk decides
}

// spec_block_inputs: a Spec-Drafter pass's inputs in the fused layers (SpecDrafter.fused_logits),
// in one call where about twenty torch operators built them. Row b feeds its tokens not yet
// cached, ``most_new`` positions from cached[b] (index cached[b] + j; those past lengths[b] are
// padding, token ``pad``, written into the scratch column ``capacity``; the token read at
// min(index, W - 1) of tokens (B, W)), as embed_rows makes them (fairseq position index +
// ``offset``, at most ``last``); then ``block`` slots at indices lengths[b] + k, each the row of
// ``slot_table`` at fairseq position min(lengths[b] + k + offset, last). Returns x (B, N + K, C),
// the limits (B, N + K) (a prefix token sees up to its own index, a slot up to its row's last
// slot) and where each position's keys and values are written (B, N + K): the same tensors as
// the operators', value for value.
std::vector<at::Tensor> spec_block_inputs(at::Tensor tokens, at::Tensor lengths, at::Tensor cached, int64_t most_new,
                                          int64_t block, int64_t pad, int64_t capacity, at::Tensor token_table,
                                          c10::optional<at::Tensor> position_table, double scale, int64_t offset,
                                          int64_t last, at::Tensor slot_table) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && !tokens.is_cuda() && tokens.size(1) > 0,
              "spec_block_inputs: int64 tokens (B, W) on CPU, W > 0");
  const int64_t B = tokens.size(0), W = tokens.size(1);
  TORCH_CHECK(lengths.dim() == 1 && cached.dim() == 1 && lengths.size(0) == B && cached.size(0) == B &&
              lengths.scalar_type() == at::kLong && cached.scalar_type() == at::kLong && !lengths.is_cuda() &&
              !cached.is_cuda(), "spec_block_inputs: int64 lengths and cached counts (B,) on CPU");
  TORCH_CHECK(most_new >= 0 && block >= 1, "spec_block_inputs: most_new >= 0 and block >= 1");
  TORCH_CHECK(slot_table.dim() == 2 && slot_table.scalar_type() == at::kFloat && slot_table.is_contiguous() &&
              slot_table.size(1) == token_table.size(1) && slot_table.size(0) > last,
              "spec_block_inputs: a float32 slot table (positions > last, C), contiguous");
  const auto toks = tokens.contiguous(), lens = lengths.contiguous(), have = cached.contiguous();
  const int64_t* t = toks.data_ptr<int64_t>();
  const int64_t* len = lens.data_ptr<int64_t>();
  const int64_t* c = have.data_ptr<int64_t>();
  const int64_t N = most_new, K = block, C = token_table.size(1);
  auto fed = at::empty({B, N}, tokens.options());
  auto limits = at::empty({B, N + K}, tokens.options());
  auto write_at = at::empty({B, N + K}, tokens.options());
  int64_t* f = fed.data_ptr<int64_t>();
  int64_t* l = limits.data_ptr<int64_t>();
  int64_t* w = write_at.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < N; ++j) {
      const int64_t index = c[b] + j;
      const bool fresh = j < len[b] - c[b];
      f[b * N + j] = fresh ? t[b * W + std::min(index, W - 1)] : pad;
      l[b * (N + K) + j] = index;
      w[b * (N + K) + j] = fresh ? index : capacity;
    }
    for (int64_t k = 0; k < K; ++k) {
      l[b * (N + K) + N + k] = len[b] + K - 1;
      w[b * (N + K) + N + k] = len[b] + k;
    }
  }
  auto x = at::empty({B, N + K, C}, token_table.options());
  float* out = x.data_ptr<float>();
  if (N > 0) {
    const auto prefix = embed_rows(fed, have, token_table, position_table, scale, offset, last);  // (B, N, C)
    const float* e = prefix.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) std::memcpy(out + b * (N + K) * C, e + b * N * C, N * C * sizeof(float));
  }
  const float* slots = slot_table.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(out + (b * (N + K) + N + k) * C, slots + std::min(len[b] + k + offset, last) * C, C * sizeof(float));
  return {x, limits, write_at};
}

// The fused layers' GELU over x, a new tensor (for tests and docs/probes/gelu_erf.py)
at::Tensor gelu(at::Tensor x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && !x.is_cuda(), "gelu: float32 values on CPU");
  auto y = x.contiguous().clone();
  gelu_in_place(y.data_ptr<float>(), y.numel());
  return y;
}

// feed_width: how many tokens a draft model's next call feeds (AutoregressiveDrafter.shapes), (1,)
// int64: the most, over the rows where ``going`` (B,) bool, of lengths - reusable, where a row's
// reusable positions (ARDrafterState.reusable) are ``cached`` (B,) and after it the drafts its last
// call fed, ``fed`` (B, F) (none: None), up to the first that is not the row's token there (token
// index cached + j, at most W - 1), never its last token (at most lengths - 1); 0 where no row goes
// on. One call in place of about ten operators (about 55 us an iteration at batch 1).
at::Tensor feed_width(at::Tensor tokens, at::Tensor lengths, at::Tensor cached, c10::optional<at::Tensor> fed,
                      at::Tensor going) {
  const int64_t B = lengths.size(0);
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == B && tokens.size(1) >= 1 && lengths.dim() == 1 &&
              cached.dim() == 1 && cached.size(0) == B && going.dim() == 1 && going.size(0) == B &&
              tokens.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong &&
              cached.scalar_type() == at::kLong && going.scalar_type() == at::kBool && !tokens.is_cuda() &&
              !lengths.is_cuda() && !cached.is_cuda() && !going.is_cuda(),
              "feed_width: tokens (B, W), lengths (B,), cached (B,) int64 and going (B,) bool on the CPU");
  const bool has_fed = fed.has_value() && fed->defined();
  at::Tensor f;
  if (has_fed) {
    TORCH_CHECK(fed->dim() == 2 && fed->size(0) == B && fed->scalar_type() == at::kLong && !fed->is_cuda(),
                "feed_width: fed (B, F) int64 on the CPU");
    f = fed->contiguous();
  }
  const auto t = tokens.contiguous(), l = lengths.contiguous(), c = cached.contiguous(), g = going.contiguous();
  const int64_t W = t.size(1), F = has_fed ? f.size(1) : 0;
  const int64_t* tp = t.data_ptr<int64_t>();
  const int64_t* lp = l.data_ptr<int64_t>();
  const int64_t* cp = c.data_ptr<int64_t>();
  const int64_t* fp = has_fed ? f.data_ptr<int64_t>() : nullptr;
  const bool* gp = g.data_ptr<bool>();
  int64_t most = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (!gp[b]) continue;
    int64_t kept = cp[b];
    if (has_fed) {
      int64_t same = 0;
      while (same < F && tp[b * W + std::min(cp[b] + same, W - 1)] == fp[b * F + same]) ++same;
      kept = std::min(cp[b] + same, lp[b] - 1);
    }
    most = std::max(most, lp[b] - kept);
  }
  auto out = at::empty({1}, lengths.options());
  out.data_ptr<int64_t>()[0] = most;
  return out;
}

// idle_observe: the drafting-nothing rule's update (cmasd.verification.history.Idle.observe) for
// rows that sent ``proposed`` (B,) drafts and had ``accepted`` (B,) of them accepted: each row's
// moving average of accepted drafts (``payoff`` (B,) float32, the newest drafting iteration weighed
// ``weight``), its iteration count (``step``), the iteration it drafts again (``resume``) and its
// probe period (``period``), int64 (B,) each, the same arithmetic in float32 and int64 (no fused
// multiply-add: the values torch's operators give). One call in place of about twelve operators
// (about 80 us an iteration at batch 1). Returns the four new tensors.
__attribute__((optimize("fp-contract=off")))
std::vector<at::Tensor> idle_observe(at::Tensor payoff, at::Tensor step, at::Tensor resume, at::Tensor period,
                                     at::Tensor proposed, at::Tensor accepted, double weight, double below,
                                     int64_t every) {
  const int64_t B = payoff.size(0);
  for (const at::Tensor* t : {&step, &resume, &period, &proposed, &accepted}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == B && t->scalar_type() == at::kLong && !t->is_cuda(),
                "idle_observe: step, resume, period, proposed and accepted (B,) int64 on the CPU");
  }
  TORCH_CHECK(payoff.dim() == 1 && payoff.scalar_type() == at::kFloat && !payoff.is_cuda(),
              "idle_observe: payoff (B,) float32 on the CPU");
  const auto p = payoff.contiguous(), st = step.contiguous(), re = resume.contiguous(), pe = period.contiguous(),
             pr = proposed.contiguous(), ac = accepted.contiguous();
  auto new_payoff = at::empty({B}, payoff.options());
  auto new_step = at::empty({B}, step.options()), new_resume = at::empty({B}, step.options()),
       new_period = at::empty({B}, step.options());
  const float keep = static_cast<float>(1.0 - weight), w = static_cast<float>(weight), floor = static_cast<float>(below);
  const float* pp = p.data_ptr<float>();
  const int64_t *sp = st.data_ptr<int64_t>(), *rp = re.data_ptr<int64_t>(), *ep = pe.data_ptr<int64_t>(),
                *kp = pr.data_ptr<int64_t>(), *ap = ac.data_ptr<int64_t>();
  float* np = new_payoff.data_ptr<float>();
  int64_t *ns = new_step.data_ptr<int64_t>(), *nr = new_resume.data_ptr<int64_t>(), *ne = new_period.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const bool drafted = kp[b] > 0;
    const float average = drafted ? keep * pp[b] + w * static_cast<float>(ap[b]) : pp[b];
    const int64_t next = sp[b] + 1;
    const bool stop = drafted && average < floor;
    const bool probe = drafted && rp[b] > 0 && sp[b] == rp[b];
    int64_t per = stop && probe ? ep[b] * 2 : ep[b];
    if (drafted && !stop) per = every;
    np[b] = average;
    ns[b] = next;
    ne[b] = per;
    nr[b] = stop ? (next / per + 1) * per : rp[b];
  }
  return {new_payoff, new_step, new_resume, new_period};
}

at::Tensor top1(at::Tensor x) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && !x.is_cuda() && x.size(-1) > 0,
              "top1: float32 values (..., V) on CPU, V > 0");
  const auto rows = x.contiguous().view({-1, x.size(-1)});
  const int64_t N = rows.size(0), V = rows.size(1);
  auto sizes = x.sizes().vec();
  sizes.pop_back();
  auto out = at::empty({N}, x.options().dtype(at::kLong));
  const float* p = rows.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, N, std::max<int64_t>(1, 65536 / V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = unique_largest(p + r * V, V);
  });
  for (int64_t r = 0; r < N; ++r)
    if (o[r] < 0) o[r] = std::get<1>(at::topk(rows[r], std::min<int64_t>(2, V))).data_ptr<int64_t>()[0];
  return out.view(sizes);
}

// The n largest values of row[0 .. V) into kept[0 .. n), descending, duplicates counted (-inf
// past V); false where a value is NaN. Eight lanes at a time, those above the smallest kept
// inserted one by one.
static bool largest_values(const float* row, int64_t V, int64_t n, float* kept) {
  const float lowest = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) kept[i] = lowest;
  int64_t filled = 0;
  auto keep = [&](float x) {  // x > kept[n - 1], or the first n values: insert in order
    int64_t i = std::min(filled, n - 1);
    while (i > 0 && kept[i - 1] < x) {
      kept[i] = kept[i - 1];
      --i;
    }
    kept[i] = x;
    filled = std::min(filled + 1, n);
  };
  i8v nan = {0};
  int64_t j = 0;
  for (; j < std::min(n, V); ++j) {
    if (row[j] != row[j]) return false;
    keep(row[j]);
  }
  for (; j + 8 <= V; j += 8) {
    const v8 x = load8(row + j);
    nan |= (x != x);
    const float floor = kept[n - 1];
    const v8 f = {floor, floor, floor, floor, floor, floor, floor, floor};
    int mask = _mm256_movemask_ps((__m256)(x > f));
    while (mask) {
      const int l = __builtin_ctz(mask);
      mask &= mask - 1;
      if (row[j + l] > kept[n - 1]) keep(row[j + l]);
    }
  }
  for (; j < V; ++j) {
    if (row[j] != row[j]) return false;
    if (row[j] > kept[n - 1]) keep(row[j]);
  }
  for (int l = 0; l < 8; ++l)
    if (nan[l]) return false;
  return true;
}

// 1: the draft is among topk's beta, 0: it is not, -1: topk must decide; *gap set where not -1
static int top_gap_row(const float* row, int64_t V, int64_t beta, int64_t draft, float* gap) {
  float kept[16];  // beta + 1 <= 16 (larger betas go to torch.topk)
  if (!largest_values(row, V, beta + 1, kept)) return -1;
  const float value = row[draft];
  *gap = kept[0] - value;
  if (beta >= V) return 1;  // topk gives every index
  if (!(kept[beta - 1] > kept[beta])) return -1;  // a tie across the boundary (or all -inf): topk decides
  return value >= kept[beta - 1] ? 1 : 0;
}

// top_gap: SpecDec's test of a draft (TopKGap, ConfidenceModulated) without torch.topk. For
// row (b, t), t < K, of x (B, T, V) float32 and its draft proposal[b, t]: whether the draft is
// among the ``beta`` values torch.topk(row, beta) gives, and the gap (largest value) - (the
// draft's value), the float32 subtraction torch makes. One pass keeps the beta + 1 largest
// values (largest_values). Where the beta-th largest is greater than the next (no tie across
// topk's boundary) and no value is NaN, the values topk gives are those >= it, whatever its
// order among equals: the draft is among them exactly when its value is. Otherwise (a tie
// there, or a NaN) the row goes to torch.topk itself.
std::vector<at::Tensor> top_gap(at::Tensor x, at::Tensor proposal, int64_t beta) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && !x.is_cuda() && x.size(2) > 0 && x.stride(2) == 1,
              "top_gap: float32 values (B, T, V) on CPU, V > 0, the last dimension contiguous");
  TORCH_CHECK(proposal.dim() == 2 && proposal.scalar_type() == at::kLong && !proposal.is_cuda() &&
              proposal.size(0) == x.size(0) && proposal.size(1) <= x.size(1),
              "top_gap: int64 drafts (B, K) on CPU, K <= T");
  TORCH_CHECK(beta >= 1, "top_gap: beta >= 1");
  const int64_t B = proposal.size(0), K = proposal.size(1), V = x.size(2);
  const auto drafts = proposal.contiguous();
  auto in_top = at::empty({B, K}, x.options().dtype(at::kBool));
  auto gap = at::empty({B, K}, x.options());
  const float* p = x.data_ptr<float>();
  const int64_t* d = drafts.data_ptr<int64_t>();
  for (int64_t r = 0; r < B * K; ++r)
    TORCH_CHECK(d[r] >= 0 && d[r] < V, "top_gap: draft ", d[r], " out of the vocabulary (", V, " values)");
  bool* o = in_top.data_ptr<bool>();
  float* g = gap.data_ptr<float>();
  std::vector<int8_t> decided(B * K);
  const int64_t sb = x.stride(0), st = x.stride(1);
  at::parallel_for(0, B * K, std::max<int64_t>(1, 65536 / V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / K, t = r % K;
      const int got = beta < 16 ? top_gap_row(p + b * sb + t * st, V, beta, d[r], g + r) : -1;
      decided[r] = got >= 0;
      o[r] = got == 1;
    }
  });
  for (int64_t r = 0; r < B * K; ++r) {  // torch.topk itself, as gap_to_top1 runs it
    if (decided[r]) continue;
    const at::Tensor row = x.select(0, r / K).select(0, r % K);
    const auto top = at::topk(row, std::min(beta, V));
    const at::Tensor values = std::get<0>(top), indices = std::get<1>(top);
    const int64_t* idx = indices.data_ptr<int64_t>();
    bool found = false;
    for (int64_t i = 0; i < indices.numel(); ++i) found |= idx[i] == d[r];
    o[r] = found;
    g[r] = values.data_ptr<float>()[0] - row.data_ptr<float>()[d[r]];
  }
  return {in_top, gap};
}

// ensemble_confidence: CM-ASD's ensemble confidence of drafter logits x (..., V), V >= 2,
// float32 (cmasd.verification.confidence._ensemble, which runs about eight torch operators over
// the logits): w_ent (1 - H / log V, clamped to [0, 1]) + w_logit sigmoid(scale (l(1) - l(2)))
// (2 sigmoid - 1 where ``rescaled``) + w_soft (P(1) - P(2)), l the log-probabilities, the
// terms of weight 0 left out, added in that order in float32. Two passes over a row: its two
// largest values (largest_values), then the sum of e = exp(x - max) and of e (x - max) (exp8),
// whence log s, H = log s - sum e (x - max) / s and l = x - max - log s. The same quantities as
// torch's to float tolerance (its exponentials and sums are its own), a row's the same at any
// batch size. None where a row holds a value that is not finite (torch's answer there, NaN
// or not, is for torch to give).
c10::optional<at::Tensor> ensemble_confidence(at::Tensor x, double w_ent, double w_logit, double w_soft,
                                              double scale, bool rescaled) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && !x.is_cuda() && x.size(-1) >= 2,
              "ensemble_confidence: float32 logits (..., V) on CPU, V >= 2");
  const auto rows = x.contiguous().view({-1, x.size(-1)});
  const int64_t N = rows.size(0), V = rows.size(1);
  auto sizes = x.sizes().vec();
  sizes.pop_back();
  auto out = at::empty({N}, x.options());
  const float* p = rows.data_ptr<float>();
  float* o = out.data_ptr<float>();
  std::atomic<bool> finite{true};
  const float log_v = static_cast<float>(std::log(static_cast<double>(V)));
  at::parallel_for(0, N, std::max<int64_t>(1, 16384 / V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = p + r * V;
      float top[2];
      if (!largest_values(row, V, 2, top) || !std::isfinite(top[0]) || !std::isfinite(top[1])) {
        finite = false;
        continue;
      }
      const float m = top[0];
      const v8 mv = {m, m, m, m, m, m, m, m};
      v8 sv = {0}, tv = {0}, low = {0};
      int64_t j = 0;
      for (; j + 8 <= V; j += 8) {
        const v8 d = load8(row + j) - mv;
        const v8 e = exp8(d);
        sv += e;
        tv += e * d;
        low = d < low ? d : low;
      }
      float s = ((sv[0] + sv[1]) + (sv[2] + sv[3])) + ((sv[4] + sv[5]) + (sv[6] + sv[7]));
      float t = ((tv[0] + tv[1]) + (tv[2] + tv[3])) + ((tv[4] + tv[5]) + (tv[6] + tv[7]));
      float lowest = std::min(std::min(std::min(low[0], low[1]), std::min(low[2], low[3])),
                              std::min(std::min(low[4], low[5]), std::min(low[6], low[7])));
      for (; j < V; ++j) {
        const float d = row[j] - m, e = std::exp(d);
        s += e;
        t += e * d;
        lowest = std::min(lowest, d);
      }
      if (!std::isfinite(lowest)) {  // -inf (or a value below it): torch's 0 x -inf
        finite = false;
        continue;
      }
      const float log_s = std::log(s);
      float conf = 0.f;
      if (w_ent != 0.0) {
        const float entropy = log_s - t / s;
        conf = conf + static_cast<float>(w_ent) * std::min(std::max(1.f - entropy / log_v, 0.f), 1.f);
      }
      const float first = (m - m) - log_s, second = (top[1] - m) - log_s;
      if (w_logit != 0.0) {
        const float margin = 1.f / (1.f + std::exp(-(static_cast<float>(scale) * (first - second))));
        conf = conf + static_cast<float>(w_logit) * (rescaled ? 2.f * margin - 1.f : margin);
      }
      if (w_soft != 0.0) conf = conf + static_cast<float>(w_soft) * (std::exp(first) - std::exp(second));
      o[r] = conf;
    }
  });
  if (!finite) return c10::nullopt;
  return out.view(sizes);
}

// compact_rows: the rows ``keep`` (int64 on CPU, distinct) of every tensor in ``tensors`` (each
// contiguous on CPU, rows first, any dtype) moved in place to its first keep.size(0) rows: row
// keep[j] to row j, for j in order. Where rows of a batch finish, the loop fills each finished
// row below the new row count with one of the rows above it (or, keep ascending, moves the rows
// after the first finished one down), instead of copying every kept row into new memory (an
// index_select a tensor: at 16 rows of the compact verifier about 15 MB a drop). A tensor
// given twice (the same memory) moves once. False, and nothing moved, where it cannot: a row
// out of any tensor's rows or repeated, a row whose source was overwritten by an earlier move
// (keep[j] = j' for some j' < j with keep[j'] != j'), a tensor not contiguous or on a GPU, or
// two tensors whose memory overlaps without being the same.
bool compact_rows(std::vector<at::Tensor> tensors, at::Tensor keep) {
  if (keep.dim() != 1 || keep.scalar_type() != at::kLong || keep.is_cuda()) return false;
  const auto order = keep.contiguous();
  const int64_t* r = order.data_ptr<int64_t>();
  const int64_t n = order.size(0);
  struct Span { char* base; int64_t row_bytes; int64_t rows; };
  std::vector<Span> spans;
  for (const auto& t : tensors) {
    if (t.is_cuda() || t.dim() == 0 || !t.is_contiguous()) return false;
    if (t.numel() == 0) continue;
    spans.push_back({static_cast<char*>(t.data_ptr()), static_cast<int64_t>(t.nbytes()) / t.size(0), t.size(0)});
  }
  int64_t rows = std::numeric_limits<int64_t>::max();
  for (const auto& t : tensors) rows = std::min<int64_t>(rows, t.size(0));
  if (tensors.empty()) rows = n ? *std::max_element(r, r + n) + 1 : 0;
  std::vector<char> seen(std::max<int64_t>(rows, 0), 0), written(std::max<int64_t>(rows, 0), 0);
  for (int64_t j = 0; j < n; ++j) {
    if (r[j] < 0 || r[j] >= rows || seen[r[j]] || written[r[j]]) return false;
    seen[r[j]] = 1;
    if (r[j] != j) written[j] = 1;  // row j is overwritten: no later move may read it
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.base < b.base; });
  std::vector<Span> distinct;
  for (const auto& span : spans) {
    if (!distinct.empty()) {
      const Span& last = distinct.back();
      if (span.base == last.base && span.row_bytes == last.row_bytes && span.rows == last.rows) continue;
      if (span.base < last.base + last.row_bytes * last.rows) return false;
    }
    distinct.push_back(span);
  }
  at::parallel_for(0, static_cast<int64_t>(distinct.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Span& span = distinct[i];
      for (int64_t j = 0; j < n; ++j)  // a row's source is never a row already written (checked above)
        if (r[j] != j) std::memmove(span.base + j * span.row_bytes, span.base + r[j] * span.row_bytes, span.row_bytes);
    }
  });
  return true;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_panels", &pack_panels, pybind11::arg("weight"), pybind11::arg("bf16") = false,
        "weight (out, in) -> float32 panels (ceil(out / 16), in, 16) for panel_linear; bf16: bfloat16 panels "
        "(ceil(out / 16), ceil(in / 2), 16, 2) of the weights rounded to bfloat16");
  m.def("panel_linear", &panel_linear, "x W^T + b (ReLU optional) on packed panels (float32 or bfloat16), float32 on CPU");
  m.def("embed_rows", &embed_rows, pybind11::arg("tokens"), pybind11::arg("start"), pybind11::arg("token_table"),
        pybind11::arg("position_table"), pybind11::arg("scale"), pybind11::arg("offset"), pybind11::arg("last"),
        "a decoder's plain input: token_table[tokens] * scale + position_table[min(start + j + offset, last)]");
  m.def("gelu", &gelu, pybind11::arg("x"),
        "fairseq's exact GELU as the fused layers compute it (8 floats at a time), float32 on CPU");
  m.def("top1", &top1, pybind11::arg("x"),
        "the index torch.topk(x, 2) gives first in every row of x (..., V), float32 on CPU");
  m.def("spec_block_inputs", &spec_block_inputs, pybind11::arg("tokens"), pybind11::arg("lengths"),
        pybind11::arg("cached"), pybind11::arg("most_new"), pybind11::arg("block"), pybind11::arg("pad"),
        pybind11::arg("capacity"), pybind11::arg("token_table"), pybind11::arg("position_table"),
        pybind11::arg("scale"), pybind11::arg("offset"), pybind11::arg("last"), pybind11::arg("slot_table"),
        "a Spec-Drafter pass's inputs in the fused layers: (x (B, N + K, C), limits, write_at (B, N + K))");
  m.def("idle_observe", &idle_observe, pybind11::arg("payoff"), pybind11::arg("step"), pybind11::arg("resume"),
        pybind11::arg("period"), pybind11::arg("proposed"), pybind11::arg("accepted"), pybind11::arg("weight"),
        pybind11::arg("below"), pybind11::arg("every"),
        "the drafting-nothing rule's update of each row (payoff, step, resume, period)");
  m.def("feed_width", &feed_width, pybind11::arg("tokens"), pybind11::arg("lengths"), pybind11::arg("cached"),
        pybind11::arg("fed"), pybind11::arg("going"),
        "how many tokens a draft model's next call feeds, (1,): the most over the going rows of lengths - reusable");
  m.def("top_gap", &top_gap, pybind11::arg("x"), pybind11::arg("proposal"), pybind11::arg("beta"),
        "whether each draft (B, K) is among torch.topk(x[b, t], beta)'s indices, and the largest value less "
        "the draft's, for t < K of x (B, T, V), float32 on CPU");
  m.def("ensemble_confidence", &ensemble_confidence, pybind11::arg("x"), pybind11::arg("w_ent"),
        pybind11::arg("w_logit"), pybind11::arg("w_soft"), pybind11::arg("scale"), pybind11::arg("rescaled"),
        "CM-ASD's ensemble confidence of drafter logits (..., V), float32 on CPU (None where a row is not finite)");
  m.def("compact_rows", &compact_rows, pybind11::arg("tensors"), pybind11::arg("keep"),
        "move row keep[j] of every tensor to row j, in place; False where it cannot");
  m.def("panel_isa", &panel_isa, pybind11::arg("choose") = "",
        "the instruction set of panel_linear (avx512f or avx2); choose: select one");
  pybind11::class_<FusedDecoder>(m, "FusedDecoder")
      .def(pybind11::init<int64_t, bool>())
      .def("add_layer", &FusedDecoder::add_layer)
      .def("states", &FusedDecoder::states, pybind11::arg("x"), pybind11::arg("kv"), pybind11::arg("index"),
           pybind11::arg("used"), pybind11::arg("self_bias"), pybind11::arg("cross_k"), pybind11::arg("cross_v"),
           pybind11::arg("cross_bias"), pybind11::arg("causal") = false, pybind11::arg("limits") = pybind11::none(),
           "the layers over x (B, T, C) at positions index (B, T); see decoding.cpp")
      .def("greedy", &FusedDecoder::greedy, pybind11::arg("last"), pybind11::arg("steps"), pybind11::arg("lengths"),
           pybind11::arg("longest"), pybind11::arg("kv"), pybind11::arg("cross_k"), pybind11::arg("cross_v"),
           pybind11::arg("cross_bias"), pybind11::arg("token_table"), pybind11::arg("position_table"),
           pybind11::arg("scale"), pybind11::arg("offset"), pybind11::arg("last_position"),
           pybind11::arg("norm_weight"), pybind11::arg("norm_bias"), pybind11::arg("eps"), pybind11::arg("panels"),
           pybind11::arg("bias"), pybind11::arg("ids"), pybind11::arg("feed_tokens") = pybind11::none(),
           pybind11::arg("fed") = 0, pybind11::arg("feed_used") = 0,
           "a draft model's greedy steps from its last states (B, 1, C), or after feeding its last tokens: "
           "(tokens (B, steps), logits (B, steps, N))");
}
