// WorldRoPE's expected rotary factors for XLA:CPU through the XLA FFI (built and loaded by
// xla_kernels/cpu_view_factors.py; the reference is jaxwm/ops/view_factors.py). float32, row-major.
//
// Inputs: the key Gaussians mean [B, Lk, M, 3], root [B, Lk, M, 3, 3] (covariance root, columns r), alpha
// [B, Lk, M]; the query cameras intrinsics [B, F, 3, 3] and c2w [B, F, 4, 4]; the frequencies freqs [P, 2].
// Output: factors [B, F, Lk, P, 2] (re, im). Per (b, f, key j, hypothesis m), with R, o the query camera's rotation
// and origin, s the pixels per token (inv_s = 1 / s):
//   xc = R^T (X - o), z = xc_2; in front iff z > eps (else the hypothesis adds 0); x = xc_0 / z, y = xc_1 / z
//   mean' = (fx x + sk y + cx, fy y + cy) / s - 0.5                       (token-grid coordinates)
//   Jc = [[fx, sk, -(fx x + sk y)], [0, fy, -fy y]] / z,  root' = Jc R^T root / s      (Sigma' = root' root'^T)
//   uu = |root'_0|^2, vv = |root'_1|^2, uv2 = 2 root'_0 . root'_1
// and per frequency p (fu, fv):
//   phase = mean'_0 fu + mean'_1 fv,  quad = max(uu fu^2 + vv fv^2 + uv2 fu fv, 0)
//   factor_p += alpha exp(-quad / 2) (cos phase, sin phase).
// The backward is that chain's reverse for every input (the query cameras included: d c2w's rotation and origin,
// d fx, fy, cx, cy, sk; the other entries get 0). Units are (batch, block of keys), all views inside, so the keys'
// gradients (sums over views) have one writer; the cameras' (sums over keys) are written per unit and summed in
// unit order after a barrier: the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "cpu_ffi.h"
#include "cpu_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jaxwm_ffi::f32_args;
using jaxwm_ffi::f32_rets;

static constexpr int KEYS = 16;  // keys per unit
static constexpr int CAM = 17;   // camera gradient terms: R (9), o (3), fx, fy, cx, cy, sk

struct Dims {
  int B, Lk, M, F, P;
};

struct Camera {
  float R[3][3];  // c2w[:3, :3], R[j][i]
  float o[3];
  float fx, fy, cx, cy, sk;
};

static Camera camera_of(const float* K, const float* c2w) {
  Camera c;
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 3; ++i) c.R[j][i] = c2w[4 * j + i];
    c.o[j] = c2w[4 * j + 3];
  }
  c.fx = K[0], c.sk = K[1], c.cx = K[2], c.fy = K[4], c.cy = K[5];
  return c;
}

// One hypothesis seen from one query camera (the forward's intermediates, kept for the backward).
struct Projected {
  bool ok;
  float d[3], zs, x, y;
  float rc[3][3];  // R^T root
  float jc[2][3];  // d(u, v) / d xc
  float r2[2][3];  // root' = Jc R^T root / s
  float m0, m1, uu, vv, uv2;
};

static inline void project(const Camera& c, const float* X, const float* root, float eps, float inv_s,
                           Projected& p) {
  float xc[3];
  for (int j = 0; j < 3; ++j) p.d[j] = X[j] - c.o[j];
  for (int i = 0; i < 3; ++i) xc[i] = c.R[0][i] * p.d[0] + c.R[1][i] * p.d[1] + c.R[2][i] * p.d[2];
  p.ok = xc[2] > eps;
  if (!p.ok) return;
  p.zs = xc[2];
  p.x = xc[0] / p.zs, p.y = xc[1] / p.zs;
  p.m0 = (c.fx * p.x + c.sk * p.y + c.cx) * inv_s - 0.5f;
  p.m1 = (c.fy * p.y + c.cy) * inv_s - 0.5f;
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < 3; ++r)
      p.rc[i][r] = c.R[0][i] * root[r] + c.R[1][i] * root[3 + r] + c.R[2][i] * root[6 + r];
  const float iz = 1.0f / p.zs;
  p.jc[0][0] = c.fx * iz, p.jc[0][1] = c.sk * iz, p.jc[0][2] = -(c.fx * p.x + c.sk * p.y) * iz;
  p.jc[1][0] = 0.0f, p.jc[1][1] = c.fy * iz, p.jc[1][2] = -c.fy * p.y * iz;
  p.uu = p.vv = p.uv2 = 0.0f;
  for (int r = 0; r < 3; ++r) {
    for (int a = 0; a < 2; ++a)
      p.r2[a][r] = (p.jc[a][0] * p.rc[0][r] + p.jc[a][1] * p.rc[1][r] + p.jc[a][2] * p.rc[2][r]) * inv_s;
    p.uu += p.r2[0][r] * p.r2[0][r];
    p.vv += p.r2[1][r] * p.r2[1][r];
    p.uv2 += p.r2[0][r] * p.r2[1][r];
  }
  p.uv2 *= 2.0f;
}

