// Softmax attention for XLA:CPU through the XLA FFI (model.attention_impl="cpu_flash"; built and loaded by
// xla_kernels/cpu_attention.py). float32, row-major. One kernel for dense attention and for WorldRoPE's per-view
// keys: q [B, Lq, H, D], k [B, Lk, H, D], v [B, Lk, H, Dv], out and dout [B, Lq, H, Dv], lse [B, H, Lq], mask uint8
// [Bm, Lq, Lk] (Bm 1 or B; nonzero = attend; read only when has_mask). The scores of query i are
//   S_ij = scale q_i . K[f]_j,   f = i / N the query's frame (N = Lq / F),
// where K[f] is k with its channel pairs (2 pairs[p], 2 pairs[p] + 1), p < P, each taken as a complex number and
// multiplied by the factor fac [B, F, Lk, P, 2] (re, im) of frame f:
//   K[f]_{j,2c} = k_{j,2c} re - k_{j,2c+1} im,   K[f]_{j,2c+1} = k_{j,2c} im + k_{j,2c+1} re   (c = pairs[p]).
// Dense attention is P = 0 (F = 1, K = k).
//
// Forward, per (batch, head, frame, block of the frame's queries): K[f] built into a per-thread buffer (P > 0);
// the block's score rows stay in cache through the softmax (max over the kept keys, exp, sum) and
// O = (exp(S - max) v) / sum, normalised after the product (Dv divisions per row, not Lk); lse = max + log(sum).
// A row with no kept key gives 0.
// Backward (FlashAttention's, unblocked over keys), per (batch, head): P = exp(S - lse) recomputed per block,
// dV += P^T dO, dP = dO v^T, dS = P (dP - rowsum(dO O)) scale, dq = dS K[f], dK[f] += dS^T q; at the end of frame f
// (P > 0) dk += dK[f] on the other channels and the conjugate rotation of dK[f] on the pairs, and the factor's
// gradient per head, d re = dK_0 k_0 + dK_1 k_1, d im = dK_1 k_0 - dK_0 k_1, summed over heads after the loop.
// Products by a BLAS sgemm (column-major: a row-major [m, n] with row stride ld is its transpose), set by
// jaxwm_cpu_attention_set_sgemm; units on `threads` OpenMP threads, handed out dynamically (XLA may run another op on
// a core meanwhile: a static split waits for the thread that shares it). The row maximum and exp are cpu_math.h's
// row_max and exp_row, and NaN propagates.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cpu_blas.h"
#include "cpu_ffi.h"
#include "cpu_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jaxwm_ffi::f32_args;
using jaxwm_ffi::f32_rets;

JAXWM_SGEMM(jaxwm_cpu_attention_set_sgemm)

struct Shapes {
  int B, Lq, H, D, Lk, Dv, P, F, N, Bm;
  int HD() const { return H * D; }
  int HV() const { return H * Dv; }
};

static Shapes shapes_of(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& v,
                        const ffi::Buffer<ffi::F32>& fac, const ffi::Buffer<ffi::U8>& mask) {
  auto d = q.dimensions();
  const int P = (int)fac.dimensions()[3];
  Shapes s{(int)d[0], (int)d[1], (int)d[2], (int)d[3], (int)v.dimensions()[1], (int)v.dimensions()[3], P,
           P ? (int)fac.dimensions()[1] : 1, 0, (int)mask.dimensions()[0]};
  s.N = s.F > 0 ? s.Lq / s.F : 0;  // check() refuses F = 0
  return s;
}

