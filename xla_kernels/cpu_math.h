// Elementwise float32 maths shared by the C++ kernels (xla_kernels/*.cc), written out so that g++ vectorises it in
// `omp simd` loops without fast-math; NaN propagates.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(JAXWM_GENERIC_SIMD)
#include <immintrin.h>
#define JAXWM_EXP_ROW_AVX512 1
#endif

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

// out[j] = keep[j] ? exp(in[j] - shift) : 0 for j < n (keep null: every j), with in[j] - shift <= 0 or NaN; returns
// the sum of out (a softmax row's unnormalised probabilities). in == out is allowed. Both forms give
// exp_nonpositive's bits for every entry; only the sum's order of additions differs. The AVX-512 form (2^n by
// scalef, 32 entries per step) is 3-4x faster than what g++ makes of the loop below (tests/test_cpu_math.py).
#ifdef JAXWM_EXP_ROW_AVX512
static inline __m512 exp16_nonpositive(__m512 x) {  // exp_nonpositive on 16 lanes
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);  // x >= -87 or NaN
  return _mm512_maskz_scalef_ps(live, y, n);  // y 2^n; NaN stays NaN
}

static inline float exp_row(const float* in, float shift, const uint8_t* keep, float* out, int n) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 32) {
    for (int half = 0; half < 2; ++half) {
      const int j0 = j + 16 * half, left = n - j0;
      if (left <= 0) break;
      __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
      if (keep) k &= _mm_test_epi8_mask(_mm_maskz_loadu_epi8(k, keep + j0), _mm_set1_epi8(-1));
      const __m512 e = _mm512_maskz_mov_ps(k, exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, in + j0), sh)));
      _mm512_mask_storeu_ps(out + j0, left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1), e);
      if (half) acc1 = _mm512_add_ps(acc1, e); else acc0 = _mm512_add_ps(acc0, e);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}
#else
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
#endif

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