static constexpr int LANES = 16;  // the pair loops run over P rounded up to whole 64-byte vectors

// 64-byte aligned float arrays of n (a multiple of LANES), zeroed.
struct Aligned {
  float* p;
  explicit Aligned(size_t n) : p(static_cast<float*>(std::aligned_alloc(64, sizeof(float) * n))) {
    if (p == nullptr) throw std::bad_alloc();
    std::fill(p, p + n, 0.0f);
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
};

// The frequencies' terms u, v, u^2, v^2, u v, [Pa] each (Pa = P rounded up to LANES; the padding is 0).
struct Freqs {
  int Pa;
  Aligned t;
  Freqs(const float* f, int P) : Pa((P + LANES - 1) / LANES * LANES), t(5 * (size_t)Pa) {
    for (int p = 0; p < P; ++p) {
      const float u = f[2 * p], v = f[2 * p + 1];
      t.p[p] = u, t.p[Pa + p] = v, t.p[2 * Pa + p] = u * u, t.p[3 * Pa + p] = v * v, t.p[4 * Pa + p] = u * v;
    }
  }
  const float* at(int i) const { return t.p + (size_t)i * Pa; }
};

static bool ranks_ok(const ffi::Buffer<ffi::F32>& mean, const ffi::Buffer<ffi::F32>& root,
                     const ffi::Buffer<ffi::F32>& alpha, const ffi::Buffer<ffi::F32>& K,
                     const ffi::Buffer<ffi::F32>& c2w, const ffi::Buffer<ffi::F32>& freqs) {
  return mean.dimensions().size() == 4 && root.dimensions().size() == 5 && alpha.dimensions().size() == 3 &&
         K.dimensions().size() == 4 && c2w.dimensions().size() == 4 && freqs.dimensions().size() == 2;
}

static Dims dims_of(const ffi::Buffer<ffi::F32>& root, const ffi::Buffer<ffi::F32>& c2w,
                    const ffi::Buffer<ffi::F32>& freqs) {
  auto r = root.dimensions();
  return Dims{(int)r[0], (int)r[1], (int)r[2], (int)c2w.dimensions()[1], (int)freqs.dimensions()[0]};
}

static ffi::Error check(const Dims& s, const ffi::Buffer<ffi::F32>& mean, const ffi::Buffer<ffi::F32>& root,
                        const ffi::Buffer<ffi::F32>& alpha, const ffi::Buffer<ffi::F32>& K,
                        const ffi::Buffer<ffi::F32>& c2w, const ffi::Buffer<ffi::F32>& freqs) {
  auto m = mean.dimensions(), r = root.dimensions(), a = alpha.dimensions(), k = K.dimensions(),
       c = c2w.dimensions(), f = freqs.dimensions();
  if (m.size() != 4 || m[0] != s.B || m[1] != s.Lk || m[2] != s.M || m[3] != 3)
    return ffi::Error::InvalidArgument("cpu_view_factors: mean's shape");
  if (r.size() != 5 || r[3] != 3 || r[4] != 3) return ffi::Error::InvalidArgument("cpu_view_factors: root's shape");
  if (a.size() != 3 || a[0] != s.B || a[1] != s.Lk || a[2] != s.M)
    return ffi::Error::InvalidArgument("cpu_view_factors: alpha's shape");
  if (k.size() != 4 || k[0] != s.B || k[1] != s.F || k[2] != 3 || k[3] != 3)
    return ffi::Error::InvalidArgument("cpu_view_factors: intrinsics' shape");
  if (c.size() != 4 || c[0] != s.B || c[2] != 4 || c[3] != 4)
    return ffi::Error::InvalidArgument("cpu_view_factors: c2w's shape");
  if (f.size() != 2 || f[1] != 2) return ffi::Error::InvalidArgument("cpu_view_factors: freqs' shape");
  return ffi::Error::Success();
}

static ffi::Error Forward(ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> root, ffi::Buffer<ffi::F32> alpha,
                          ffi::Buffer<ffi::F32> K, ffi::Buffer<ffi::F32> c2w, ffi::Buffer<ffi::F32> freqs,
                          ffi::ResultBuffer<ffi::F32> out, float inv_s, float eps, int64_t threads) {
  if (!ranks_ok(mean, root, alpha, K, c2w, freqs)) return ffi::Error::InvalidArgument("cpu_view_factors: ranks");
  const Dims s = dims_of(root, c2w, freqs);
  if (ffi::Error e = check(s, mean, root, alpha, K, c2w, freqs); e.failure()) return e;
  const Freqs fr(freqs.typed_data(), s.P);
  const int blocks = (s.Lk + KEYS - 1) / KEYS, units = s.B * blocks, P = s.P;
  const float *X = mean.typed_data(), *RT = root.typed_data(), *A = alpha.typed_data();
  float* O = out->typed_data();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int u = 0; u < units; ++u) {
    const int b = u / blocks, j0 = (u % blocks) * KEYS, j1 = std::min(j0 + KEYS, s.Lk);
    const int Pa = fr.Pa;
    Aligned acc(2 * (size_t)Pa);
    float *rp = acc.p, *ip = acc.p + Pa;
    const float *fu = fr.at(0), *fv = fr.at(1), *fuu = fr.at(2), *fvv = fr.at(3), *fuv = fr.at(4);
    for (int f = 0; f < s.F; ++f) {
      const Camera cam = camera_of(K.typed_data() + ((size_t)b * s.F + f) * 9,
                                   c2w.typed_data() + ((size_t)b * s.F + f) * 16);
      for (int j = j0; j < j1; ++j) {
        std::fill(acc.p, acc.p + 2 * Pa, 0.0f);
        for (int m = 0; m < s.M; ++m) {
          const size_t h = ((size_t)b * s.Lk + j) * s.M + m;
          Projected pr;
          project(cam, X + 3 * h, RT + 9 * h, eps, inv_s, pr);
          const float w = A[h];
          if (!pr.ok) {  // weight alpha * 0: adds 0 (NaN for a NaN alpha, as the reference)
            for (int p = 0; p < P; ++p) rp[p] += w * 0.0f, ip[p] += w * 0.0f;
            continue;
          }
          const float m0 = pr.m0, m1 = pr.m1, uu = pr.uu, vv = pr.vv, uv2 = pr.uv2;
#pragma omp simd
          for (int p = 0; p < Pa; ++p) {
            const float raw = uu * fuu[p] + vv * fvv[p] + uv2 * fuv[p], quad = raw < 0.0f ? 0.0f : raw;
            const float we = w * exp_nonpositive(-0.5f * quad);
            float sn, cs;
            sincos_poly(m0 * fu[p] + m1 * fv[p], &sn, &cs);
            rp[p] += we * cs;
            ip[p] += we * sn;
          }
        }
        float* o = O + (((size_t)b * s.F + f) * s.Lk + j) * P * 2;
        for (int p = 0; p < P; ++p) o[2 * p] = rp[p], o[2 * p + 1] = ip[p];
      }
    }
  }
  return ffi::Error::Success();
}