// The shapes the kernel relies on (the Python side checks them too): an error names the first that does not hold.
static ffi::Error check(const Shapes& s, const ffi::Buffer<ffi::F32>& k, const ffi::Buffer<ffi::F32>& v,
                        const ffi::Buffer<ffi::F32>& fac, const ffi::Buffer<ffi::S32>& pair_idx,
                        const ffi::Buffer<ffi::U8>& mask, int64_t has_mask) {
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  if (kd[0] != s.B || kd[1] != s.Lk || kd[2] != s.H || kd[3] != s.D)
    return ffi::Error::InvalidArgument("cpu_attention: k's shape");
  if (vd[0] != s.B || vd[2] != s.H) return ffi::Error::InvalidArgument("cpu_attention: v's shape");
  if (s.F < 1 || s.Lq % s.F) return ffi::Error::InvalidArgument("cpu_attention: queries not a multiple of the views");
  if (s.P && (fac.dimensions()[0] != s.B || fac.dimensions()[2] != s.Lk || (int)pair_idx.element_count() != s.P))
    return ffi::Error::InvalidArgument("cpu_attention: factors' shape");
  for (int p = 0; p < s.P; ++p)
    if (pair_idx.typed_data()[p] < 0 || 2 * pair_idx.typed_data()[p] + 1 >= s.D)
      return ffi::Error::InvalidArgument("cpu_attention: a pair outside the head");
  if (has_mask && ((s.Bm != 1 && s.Bm != s.B) || mask.dimensions()[1] != s.Lq || mask.dimensions()[2] != s.Lk))
    return ffi::Error::InvalidArgument("cpu_attention: mask's shape");
  return ffi::Error::Success();
}

// One (batch, head)'s rows of q, k, v and its batch element's factors [F, Lk, P, 2].
struct Rows {
  const float *q, *k, *v, *fac;
};

static Rows rows_of(const Shapes& s, const float* Q, const float* K, const float* V, const float* FAC, int b, int h) {
  return Rows{Q + (size_t)b * s.Lq * s.HD() + h * s.D, K + (size_t)b * s.Lk * s.HD() + h * s.D,
              V + (size_t)b * s.Lk * s.HV() + h * s.Dv, FAC + (size_t)b * s.F * s.Lk * s.P * 2};
}

// K[f] [Lk, D] (row stride D) into out: k with its pairs rotated by frame f's factors.
static void build_keys(const Shapes& s, const Rows& r, const int32_t* pairs, int f, float* out) {
  const int hd = s.HD();
  for (int j = 0; j < s.Lk; ++j) {
    const float* kj = r.k + (size_t)j * hd;
    const float* fj = r.fac + ((size_t)f * s.Lk + j) * s.P * 2;
    float* o = out + (size_t)j * s.D;
    std::memcpy(o, kj, sizeof(float) * s.D);
    for (int p = 0; p < s.P; ++p) {
      const int c = 2 * pairs[p];
      const float k0 = kj[c], k1 = kj[c + 1], re = fj[2 * p], im = fj[2 * p + 1];
      o[c] = k0 * re - k1 * im;
      o[c + 1] = k0 * im + k1 * re;
    }
  }
}

// dk [Lk, D] (row stride HD) += frame f's key gradient dkf [Lk, D] (row stride D) taken back through the rotation;
// dfac [Lk, P, 2] = this head's factor gradient.
static void unrotate(const Shapes& s, const Rows& r, const int32_t* pairs, const uint8_t* is_pair, int f,
                     const float* dkf, float* dk, float* dfac) {
  const int hd = s.HD();
  for (int j = 0; j < s.Lk; ++j) {
    const float* kj = r.k + (size_t)j * hd;
    const float* fj = r.fac + ((size_t)f * s.Lk + j) * s.P * 2;
    const float* g = dkf + (size_t)j * s.D;
    float* dkj = dk + (size_t)j * hd;
    float* dfj = dfac + (size_t)j * s.P * 2;
    for (int c = 0; c < s.D; ++c) dkj[c] += is_pair[c] ? 0.0f : g[c];
    for (int p = 0; p < s.P; ++p) {
      const int c = 2 * pairs[p];
      const float k0 = kj[c], k1 = kj[c + 1], re = fj[2 * p], im = fj[2 * p + 1], g0 = g[c], g1 = g[c + 1];
      dkj[c] += g0 * re + g1 * im;
      dkj[c + 1] += g1 * re - g0 * im;
      dfj[2 * p] = g0 * k0 + g1 * k1;
      dfj[2 * p + 1] = g1 * k0 - g0 * k1;
    }
  }
}

