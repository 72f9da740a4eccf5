// Prototype (benchmarks/cpu_attention.py builds and measures it; not wired into jaxwm): dense softmax attention for
// XLA:CPU through the XLA FFI, forward and backward, float32, no mask. q, k, v, o, dout: [B, T, H, D] row-major;
// lse [B, H, Tq]. Forward: per (batch, head, block of queries) the block's whole score rows stay in cache between
// S = scale q k^T, the softmax and P v. Backward (FlashAttention's, unblocked over keys): per (batch, head), P is
// recomputed from lse, dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)) scale, dQ = dS K, dK += dS^T Q.
// Products by the BLAS sgemm scipy ships (column-major: a row-major [m, n] with row stride ld is its transpose).
#include <cmath>
#include <cstdint>
#include <vector>
#include <algorithm>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);
static sgemm_t sgemm = nullptr;
extern "C" void set_sgemm(void* p) { sgemm = (sgemm_t)p; }

static ffi::Error AttnFwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                              ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse, int64_t block_attr) {
  const int block = (int)block_attr;
  auto dims = q.dimensions();
  const int B = dims[0], Tq = dims[1], H = dims[2], D = dims[3];
  const int Tk = k.dimensions()[1];
  const int HD = H * D;
  const float scale = 1.0f / std::sqrt((float)D);
  const float* Q = q.typed_data(); const float* K = k.typed_data(); const float* V = v.typed_data();
  float* O = out->typed_data(); float* L = lse->typed_data();
  const int nblk = (Tq + block - 1) / block;
  const int units = B * H * nblk;
  #pragma omp parallel
  {
    std::vector<float> S((size_t)block * Tk);
    #pragma omp for schedule(static)
    for (int u = 0; u < units; ++u) {
      int b = u / (H * nblk), r = u % (H * nblk), h = r / nblk, blk = r % nblk;
      int i0 = blk * block, m = std::min(block, Tq - i0);
      const float* qb = Q + ((size_t)b * Tq + i0) * HD + h * D;
      const float* kb = K + (size_t)b * Tk * HD + h * D;
      const float* vb = V + (size_t)b * Tk * HD + h * D;
      float* ob = O + ((size_t)b * Tq + i0) * HD + h * D;
      // S[m x Tk] (row-major) = scale * Qb Kb^T  <=>  col-major S^T = K Q^T
      float one = 1.0f, zero = 0.0f;
      sgemm("T", "N", &Tk, &m, &D, &scale, kb, &HD, qb, &HD, &zero, S.data(), &Tk);
      for (int i = 0; i < m; ++i) {
        float* s = S.data() + (size_t)i * Tk;
        float mx = -INFINITY;
        for (int j = 0; j < Tk; ++j) mx = std::max(mx, s[j]);
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int j = 0; j < Tk; ++j) { float e = std::exp(s[j] - mx); s[j] = e; sum += e; }
        float inv = 1.0f / sum;
        #pragma omp simd
        for (int j = 0; j < Tk; ++j) s[j] *= inv;
        L[((size_t)b * H + h) * Tq + i0 + i] = mx + std::log(sum);
      }
      // O[m x D] = P V  <=>  col-major O^T = V^T P^T
      sgemm("N", "N", &D, &m, &Tk, &one, vb, &HD, S.data(), &Tk, &zero, ob, &HD);
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnFwd, AttnFwdImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>().Attr<int64_t>("block"));

// Backward: per (b, h) unit (dK, dV accumulate over q-blocks), P recomputed from lse.
static ffi::Error AttnBwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                              ffi::Buffer<ffi::F32> o, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                              ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                              ffi::ResultBuffer<ffi::F32> dv, int64_t block_attr) {
  const int block = (int)block_attr;
  auto dims = q.dimensions();
  const int B = dims[0], Tq = dims[1], H = dims[2], D = dims[3];
  const int Tk = k.dimensions()[1];
  const int HD = H * D;
  const float scale = 1.0f / std::sqrt((float)D);
  const float *Q = q.typed_data(), *K = k.typed_data(), *V = v.typed_data(), *O = o.typed_data(),
              *L = lse.typed_data(), *dO = dout.typed_data();
  float *dQ = dq->typed_data(), *dK = dk->typed_data(), *dV = dv->typed_data();
  const int units = B * H;
  #pragma omp parallel
  {
    std::vector<float> P((size_t)block * Tk), dP((size_t)block * Tk), delta(block);
    #pragma omp for schedule(static)
    for (int u = 0; u < units; ++u) {
      int b = u / H, h = u % H;
      const float* kb = K + (size_t)b * Tk * HD + h * D;
      const float* vb = V + (size_t)b * Tk * HD + h * D;
      float* dkb = dK + (size_t)b * Tk * HD + h * D;
      float* dvb = dV + (size_t)b * Tk * HD + h * D;
      for (int j = 0; j < Tk; ++j)
        for (int d = 0; d < D; ++d) { dkb[(size_t)j * HD + d] = 0.f; dvb[(size_t)j * HD + d] = 0.f; }
      for (int i0 = 0; i0 < Tq; i0 += block) {
        int m = std::min(block, Tq - i0);
        size_t row0 = ((size_t)b * Tq + i0) * HD + h * D;
        const float *qb = Q + row0, *ob = O + row0, *gb = dO + row0;
        float* dqb = dQ + row0;
        const float* lb = L + ((size_t)b * H + h) * Tq + i0;
        float one = 1.0f, zero = 0.0f;
        sgemm("T", "N", &Tk, &m, &D, &scale, kb, &HD, qb, &HD, &zero, P.data(), &Tk);       // S
        for (int i = 0; i < m; ++i) {
          float* p = P.data() + (size_t)i * Tk; float l = lb[i];
          #pragma omp simd
          for (int j = 0; j < Tk; ++j) p[j] = std::exp(p[j] - l);                               // P
          float s = 0.f;
          for (int d = 0; d < D; ++d) s += gb[(size_t)i * HD + d] * ob[(size_t)i * HD + d];
          delta[i] = s;
        }
        // dV[Tk x D] += P^T dO  <=>  col-major dV^T += dO^T P
        sgemm("N", "T", &D, &Tk, &m, &one, gb, &HD, P.data(), &Tk, &one, dvb, &HD);
        // dP[m x Tk] = dO V^T  <=> col-major dP^T = V dO^T
        sgemm("T", "N", &Tk, &m, &D, &one, vb, &HD, gb, &HD, &zero, dP.data(), &Tk);
        for (int i = 0; i < m; ++i) {
          float* p = P.data() + (size_t)i * Tk; const float* g = dP.data() + (size_t)i * Tk; float di = delta[i];
          #pragma omp simd
          for (int j = 0; j < Tk; ++j) p[j] = p[j] * (g[j] - di) * scale;                      // dS (scaled)
        }
        // dQ[m x D] = dS K  <=> col-major dQ^T = K^T dS^T
        sgemm("N", "N", &D, &m, &Tk, &one, kb, &HD, P.data(), &Tk, &zero, dqb, &HD);
        // dK[Tk x D] += dS^T Q  <=> col-major dK^T += Q^T dS
        sgemm("N", "T", &D, &Tk, &m, &one, qb, &HD, P.data(), &Tk, &one, dkb, &HD);
      }
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnBwd, AttnBwdImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
        .Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>()
        .Attr<int64_t>("block"));
