// Dense softmax attention for XLA:CPU through the XLA FFI (model.attention_impl="cpu_flash"; built and loaded by
// xla_kernels/cpu_attention.py). float32; q, o, dout [B, Lq, H, D], k, v [B, Lk, H, D] row-major; lse [B, H, Lq];
// mask uint8 [Bm, Lq, Lk] (Bm 1 or B; nonzero = attend), read only when has_mask.
//
// Forward, per (batch, head, block of queries): the block's score rows S = scale q k^T stay in cache through the
// softmax (max over the kept keys, exp, sum) and O = P v; lse = max + log(sum). A row with no kept key gives 0.
// Backward (FlashAttention's, unblocked over keys), per (batch, head): P = exp(S - lse) recomputed per block,
// dV += P^T dO, dP = dO v^T, dS = P (dP - rowsum(dO O)) scale, dQ = dS K, dK += dS^T Q.
// Products by a BLAS sgemm (column-major: a row-major [m, n] with row stride ld is its transpose), set by
// jaxwm_cpu_attention_set_sgemm. exp is written out so that it vectorises without fast-math, and NaN propagates.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);
static sgemm_t sgemm = nullptr;
extern "C" void jaxwm_cpu_attention_set_sgemm(void* p) { sgemm = (sgemm_t)p; }

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

struct Shapes {
  int B, Lq, Lk, H, D, HD, Bm;
};

static Shapes shapes_of(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                        const ffi::Buffer<ffi::U8>& mask) {
  auto d = q.dimensions();
  Shapes s{(int)d[0], (int)d[1], (int)k.dimensions()[1], (int)d[2], (int)d[3], (int)(d[2] * d[3]),
           (int)mask.dimensions()[0]};
  return s;
}

// One query row of scores -> probabilities (in place); returns the log-sum-exp (0 for a row with no kept key).
static float softmax_row(float* s, const uint8_t* keep, int n) {
  float mx = -FLT_MAX;
  int any = keep == nullptr, nan = 0;
  if (keep) {
#pragma omp simd reduction(max : mx) reduction(| : any, nan)
    for (int j = 0; j < n; ++j) {
      any |= keep[j] != 0;
      nan |= s[j] != s[j];
      mx = std::max(mx, keep[j] ? s[j] : -FLT_MAX);
    }
  } else {
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int j = 0; j < n; ++j) {
      nan |= s[j] != s[j];
      mx = std::max(mx, s[j]);
    }
  }
  if (!any) {
    std::fill(s, s + n, 0.0f);
    return 0.0f;
  }
  if (nan) mx = NAN;  // propagates to every probability of the row
  float sum = 0.0f;
  if (keep) {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) {
      float e = keep[j] ? exp_nonpositive(s[j] - mx) : 0.0f;
      s[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) {
      float e = exp_nonpositive(s[j] - mx);
      s[j] = e;
      sum += e;
    }
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; ++j) s[j] *= inv;
  return mx + std::log(sum);
}

static ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                          ffi::Buffer<ffi::U8> mask, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                          float scale, int64_t has_mask, int64_t block_attr) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_attention: no sgemm set");
  const Shapes s = shapes_of(q, k, mask);
  const int block = (int)block_attr, blocks = (s.Lq + block - 1) / block, units = s.B * s.H * blocks;
  const float *Q = q.typed_data(), *K = k.typed_data(), *V = v.typed_data();
  const uint8_t* M = has_mask ? mask.typed_data() : nullptr;
  float *O = out->typed_data(), *L = lse->typed_data();
#pragma omp parallel
  {
    std::vector<float> S((size_t)block * s.Lk);
    const float one = 1.0f, zero = 0.0f;
#pragma omp for schedule(static)
    for (int u = 0; u < units; ++u) {
      const int b = u / (s.H * blocks), h = (u / blocks) % s.H, i0 = (u % blocks) * block;
      const int m = std::min(block, s.Lq - i0);
      const float* qb = Q + ((size_t)b * s.Lq + i0) * s.HD + h * s.D;
      const float* kb = K + (size_t)b * s.Lk * s.HD + h * s.D;
      const float* vb = V + (size_t)b * s.Lk * s.HD + h * s.D;
      float* ob = O + ((size_t)b * s.Lq + i0) * s.HD + h * s.D;
      sgemm("T", "N", &s.Lk, &m, &s.D, &scale, kb, &s.HD, qb, &s.HD, &zero, S.data(), &s.Lk);  // S = scale q k^T
      for (int i = 0; i < m; ++i) {
        const uint8_t* keep = M ? M + ((size_t)(s.Bm > 1 ? b : 0) * s.Lq + i0 + i) * s.Lk : nullptr;
        L[((size_t)b * s.H + h) * s.Lq + i0 + i] = softmax_row(S.data() + (size_t)i * s.Lk, keep, s.Lk);
      }
      sgemm("N", "N", &s.D, &m, &s.Lk, &one, vb, &s.HD, S.data(), &s.Lk, &zero, ob, &s.HD);  // O = P v
    }
  }
  return ffi::Error::Success();
}

static ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                           ffi::Buffer<ffi::U8> mask, ffi::Buffer<ffi::F32> o, ffi::Buffer<ffi::F32> lse,
                           ffi::Buffer<ffi::F32> dout, ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                           ffi::ResultBuffer<ffi::F32> dv, float scale, int64_t has_mask, int64_t block_attr) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_attention: no sgemm set");
  const Shapes s = shapes_of(q, k, mask);
  const int block = (int)block_attr, units = s.B * s.H;
  const float *Q = q.typed_data(), *K = k.typed_data(), *V = v.typed_data(), *O = o.typed_data(),
              *L = lse.typed_data(), *G = dout.typed_data();
  const uint8_t* M = has_mask ? mask.typed_data() : nullptr;
  float *dQ = dq->typed_data(), *dK = dk->typed_data(), *dV = dv->typed_data();
#pragma omp parallel
  {
    std::vector<float> P((size_t)block * s.Lk), dP((size_t)block * s.Lk), delta(block);
    const float one = 1.0f, zero = 0.0f;
#pragma omp for schedule(static)
    for (int u = 0; u < units; ++u) {
      const int b = u / s.H, h = u % s.H;
      const float* kb = K + (size_t)b * s.Lk * s.HD + h * s.D;
      const float* vb = V + (size_t)b * s.Lk * s.HD + h * s.D;
      float* dkb = dK + (size_t)b * s.Lk * s.HD + h * s.D;
      float* dvb = dV + (size_t)b * s.Lk * s.HD + h * s.D;
      for (int j = 0; j < s.Lk; ++j) {
        std::fill(dkb + (size_t)j * s.HD, dkb + (size_t)j * s.HD + s.D, 0.0f);
        std::fill(dvb + (size_t)j * s.HD, dvb + (size_t)j * s.HD + s.D, 0.0f);
      }
      for (int i0 = 0; i0 < s.Lq; i0 += block) {
        const int m = std::min(block, s.Lq - i0);
        const size_t row0 = ((size_t)b * s.Lq + i0) * s.HD + h * s.D;
        const float *qb = Q + row0, *ob = O + row0, *gb = G + row0;
        const float* lb = L + ((size_t)b * s.H + h) * s.Lq + i0;
        sgemm("T", "N", &s.Lk, &m, &s.D, &scale, kb, &s.HD, qb, &s.HD, &zero, P.data(), &s.Lk);  // S
        for (int i = 0; i < m; ++i) {
          float* p = P.data() + (size_t)i * s.Lk;
          const uint8_t* keep = M ? M + ((size_t)(s.Bm > 1 ? b : 0) * s.Lq + i0 + i) * s.Lk : nullptr;
          const float l = lb[i];
          if (keep) {
#pragma omp simd
            for (int j = 0; j < s.Lk; ++j) p[j] = keep[j] ? exp_nonpositive(p[j] - l) : 0.0f;
          } else {
#pragma omp simd
            for (int j = 0; j < s.Lk; ++j) p[j] = exp_nonpositive(p[j] - l);
          }
          float d = 0.0f;
          for (int c = 0; c < s.D; ++c) d += gb[(size_t)i * s.HD + c] * ob[(size_t)i * s.HD + c];
          delta[i] = d;
        }
        sgemm("N", "T", &s.D, &s.Lk, &m, &one, gb, &s.HD, P.data(), &s.Lk, &one, dvb, &s.HD);   // dV += P^T dO
        sgemm("T", "N", &s.Lk, &m, &s.D, &one, vb, &s.HD, gb, &s.HD, &zero, dP.data(), &s.Lk);  // dP = dO v^T
        for (int i = 0; i < m; ++i) {
          float* p = P.data() + (size_t)i * s.Lk;
          const float* g = dP.data() + (size_t)i * s.Lk;
          const float di = delta[i];
#pragma omp simd
          for (int j = 0; j < s.Lk; ++j) p[j] = p[j] * (g[j] - di) * scale;  // dS, with the logits' scale
        }
        sgemm("N", "N", &s.D, &m, &s.Lk, &one, kb, &s.HD, P.data(), &s.Lk, &zero, dQ + row0, &s.HD);  // dQ = dS K
        sgemm("N", "T", &s.D, &s.Lk, &m, &one, qb, &s.HD, P.data(), &s.Lk, &one, dkb, &s.HD);   // dK += dS^T Q
      }
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("block"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("block"));