// One query row of scores -> its unnormalised probabilities exp(s - max) (in place); returns the log-sum-exp and
// sets *inv to 1 / their sum (0 and 0 for a row with no kept key, or no key at all). A NaN among the kept scores
// reaches the sum, so the row's lse and output (scaled by *inv) are NaN, as in the reference; a NaN in a masked-out
// key stays out.
static float softmax_row(float* s, const uint8_t* keep, int n, float* inv) {
  float mx = -FLT_MAX;
  int any = keep == nullptr;
  if (keep) {
#pragma omp simd reduction(max : mx) reduction(| : any)
    for (int j = 0; j < n; ++j) {
      any |= keep[j] != 0;
      mx = std::max(mx, keep[j] ? s[j] : -FLT_MAX);
    }
  } else {
    mx = row_max(s, n);  // a NaN skipped there is caught by the sum
  }
  if (!any || n == 0) {  // no key: 0, not 0 / 0
    std::fill(s, s + n, 0.0f);
    *inv = 0.0f;
    return 0.0f;
  }
  const float sum = exp_row(s, mx, keep, s, n);
  *inv = 1.0f / sum;
  return mx + std::log(sum);
}

static ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                          ffi::Buffer<ffi::F32> fac, ffi::Buffer<ffi::S32> pair_idx, ffi::Buffer<ffi::U8> mask,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse, float scale,
                          int64_t has_mask, int64_t block_attr, int64_t threads) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_attention: no sgemm set");
  const Shapes s = shapes_of(q, v, fac, mask);
  if (ffi::Error e = check(s, k, v, fac, pair_idx, mask, has_mask); e.failure()) return e;
  const int block = (int)block_attr, blocks = (s.N + block - 1) / block, units = s.B * s.H * s.F * blocks;
  const uint8_t* M = has_mask ? mask.typed_data() : nullptr;
  const int32_t* pairs = pair_idx.typed_data();
  float *O = out->typed_data(), *L = lse->typed_data();
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> S((size_t)block * s.Lk), keys(s.P ? (size_t)s.Lk * s.D : 0), inv(block);
    const float one = 1.0f, zero = 0.0f;
    const int hd = s.HD(), hv = s.HV(), ldk = s.P ? s.D : hd;
    long built = -1;  // the (b, h, f) whose keys are in `keys`
#pragma omp for schedule(dynamic, blocks)  // one (b, h, f) per chunk: its keys built once
    for (int u = 0; u < units; ++u) {
      const int b = u / (s.H * s.F * blocks), h = (u / (s.F * blocks)) % s.H, f = (u / blocks) % s.F;
      const int j0 = (u % blocks) * block, i0 = f * s.N + j0, m = std::min(block, s.N - j0);
      const Rows r = rows_of(s, q.typed_data(), k.typed_data(), v.typed_data(), fac.typed_data(), b, h);
      if (s.P && built != u / blocks) {
        build_keys(s, r, pairs, f, keys.data());
        built = u / blocks;
      }
      const float* kf = s.P ? keys.data() : r.k;
      sgemm("T", "N", &s.Lk, &m, &s.D, &scale, kf, &ldk, r.q + (size_t)i0 * hd, &hd, &zero, S.data(),
            &s.Lk);  // S = scale q K[f]^T
      for (int i = 0; i < m; ++i) {
        const uint8_t* keep = M ? M + ((size_t)(s.Bm > 1 ? b : 0) * s.Lq + i0 + i) * s.Lk : nullptr;
        L[((size_t)b * s.H + h) * s.Lq + i0 + i] = softmax_row(S.data() + (size_t)i * s.Lk, keep, s.Lk, &inv[i]);
      }
      float* ob = O + ((size_t)b * s.Lq + i0) * hv + h * s.Dv;
      sgemm("N", "N", &s.Dv, &m, &s.Lk, &one, r.v, &hv, S.data(), &s.Lk, &zero, ob, &hv);  // O = exp(S - max) v
      for (int i = 0; i < m; ++i) {  // ... / sum: Dv divisions per row, not Lk
        float* o = ob + (size_t)i * hv;
        const float c = inv[i];
#pragma omp simd
        for (int d = 0; d < s.Dv; ++d) o[d] *= c;
      }
    }
  }
  return ffi::Error::Success();
}