// The reverse of `project` for one hypothesis: given d mean' (dm0, dm1) and d (uu, vv, uv2), adds to d X and d root
// and to the camera's accumulators (cg: R (9), o (3), fx, fy, cx, cy, sk).
static inline void project_backward(const Camera& c, const float* root, float inv_s, const Projected& p, float dm0,
                                    float dm1, float duu, float dvv, float duv2, float* dX, float* droot,
                                    double* cg) {
  float dr2[2][3], drc[3][3], djc[2][3] = {{0}};
  for (int r = 0; r < 3; ++r) {  // uu = sum r2_0^2, vv = sum r2_1^2, uv2 = 2 sum r2_0 r2_1; root' = (Jc rc) inv_s
    dr2[0][r] = 2.0f * (duu * p.r2[0][r] + duv2 * p.r2[1][r]) * inv_s;
    dr2[1][r] = 2.0f * (dvv * p.r2[1][r] + duv2 * p.r2[0][r]) * inv_s;
  }
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < 3; ++r) {
      drc[i][r] = p.jc[0][i] * dr2[0][r] + p.jc[1][i] * dr2[1][r];
      for (int a = 0; a < 2; ++a) djc[a][i] += dr2[a][r] * p.rc[i][r];
    }
  for (int j = 0; j < 3; ++j)  // rc = R^T root
    for (int r = 0; r < 3; ++r) {
      droot[3 * j + r] += c.R[j][0] * drc[0][r] + c.R[j][1] * drc[1][r] + c.R[j][2] * drc[2][r];
      for (int i = 0; i < 3; ++i) cg[3 * j + i] += (double)root[3 * j + r] * drc[i][r];
    }
  const float du = dm0 * inv_s, dv = dm1 * inv_s, iz = 1.0f / p.zs, x = p.x, y = p.y;
  // u = fx x + sk y + cx, v = fy y + cy; and Jc's entries (each a function of x, y over z)
  double& dfx = cg[12], &dfy = cg[13], &dcx = cg[14], &dcy = cg[15], &dsk = cg[16];
  dfx += du * x + (djc[0][0] - djc[0][2] * x) * iz;
  dsk += du * y + (djc[0][1] - djc[0][2] * y) * iz;
  dfy += dv * y + (djc[1][1] - djc[1][2] * y) * iz;
  dcx += du;
  dcy += dv;
  const float dx = du * c.fx - djc[0][2] * c.fx * iz;
  const float dy = du * c.sk + dv * c.fy - (djc[0][2] * c.sk + djc[1][2] * c.fy) * iz;
  float dz = -(djc[0][0] * p.jc[0][0] + djc[0][1] * p.jc[0][1] + djc[0][2] * p.jc[0][2] + djc[1][1] * p.jc[1][1] +
               djc[1][2] * p.jc[1][2]) * iz;
  dz -= (dx * x + dy * y) * iz;  // x = xc_0 / z, y = xc_1 / z
  const float dxc[3] = {dx * iz, dy * iz, dz};
  for (int j = 0; j < 3; ++j) {  // xc = R^T (X - o)
    const float dd = c.R[j][0] * dxc[0] + c.R[j][1] * dxc[1] + c.R[j][2] * dxc[2];
    dX[j] += dd;
    cg[9 + j] -= dd;
    for (int i = 0; i < 3; ++i) cg[3 * j + i] += (double)p.d[j] * dxc[i];
  }
}

