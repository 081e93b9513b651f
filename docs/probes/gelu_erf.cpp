// GELU over a feed-forward's floats: std::erf (the fused C++ layers' GELU until 7a4ae0a) against
// gelu8 (torch's vectorized erf: Abramowitz-Stegun 7.1.26 with a Cephes exp, 8 floats at a time),
// their largest difference and each one's against double precision, and microseconds per
// 1,024-wide row of one layer at 1 and 80 rows (one thread; 80 rows: a 16 x 5 verify block).
// exp8, gelu8 and the padded tail are copies of cmasd/layers/csrc/decoding.cpp's (that file
// needs ATen's headers); docs/results/kernels.md cites this probe.
//
//     g++ -O3 -mavx2 -mfma docs/probes/gelu_erf.cpp -o /tmp/gelu_erf && /tmp/gelu_erf
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
typedef float v8 __attribute__((vector_size(32)));
static inline v8 load8(const float* p) { v8 v; __builtin_memcpy(&v, p, 32); return v; }
static inline v8 exp8(v8 x) {
  const v8 hi = {88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f};
  x = x > hi ? hi : x;
  const v8 lo = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f};
  const auto underflow = x < lo;
  x = underflow ? lo : x;
  v8 n = x * 1.44269504088896341f;
  n = __builtin_ia32_roundps256(n, 0x08);
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
static inline v8 gelu8(v8 x) {
  const v8 z = x * 0.70710678118654752f;
  typedef int32_t i8 __attribute__((vector_size(32)));
  i8 bits;
  memcpy(&bits, &z, sizeof(bits));
  const i8 sign = bits & static_cast<int32_t>(0x80000000u);
  bits ^= sign;
  v8 a;  // |z|
  memcpy(&a, &bits, sizeof(a));
  const v8 t = 1.f / (0.3275911f * a + 1.f);
  v8 r = 1.061405429f * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const v8 e = (-exp8(-(z * z)) * t) * r + 1.f;  // erf(|z|)
  i8 ebits;
  memcpy(&ebits, &e, sizeof(ebits));
  ebits ^= sign;
  v8 erf;
  memcpy(&erf, &ebits, sizeof(erf));
  return 0.5f * x * (1.f + erf);
}
static void gelu_vec(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) { v8 v = gelu8(load8(x + i)); memcpy(x + i, &v, 32); }
  if (i < n) { float b[8] = {0}; memcpy(b, x + i, (n - i) * 4); v8 v = gelu8(load8(b)); memcpy(b, &v, 32); memcpy(x + i, b, (n - i) * 4); }
}
static void gelu_std(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * 0.70710678118654752f));
}
int main() {
  const int n = 1024 * 80;
  std::vector<float> src(n), a(n), b(n);
  for (int i = 0; i < n; ++i) src[i] = (i % 2001 - 1000) * 0.006f;
  double worst = 0, worst_rel = 0;
  a = src; b = src; gelu_std(a.data(), n); gelu_vec(b.data(), n);
  for (int i = 0; i < n; ++i) { double d = std::fabs(a[i] - b[i]); if (d > worst) worst = d; }
  // exact double reference
  double worst_d = 0, worst_s = 0;
  for (int i = 0; i < n; ++i) { double x = src[i]; double r = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    worst_d = std::max(worst_d, std::fabs(r - b[i])); worst_s = std::max(worst_s, std::fabs(r - a[i])); }
  printf("max |std - vec| %.3g; vs double: vec %.3g std %.3g\n", worst, worst_d, worst_s);
  for (int rows : {1, 80}) {
    int m = 1024 * rows; int reps = 2000000 / m + 10;
    for (int which = 0; which < 2; ++which) {
      a = src;
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        std::memcpy(a.data(), src.data(), m * sizeof(float));  // the same inputs each time
        if (which) gelu_vec(a.data(), m); else gelu_std(a.data(), m);
      }
      auto t1 = std::chrono::steady_clock::now();
      printf("rows %d %s: %.2f us per 1024-wide row-layer\n", rows, which ? "vec" : "std", std::chrono::duration<double, std::micro>(t1 - t0).count() / reps / rows);
    }
  }
}