static void zero_rows(float* p, int rows, int stride, int width) {
  for (int j = 0; j < rows; ++j) std::fill(p + (size_t)j * stride, p + (size_t)j * stride + width, 0.0f);
}

static ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                           ffi::Buffer<ffi::F32> fac, ffi::Buffer<ffi::S32> pair_idx, ffi::Buffer<ffi::U8> mask,
                           ffi::Buffer<ffi::F32> o, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                           ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                           ffi::ResultBuffer<ffi::F32> dv, ffi::ResultBuffer<ffi::F32> dfac, float scale,
                           int64_t has_mask, int64_t block_attr, int64_t threads) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_attention: no sgemm set");
  const Shapes s = shapes_of(q, v, fac, mask);
  if (ffi::Error e = check(s, k, v, fac, pair_idx, mask, has_mask); e.failure()) return e;
  const int block = (int)block_attr, units = s.B * s.H;
  const float *O = o.typed_data(), *L = lse.typed_data(), *G = dout.typed_data();
  const uint8_t* M = has_mask ? mask.typed_data() : nullptr;
  const int32_t* pairs = pair_idx.typed_data();
  float *dQ = dq->typed_data(), *dK = dk->typed_data(), *dV = dv->typed_data(), *dF = dfac->typed_data();
  std::vector<uint8_t> is_pair(s.D, 0);
  for (int p = 0; p < s.P; ++p) is_pair[2 * pairs[p]] = is_pair[2 * pairs[p] + 1] = 1;
  const size_t fac_size = (size_t)s.F * s.Lk * s.P * 2;  // one batch element's factors
  std::unique_ptr<float[]> dfac_heads(new float[(size_t)s.B * s.H * fac_size]);  // [B, H, F, Lk, P, 2], all written
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> Pm((size_t)block * s.Lk), dP((size_t)block * s.Lk), delta(block);
    std::vector<float> keys(s.P ? (size_t)s.Lk * s.D : 0), dkeys(keys.size());
    const float one = 1.0f, zero = 0.0f;
    const int hd = s.HD(), hv = s.HV(), ldk = s.P ? s.D : hd;