static ffi::Error Backward(ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> root, ffi::Buffer<ffi::F32> alpha,
                           ffi::Buffer<ffi::F32> K, ffi::Buffer<ffi::F32> c2w, ffi::Buffer<ffi::F32> freqs,
                           ffi::Buffer<ffi::F32> dout, ffi::ResultBuffer<ffi::F32> dmean,
                           ffi::ResultBuffer<ffi::F32> droot, ffi::ResultBuffer<ffi::F32> dalpha,
                           ffi::ResultBuffer<ffi::F32> dK, ffi::ResultBuffer<ffi::F32> dc2w, float inv_s, float eps,
                           int64_t threads) {
  if (!ranks_ok(mean, root, alpha, K, c2w, freqs)) return ffi::Error::InvalidArgument("cpu_view_factors: ranks");
  const Dims s = dims_of(root, c2w, freqs);
  if (ffi::Error e = check(s, mean, root, alpha, K, c2w, freqs); e.failure()) return e;
  if (dout.element_count() != (size_t)s.B * s.F * s.Lk * s.P * 2)
    return ffi::Error::InvalidArgument("cpu_view_factors: the factors' cotangent's shape");
  const Freqs fr(freqs.typed_data(), s.P);
  const int blocks = (s.Lk + KEYS - 1) / KEYS, units = s.B * blocks, P = s.P;
  const float *X = mean.typed_data(), *RT = root.typed_data(), *A = alpha.typed_data(), *G = dout.typed_data();
  float *dX = dmean->typed_data(), *dR = droot->typed_data(), *dA = dalpha->typed_data();
  std::vector<double> cams((size_t)units * s.F * CAM, 0.0);  // per unit and view
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int u = 0; u < units; ++u) {
      const int b = u / blocks, j0 = (u % blocks) * KEYS, j1 = std::min(j0 + KEYS, s.Lk);
      const size_t h0 = ((size_t)b * s.Lk + j0) * s.M, h1 = ((size_t)b * s.Lk + j1) * s.M;
      std::fill(dX + 3 * h0, dX + 3 * h1, 0.0f);
      std::fill(dR + 9 * h0, dR + 9 * h1, 0.0f);
      std::fill(dA + h0, dA + h1, 0.0f);
      const int Pa = fr.Pa;
      Aligned gs(2 * (size_t)Pa);  // the cotangent's re and im parts apart, 0 on the padding
      float *g0s = gs.p, *g1s = gs.p + Pa;
      const float *fu = fr.at(0), *fv = fr.at(1), *fuu = fr.at(2), *fvv = fr.at(3), *fuv = fr.at(4);
      for (int f = 0; f < s.F; ++f) {
        const Camera cam = camera_of(K.typed_data() + ((size_t)b * s.F + f) * 9,
                                     c2w.typed_data() + ((size_t)b * s.F + f) * 16);
        double* cg = cams.data() + ((size_t)u * s.F + f) * CAM;
        for (int j = j0; j < j1; ++j) {
          const float* g = G + (((size_t)b * s.F + f) * s.Lk + j) * P * 2;
          for (int p = 0; p < P; ++p) g0s[p] = g[2 * p], g1s[p] = g[2 * p + 1];
          for (int m = 0; m < s.M; ++m) {
            const size_t h = ((size_t)b * s.Lk + j) * s.M + m;
            Projected pr;
            project(cam, X + 3 * h, RT + 9 * h, eps, inv_s, pr);
            if (!pr.ok) continue;  // weight alpha * 0: no gradient
            const float w = A[h], m0 = pr.m0, m1 = pr.m1, uu = pr.uu, vv = pr.vv, uv2 = pr.uv2;
            float dw = 0.0f, dm0 = 0.0f, dm1 = 0.0f, duu = 0.0f, dvv = 0.0f, duv2 = 0.0f;
#pragma omp simd reduction(+ : dw, dm0, dm1, duu, dvv, duv2) aligned(g0s, g1s, fu, fv, fuu, fvv, fuv : 64)
            for (int p = 0; p < Pa; ++p) {
              const float raw = uu * fuu[p] + vv * fvv[p] + uv2 * fuv[p];
              const float e = exp_nonpositive(-0.5f * (raw < 0.0f ? 0.0f : raw));
              float sn, cs;
              sincos_poly(m0 * fu[p] + m1 * fv[p], &sn, &cs);
              const float g0 = g0s[p], g1 = g1s[p], t = g0 * cs + g1 * sn, we = w * e;
              const float dphase = we * (g1 * cs - g0 * sn);
              // d max(raw, 0) / d raw: 1 above 0, 1/2 at 0 (jnp.maximum's tie), 0 below
              const float dquad = -0.5f * we * t * (raw > 0.0f ? 1.0f : raw == 0.0f ? 0.5f : 0.0f);
              const bool lane = p < P;  // the padding adds nothing, even where inf * 0 made it NaN
              dw += lane ? e * t : 0.0f;
              dm0 += lane ? dphase * fu[p] : 0.0f;
              dm1 += lane ? dphase * fv[p] : 0.0f;
              duu += lane ? dquad * fuu[p] : 0.0f;
              dvv += lane ? dquad * fvv[p] : 0.0f;
              duv2 += lane ? dquad * fuv[p] : 0.0f;
            }
            dA[h] += dw;
            project_backward(cam, RT + 9 * h, inv_s, pr, dm0, dm1, duu, dvv, duv2, dX + 3 * h, dR + 9 * h, cg);
          }
        }
      }
    }
    // The cameras' gradients: per (batch, view), the units' sums in unit order.
    float *dk = dK->typed_data(), *dc = dc2w->typed_data();
