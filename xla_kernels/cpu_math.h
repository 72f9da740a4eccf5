// Elementwise float32 maths shared by the C++ kernels (xla_kernels/*.cc), written out so that g++ vectorises it in
// `omp simd` loops without fast-math; NaN propagates.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

// exp(x) for x <= 0 (scores minus their row maximum): Cephes' range reduction and polynomial; 0 below -87.
static inline float exp_nonpositive(float x) {
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t e = ((int32_t)std::max(n, -126.0f) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  float out = x < -87.0f ? 0.0f : y * scale;
  return x != x ? x : out;  // NaN in, NaN out
}

// The largest of s[0..n) (-FLT_MAX for n = 0); a NaN is skipped. Written as a comparison: the same reduction with
// std::max compiles to scalar code (10x slower; benchmarks/cpu_softmax.py).
static inline float row_max(const float* s, int n) {
  float mx = -FLT_MAX;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  return mx;
}

// out[j] = keep[j] ? exp(in[j] - shift) : 0 for j < n (keep null: every j), with in[j] - shift <= 0 or NaN; returns
// the sum of out (a softmax row's unnormalised probabilities). in == out is allowed.
static inline float exp_row(const float* in, float shift, const uint8_t* keep, float* out, int n) {
  float sum = 0.0f;
  if (keep) {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) {
      const float e = keep[j] ? exp_nonpositive(in[j] - shift) : 0.0f;
      out[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) {
      const float e = exp_nonpositive(in[j] - shift);
      out[j] = e;
      sum += e;
    }
  }
  return sum;
}

// (sin x, cos x): jaxwm/ops/sincos.py's polynomial (Cody-Waite reduction by pi/2 in three parts, Cephes' minimax on
// |r| <= pi/4, the quadrant n mod 4 swapping and negating the pair); absolute error ~1e-7 for |x| <= 2e4, and in
// [-1, 1] where float32 cannot reduce x at all.
static inline void sincos_poly(float x, float* sin_out, float* cos_out) {
  const float n = std::nearbyint(x * 0.63661977236758134f);
  float r = ((x - n * 1.5703125f) - n * 4.837512969970703125e-4f) - n * 7.54978995489188216e-8f;
  r = r < -0.8f ? -0.8f : r > 0.8f ? 0.8f : r;  // ternaries, not std::min / max (references: not vectorised)
  const float r2 = r * r;
  const float s = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
  const float c = 1.0f - 0.5f * r2 + r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f +
                                                                               r2 * 2.443315711809948e-5f));
  // the quadrant n mod 4 in 0..3: floor(n / 4) for integer n as a rounding without ties (floorf does not vectorise);
  // exact for |n| < 2^23 (|x| < 1.3e7). Beyond, q may be 4 or -1 and the signs differ from jaxwm/ops/sincos.py's,
  // where both pairs are meaningless anyway; the pair stays in [-1, 1].
  const float q = n - 4.0f * std::nearbyint(0.25f * n - 0.375f);
  const bool odd = (q == 1.0f) | (q == 3.0f);
  const float sn = odd ? c : s, cs = odd ? s : c;
  *sin_out = q >= 2.0f ? -sn : sn;
  *cos_out = ((q == 1.0f) | (q == 2.0f)) ? -cs : cs;
}