#pragma omp for schedule(dynamic)
    for (int u = 0; u < units; ++u) {
      const int b = u / s.H, h = u % s.H;
      const Rows r = rows_of(s, q.typed_data(), k.typed_data(), v.typed_data(), fac.typed_data(), b, h);
      float* dkb = dK + (size_t)b * s.Lk * hd + h * s.D;
      float* dvb = dV + (size_t)b * s.Lk * hv + h * s.Dv;
      zero_rows(dkb, s.Lk, hd, s.D);
      zero_rows(dvb, s.Lk, hv, s.Dv);
      const float* kf = s.P ? keys.data() : r.k;  // this frame's keys and their gradient
      float* dkf = s.P ? dkeys.data() : dkb;
      for (int f = 0; f < s.F; ++f) {
        if (s.P) {
          build_keys(s, r, pairs, f, keys.data());
          std::fill(dkeys.begin(), dkeys.end(), 0.0f);
        }
        for (int i0 = f * s.N, m = 0; i0 < (f + 1) * s.N; i0 += m) {
          m = std::min(block, (f + 1) * s.N - i0);
          const size_t vrow = ((size_t)b * s.Lq + i0) * hv + h * s.Dv;
          const float *ob = O + vrow, *gb = G + vrow, *qb = r.q + (size_t)i0 * hd;
          const float* lb = L + ((size_t)b * s.H + h) * s.Lq + i0;
          sgemm("T", "N", &s.Lk, &m, &s.D, &scale, kf, &ldk, qb, &hd, &zero, Pm.data(), &s.Lk);  // S
          for (int i = 0; i < m; ++i) {
            float* p = Pm.data() + (size_t)i * s.Lk;
            const uint8_t* keep = M ? M + ((size_t)(s.Bm > 1 ? b : 0) * s.Lq + i0 + i) * s.Lk : nullptr;
            exp_row(p, lb[i], keep, p, s.Lk);  // P = exp(S - lse)
            float d = 0.0f;
            for (int c = 0; c < s.Dv; ++c) d += gb[(size_t)i * hv + c] * ob[(size_t)i * hv + c];
            delta[i] = d;
          }
          sgemm("N", "T", &s.Dv, &s.Lk, &m, &one, gb, &hv, Pm.data(), &s.Lk, &one, dvb, &hv);   // dV += P^T dO
          sgemm("T", "N", &s.Lk, &m, &s.Dv, &one, r.v, &hv, gb, &hv, &zero, dP.data(), &s.Lk);  // dP = dO v^T
          for (int i = 0; i < m; ++i) {
            float* p = Pm.data() + (size_t)i * s.Lk;
            const float* g = dP.data() + (size_t)i * s.Lk;
            const float di = delta[i];
#pragma omp simd
            for (int j = 0; j < s.Lk; ++j) p[j] = p[j] * (g[j] - di) * scale;  // dS, with the logits' scale
          }
          float* dqb = dQ + ((size_t)b * s.Lq + i0) * hd + h * s.D;
          sgemm("N", "N", &s.D, &m, &s.Lk, &one, kf, &ldk, Pm.data(), &s.Lk, &zero, dqb, &hd);  // dq = dS K[f]
          sgemm("N", "T", &s.D, &s.Lk, &m, &one, qb, &hd, Pm.data(), &s.Lk, &one, dkf, &ldk);   // dK[f] += dS^T q
        }
        if (s.P)
          unrotate(s, r, pairs, is_pair.data(), f, dkeys.data(), dkb,
                   dfac_heads.get() + ((size_t)b * s.H + h) * fac_size + (size_t)f * s.Lk * s.P * 2);
      }
    }
    // The factors' gradient, summed over the heads (zero-sized when P = 0).
    const int chunks = s.P ? s.B * s.F : 0;
    const size_t chunk = (size_t)s.Lk * s.P * 2;
#pragma omp for schedule(static)
    for (int c = 0; c < chunks; ++c) {
      const int b = c / s.F, f = c % s.F;
      float* out = dF + (size_t)c * chunk;
      std::fill(out, out + chunk, 0.0f);
      for (int h = 0; h < s.H; ++h) {
        const float* in = dfac_heads.get() + ((size_t)b * s.H + h) * fac_size + (size_t)f * chunk;
#pragma omp simd
        for (size_t x = 0; x < chunk; ++x) out[x] += in[x];
      }
    }
  }
  return ffi::Error::Success();
}

// Both handlers take q, k, v, fac, pairs and mask first and the same attributes last.
template <typename B>
static auto with_inputs(B binding) {
  return f32_args<4>(std::move(binding))  // q, k, v, fac
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::U8>>();
}

template <typename B>
static auto with_attrs(B binding) {
  return std::move(binding)
      .template Attr<float>("scale")
      .template Attr<int64_t>("has_mask")
      .template Attr<int64_t>("block")
      .template Attr<int64_t>("threads");
}

static auto forward_binding() {  // -> out, lse
  return with_attrs(f32_rets<2>(with_inputs(ffi::Ffi::Bind())));
}

static auto backward_binding() {  // o, lse, dout -> dq, dk, dv, dfac
  return with_attrs(f32_rets<4>(f32_args<3>(with_inputs(ffi::Ffi::Bind()))));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuAttentionForward, Forward, forward_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuAttentionBackward, Backward, backward_binding());