#pragma omp for schedule(static)
    for (int bf = 0; bf < s.B * s.F; ++bf) {
      const int b = bf / s.F, f = bf % s.F;
      double t[CAM] = {0};
      for (int u = b * blocks; u < (b + 1) * blocks; ++u)
        for (int c = 0; c < CAM; ++c) t[c] += cams[((size_t)u * s.F + f) * CAM + c];
      float* k = dk + (size_t)bf * 9;
      float* w = dc + (size_t)bf * 16;
      std::fill(k, k + 9, 0.0f);
      std::fill(w, w + 16, 0.0f);
      for (int j = 0; j < 3; ++j) {
        for (int i = 0; i < 3; ++i) w[4 * j + i] = (float)t[3 * j + i];
        w[4 * j + 3] = (float)t[9 + j];
      }
      k[0] = (float)t[12], k[4] = (float)t[13], k[2] = (float)t[14], k[5] = (float)t[15], k[1] = (float)t[16];
    }
  }
  return ffi::Error::Success();
}

template <typename B>
static auto with_attrs(B binding) {
  return std::move(binding).template Attr<float>("inv_s").template Attr<float>("eps").template Attr<int64_t>(
      "threads");
}
// mean, root, alpha, intrinsics, c2w, freqs -> factors
static auto forward_binding() { return with_attrs(f32_rets<1>(f32_args<6>(ffi::Ffi::Bind()))); }
// and d factors -> d mean, d root, d alpha, d intrinsics, d c2w
static auto backward_binding() { return with_attrs(f32_rets<5>(f32_args<7>(ffi::Ffi::Bind()))); }
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuViewFactorsForward, Forward, forward_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuViewFactorsBackward, Backward, backward_binding());
