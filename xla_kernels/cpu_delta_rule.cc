// The chunked gated delta rule (KDA / Gated DeltaNet, WY/UT form; docs/design.md §7) as one C++ kernel for XLA:CPU,
// forward and backward (model.loci.impl="cpu_flash"; built and loaded by xla_kernels/cpu_delta_rule.py). float32,
// row-major, the reference's layout: q, k, g [B, T, H, K] (g the per-token log-decay, <= 0), v [B, T, H, V],
// beta [B, T, H], s0 [B, H, K, V]; T = N C. Saved states [B, H, N, K, V]. Per chunk of C tokens, with G the
// cumulative log-decay within the chunk, q scaled by `scale`, and the incoming state S [K, V]
// (pallas_kernels/delta_rule/chunk_math.py, the same maths):
//   E_ijd = exp(min(G_id - G_jd, 0))  (j <= i)
//   M_ij = sum_d k_id k_jd E_ijd (j < i),  A_ij = beta_i M_ij,  Aqk_ij = sum_d q_id k_jd E_ijd (j <= i)
//   W = (I + A)^-1 (beta exp(G) k),  U = (I + A)^-1 (beta v)          (forward substitution)
//   Vn = U - W S,  O = (q exp(G)) S + Aqk Vn,  S' = exp(G_C) S + (exp(G_C - G) k)^T Vn
// The backward walks the chunks in reverse from the saved incoming states, recomputes the chunk's terms and applies
// chunk_math.chunk_backward's derivation, then turns the gradient w.r.t. G into one w.r.t. g (a reverse cumulative
// sum within the chunk) and scales dq. The pairwise terms and the substitutions are vectorised loops over channels;
// the products by a BLAS sgemm (column-major; set by jaxwm_cpu_delta_rule_set_sgemm). Units (batch, head) on
// `threads` OpenMP threads, handed out dynamically (as cpu_attention.cc's). Exponentials of positive numbers are never
// taken: a positive exponent is clamped to 0.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "cpu_blas.h"
#include "cpu_ffi.h"
#include "cpu_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jaxwm_ffi::f32_args;
using jaxwm_ffi::f32_rets;

JAXWM_SGEMM(jaxwm_cpu_delta_rule_set_sgemm)

static void mm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc) {
  rowmajor_mm(sgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static inline float exp0(float x) { return exp_nonpositive(x > 0.0f ? 0.0f : x); }  // NaN stays NaN

struct Dims {
  int B, T, H, K, V, C, N;
  size_t KV() const { return (size_t)K * V; }
  size_t row_k(int b, int t, int h) const { return (((size_t)b * T + t) * H + h) * K; }
  size_t row_v(int b, int t, int h) const { return (((size_t)b * T + t) * H + h) * V; }
};

template <typename Dimensions>
static bool dims_are(const Dimensions& d, std::initializer_list<int64_t> want) {
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

// The dimensions from q, v and the chunk; an error where q or v is not of rank 4 or T is not whole chunks.
static ffi::Error dims_of(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& v, int64_t chunk, Dims& s) {
  auto d = q.dimensions(), vd = v.dimensions();
  if (d.size() != 4 || vd.size() != 4) return ffi::Error::InvalidArgument("cpu_delta_rule: q or v is not of rank 4");
  s = Dims{(int)d[0], (int)d[1], (int)d[2], (int)d[3], (int)vd[3], (int)chunk, 0};
  if (s.C < 1 || s.T % s.C) return ffi::Error::InvalidArgument("cpu_delta_rule: T not a multiple of the chunk");
  s.N = s.T / s.C;
  return ffi::Error::Success();
}

// Every buffer the kernel indexes has the shape it assumes (the FFI target is global: a mismatch must be an error,
// never an access out of bounds). `keys` are [B, T, H, K] (q, k, g and their gradients), `values` [B, T, H, V],
// `states` [B, H, K, V], `saved` [B, H, n_saved, K, V].
template <typename KeysT, typename ValuesT, typename StatesT, typename BetaT, typename SavedT>
static ffi::Error check(const Dims& s, std::initializer_list<KeysT> keys, std::initializer_list<ValuesT> values,
                        std::initializer_list<StatesT> states, std::initializer_list<BetaT> betas, const SavedT& saved,
                        int64_t n_saved) {
  for (const auto& d : keys)
    if (!dims_are(d, {s.B, s.T, s.H, s.K})) return ffi::Error::InvalidArgument("cpu_delta_rule: a [B, T, H, K] shape");
  for (const auto& d : values)
    if (!dims_are(d, {s.B, s.T, s.H, s.V})) return ffi::Error::InvalidArgument("cpu_delta_rule: a [B, T, H, V] shape");
  for (const auto& d : states)
    if (!dims_are(d, {s.B, s.H, s.K, s.V})) return ffi::Error::InvalidArgument("cpu_delta_rule: a [B, H, K, V] shape");
  for (const auto& d : betas)
    if (!dims_are(d, {s.B, s.T, s.H})) return ffi::Error::InvalidArgument("cpu_delta_rule: a [B, T, H] shape");
  if (!dims_are(saved, {s.B, s.H, n_saved, s.K, s.V}))
    return ffi::Error::InvalidArgument("cpu_delta_rule: the saved states' shape");
  return ffi::Error::Success();
}

// One chunk of one (batch, head), per thread: its rows gathered (q scaled, k, G the cumulative log-decay, beta) and
// its terms. eg = exp(G), ek = exp(G_C - G), kt = ek k, qg = q eg, M the unscaled key products (strict lower),
// A = beta M, Aqk (lower), W, U, Vn; rows of C.
struct Chunk {
  int C, K, V;
  std::vector<float> q, k, G, beta, eg, ek, kt, qg, M, A, Aqk, W, U, Vn, elast;
  Chunk(int c, int k_, int v)
      : C(c), K(k_), V(v), q(c * k_), k(c * k_), G(c * k_), beta(c), eg(c * k_), ek(c * k_), kt(c * k_),
        qg(c * k_), M(c * c), A(c * c), Aqk(c * c), W(c * k_), U(c * v), Vn(c * v), elast(k_) {}

  // Gathers rows t0 .. t0 + C - 1 of (b, h) and forms everything but Vn.
  void terms(const Dims& s, const float* Q, const float* Kp, const float* Vp, const float* Gp, const float* Bt,
             int b, int h, int t0, float scale) {
    for (int i = 0; i < C; ++i) {
      const size_t r = s.row_k(b, t0 + i, h);
      const float *qi = Q + r, *ki = Kp + r, *gi = Gp + r, *gp = &G[(i ? i - 1 : 0) * K];  // gp: G of row i - 1
      float *qo = &q[i * K], *ko = &k[i * K], *go = &G[i * K];
#pragma omp simd
      for (int d = 0; d < K; ++d) {
        qo[d] = scale * qi[d];
        ko[d] = ki[d];
      }
      if (i == 0) {
        std::memcpy(go, gi, sizeof(float) * K);
      } else {
#pragma omp simd
        for (int d = 0; d < K; ++d) go[d] = gp[d] + gi[d];
      }
      beta[i] = Bt[((size_t)b * s.T + t0 + i) * s.H + h];
    }
    const float* gl = &G[(C - 1) * K];
    for (int i = 0; i < C; ++i) {
      const float *gi = &G[i * K], *ki = &k[i * K], *qi = &q[i * K];
      float *egi = &eg[i * K], *eki = &ek[i * K], *kti = &kt[i * K], *qgi = &qg[i * K];
#pragma omp simd
      for (int d = 0; d < K; ++d) {
        egi[d] = exp0(gi[d]);
        eki[d] = exp0(gl[d] - gi[d]);
        kti[d] = eki[d] * ki[d];
        qgi[d] = qi[d] * egi[d];
      }
      for (int j = 0; j <= i; ++j) {
        const float *gj = &G[j * K], *kj = &k[j * K];
        float kk = 0.0f, qk = 0.0f;
#pragma omp simd reduction(+ : kk, qk)
        for (int d = 0; d < K; ++d) {
          const float t = kj[d] * exp0(gi[d] - gj[d]);
          kk += ki[d] * t;
          qk += qi[d] * t;
        }
        M[i * C + j] = j < i ? kk : 0.0f;
        A[i * C + j] = j < i ? beta[i] * kk : 0.0f;
        Aqk[i * C + j] = qk;
      }
      for (int j = i + 1; j < C; ++j) M[i * C + j] = A[i * C + j] = Aqk[i * C + j] = 0.0f;
    }
#pragma omp simd
    for (int d = 0; d < K; ++d) elast[d] = exp0(gl[d]);
    // W = (I + A)^-1 (beta eg k), U = (I + A)^-1 (beta v): row i minus A_ij times the rows j < i already solved.
    for (int i = 0; i < C; ++i) {
      float *wi = &W[i * K], *ui = &U[i * V];
      const float *ki = &k[i * K], *vi = Vp + s.row_v(b, t0 + i, h), *egi = &eg[i * K], bi = beta[i];
#pragma omp simd
      for (int d = 0; d < K; ++d) wi[d] = bi * egi[d] * ki[d];
#pragma omp simd
      for (int e = 0; e < V; ++e) ui[e] = bi * vi[e];
      for (int j = 0; j < i; ++j) {
        const float a = A[i * C + j], *wj = &W[j * K], *uj = &U[j * V];
#pragma omp simd
        for (int d = 0; d < K; ++d) wi[d] -= a * wj[d];
#pragma omp simd
        for (int e = 0; e < V; ++e) ui[e] -= a * uj[e];
      }
    }
  }

  // Vn = U - W S.
  void values(const float* S) {
    std::memcpy(Vn.data(), U.data(), sizeof(float) * C * V);
    mm(false, false, C, V, K, -1.0f, W.data(), K, S, V, 1.0f, Vn.data(), V);
  }
};

// S' = exp(G_C) S + kt^T Vn, into `next` (which may be S).
static void advance(const Chunk& c, const float* S, float* next) {
  for (int d = 0; d < c.K; ++d) {
    const float e = c.elast[d];
    const float* s = S + (size_t)d * c.V;
    float* n = next + (size_t)d * c.V;
#pragma omp simd
    for (int x = 0; x < c.V; ++x) n[x] = e * s[x];
  }
  mm(true, false, c.K, c.V, c.C, 1.0f, c.kt.data(), c.K, c.Vn.data(), c.V, 1.0f, next, c.V);
}

static ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                          ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> s0,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> states,
                          ffi::ResultBuffer<ffi::F32> s_final, float scale, int64_t chunk, int64_t save_states,
                          int64_t threads) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_delta_rule: no sgemm set");
  Dims s;
  if (ffi::Error e = dims_of(q, v, chunk, s); e.failure()) return e;
  if (ffi::Error e = check(s, {q.dimensions(), k.dimensions(), g.dimensions()}, {v.dimensions(), out->dimensions()},
                           {s0.dimensions(), s_final->dimensions()}, {beta.dimensions()}, states->dimensions(),
                           save_states ? s.N : 0);
      e.failure())
    return e;
  const float *Q = q.typed_data(), *Kp = k.typed_data(), *Vp = v.typed_data(), *G = g.typed_data();
  const float *Bt = beta.typed_data(), *S0 = s0.typed_data();
  float *O = out->typed_data(), *St = states->typed_data(), *Sf = s_final->typed_data();
  const int units = s.B * s.H, ldv = s.H * s.V;
#pragma omp parallel num_threads(threads)
  {
    Chunk c(s.C, s.K, s.V);
    std::vector<float> local(save_states ? 0 : s.KV());
#pragma omp for schedule(dynamic)
    for (int u = 0; u < units; ++u) {
      const int b = u / s.H, h = u % s.H;
      float* fin = Sf + (size_t)u * s.KV();
      if (s.N == 0) {  // no tokens: the state passes through (and no state is saved)
        std::memcpy(fin, S0 + (size_t)u * s.KV(), sizeof(float) * s.KV());
        continue;
      }
      float* S = save_states ? St + (size_t)u * s.N * s.KV() : local.data();
      std::memcpy(S, S0 + (size_t)u * s.KV(), sizeof(float) * s.KV());
      for (int n = 0; n < s.N; ++n) {
        c.terms(s, Q, Kp, Vp, G, Bt, b, h, n * s.C, scale);
        c.values(S);
        float* o = O + s.row_v(b, n * s.C, h);  // O = qg S + Aqk Vn
        mm(false, false, s.C, s.V, s.K, 1.0f, c.qg.data(), s.K, S, s.V, 0.0f, o, ldv);
        mm(false, false, s.C, s.V, s.C, 1.0f, c.Aqk.data(), s.C, c.Vn.data(), s.V, 1.0f, o, ldv);
        float* next = !save_states ? S : n + 1 < s.N ? S + s.KV() : fin;
        advance(c, S, next);
        S = next;
      }
      if (!save_states) std::memcpy(fin, S, sizeof(float) * s.KV());
    }
  }
  return ffi::Error::Success();
}

// x = (I + A)^-T rhs for strictly lower A [C, C] (back substitution), rows of width n.
static void solve_upper_t(const std::vector<float>& A, int C, const float* rhs, float* x, int n) {
  for (int i = C - 1; i >= 0; --i) {
    float* xi = x + (size_t)i * n;
    std::memcpy(xi, rhs + (size_t)i * n, sizeof(float) * n);
    for (int j = i + 1; j < C; ++j) {
      const float a = A[j * C + i], *xj = x + (size_t)j * n;
#pragma omp simd
      for (int e = 0; e < n; ++e) xi[e] -= a * xj[e];
    }
  }
}

static ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                           ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> states,
                           ffi::Buffer<ffi::F32> dout, ffi::Buffer<ffi::F32> ds_final,
                           ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                           ffi::ResultBuffer<ffi::F32> dv, ffi::ResultBuffer<ffi::F32> dg,
                           ffi::ResultBuffer<ffi::F32> dbeta, ffi::ResultBuffer<ffi::F32> ds0, float scale,
                           int64_t chunk, int64_t threads) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("cpu_delta_rule: no sgemm set");
  Dims s;
  if (ffi::Error e = dims_of(q, v, chunk, s); e.failure()) return e;
  if (ffi::Error e = check(s, {q.dimensions(), k.dimensions(), g.dimensions(), dq->dimensions(), dk->dimensions(),
                               dg->dimensions()},
                           {v.dimensions(), dout.dimensions(), dv->dimensions()},
                           {ds_final.dimensions(), ds0->dimensions()}, {beta.dimensions(), dbeta->dimensions()},
                           states.dimensions(), s.N);
      e.failure())
    return e;
  const float *Q = q.typed_data(), *Kp = k.typed_data(), *Vp = v.typed_data(), *Gp = g.typed_data();
  const float *Bt = beta.typed_data(), *St = states.typed_data(), *DO = dout.typed_data();
  const float* DSf = ds_final.typed_data();
  float *dQ = dq->typed_data(), *dK = dk->typed_data(), *dV = dv->typed_data(), *dG = dg->typed_data();
  float *dB = dbeta->typed_data(), *dS0 = ds0->typed_data();
  const int units = s.B * s.H, C = s.C, K = s.K, V = s.V, ldv = s.H * s.V;
#pragma omp parallel num_threads(threads)
  {
    Chunk c(C, K, V);
    std::vector<float> dvn(C * V), dos(C * K), dkt(C * K), dw(C * K), drw(C * K), dru(C * V), daqk(C * C), da(C * C);
    std::vector<float> lq(C * K), lk(C * K), lg(C * K), dglast(K);  // d q (scaled), d k, d G of the chunk
#pragma omp for schedule(dynamic)
    for (int u = 0; u < units; ++u) {
      const int b = u / s.H, h = u % s.H;
      float* dS = dS0 + (size_t)u * s.KV();  // the carried state gradient, ds_final first
      std::memcpy(dS, DSf + (size_t)u * s.KV(), sizeof(float) * s.KV());
      for (int n = s.N - 1; n >= 0; --n) {
        const int t0 = n * C;
        const float* S = St + ((size_t)u * s.N + n) * s.KV();
        const float* do_ = DO + s.row_v(b, t0, h);
        c.terms(s, Q, Kp, Vp, Gp, Bt, b, h, t0, scale);
        c.values(S);
        // dVn = Aqk^T dO + kt dS';  dos = dO S^T;  dkt = Vn dS'^T;  dW = -dVn S^T;  dAqk = tril(dO Vn^T)
        mm(true, false, C, V, C, 1.0f, c.Aqk.data(), C, do_, ldv, 0.0f, dvn.data(), V);
        mm(false, false, C, V, K, 1.0f, c.kt.data(), K, dS, V, 1.0f, dvn.data(), V);
        mm(false, true, C, K, V, 1.0f, do_, ldv, S, V, 0.0f, dos.data(), K);
        mm(false, true, C, K, V, 1.0f, c.Vn.data(), V, dS, V, 0.0f, dkt.data(), K);
        mm(false, true, C, K, V, -1.0f, dvn.data(), V, S, V, 0.0f, dw.data(), K);
        mm(false, true, C, C, V, 1.0f, do_, ldv, c.Vn.data(), V, 0.0f, daqk.data(), C);
        // d exp(G_C) through the state: sum_v dS'_dv S_dv exp(G_C)
        for (int d = 0; d < K; ++d) {
          const float *sd = S + (size_t)d * V, *dsd = dS + (size_t)d * V;
          float t = 0.0f;
#pragma omp simd reduction(+ : t)
          for (int x = 0; x < V; ++x) t += dsd[x] * sd[x];
          dglast[d] = t * c.elast[d];
        }
        // dS = exp(G_C) dS' + qg^T dO - W^T dVn (in place: dS' is not used below)
        for (int d = 0; d < K; ++d) {
          const float e = c.elast[d];
          float* dsd = dS + (size_t)d * V;
#pragma omp simd
          for (int x = 0; x < V; ++x) dsd[x] *= e;
        }
        mm(true, false, K, V, C, 1.0f, c.qg.data(), K, do_, ldv, 1.0f, dS, V);
        mm(true, false, K, V, C, -1.0f, c.W.data(), K, dvn.data(), V, 1.0f, dS, V);
        solve_upper_t(c.A, C, dw.data(), drw.data(), K);
        solve_upper_t(c.A, C, dvn.data(), dru.data(), V);
        // dA = strict_lower(-(dRw W^T + dRu U^T))
        mm(false, true, C, C, K, -1.0f, drw.data(), K, c.W.data(), K, 0.0f, da.data(), C);
        mm(false, true, C, C, V, -1.0f, dru.data(), V, c.U.data(), V, 1.0f, da.data(), C);
        for (int i = 0; i < C; ++i) {
          const float *egi = &c.eg[i * K], *eki = &c.ek[i * K], *kti = &c.kt[i * K], *qi = &c.q[i * K];
          const float *ki = &c.k[i * K], *dosi = &dos[i * K], *dkti = &dkt[i * K], *drwi = &drw[i * K];
          float *dqi = &lq[i * K], *dki = &lk[i * K], *dgi = &lg[i * K];
          const float bi = c.beta[i];
          float db = 0.0f;
#pragma omp simd reduction(+ : db)
          for (int d = 0; d < K; ++d) {
            const float rw = drwi[d] * egi[d];
            dqi[d] = dosi[d] * egi[d];
            dki[d] = dkti[d] * eki[d] + rw * bi;
            dgi[d] = dosi[d] * qi[d] * egi[d] - dkti[d] * kti[d] + rw * bi * ki[d];
            db += rw * ki[d];
          }
          const float *drui = &dru[i * V], *vi = Vp + s.row_v(b, t0 + i, h);
          float* dvi = dV + s.row_v(b, t0 + i, h);
#pragma omp simd reduction(+ : db)
          for (int e = 0; e < V; ++e) {
            dvi[e] = drui[e] * bi;
            db += drui[e] * vi[e];
          }
          for (int j = 0; j < i; ++j) db += da[i * C + j] * c.M[i * C + j];
          dB[((size_t)b * s.T + t0 + i) * s.H + h] = db;
        }
        // The pairwise products' backward: P_ij = sum_d x_id k_jd E_ijd for (x, dP) = (k, beta_i dA_ij), j < i,
        // and (q, dAqk_ij), j <= i.
        for (int i = 0; i < C; ++i) {
          const float *gi = &c.G[i * K], *ki = &c.k[i * K], *qi = &c.q[i * K];
          float *dqi = &lq[i * K], *dki = &lk[i * K], *dgi = &lg[i * K];
          for (int j = 0; j < i; ++j) {
            const float pa = c.beta[i] * da[i * C + j], pq = daqk[i * C + j];
            const float *gj = &c.G[j * K], *kj = &c.k[j * K];
            float *dkj = &lk[j * K], *dgj = &lg[j * K];
#pragma omp simd
            for (int d = 0; d < K; ++d) {
              const float e = exp0(gi[d] - gj[d]), kje = kj[d] * e;
              const float xe = pa * ki[d] + pq * qi[d];
              const float t = xe * kje;  // d G_i, and minus d G_j
              dki[d] += pa * kje;
              dqi[d] += pq * kje;
              dkj[d] += xe * e;
              dgi[d] += t;
              dgj[d] -= t;
            }
          }
          const float pq = daqk[i * C + i];  // j = i: E = 1, and the decay's terms cancel
#pragma omp simd
          for (int d = 0; d < K; ++d) {
            dqi[d] += pq * ki[d];
            dki[d] += pq * qi[d];
          }
        }
        float* dgl = &lg[(C - 1) * K];
        for (int i = 0; i < C; ++i) {
          const float *dkti = &dkt[i * K], *kti = &c.kt[i * K];
#pragma omp simd
          for (int d = 0; d < K; ++d) dgl[d] += dkti[d] * kti[d];
        }
#pragma omp simd
        for (int d = 0; d < K; ++d) dgl[d] += dglast[d];
        // Out: dq of the unscaled q, dk, and dg = the reverse cumulative sum of dG within the chunk.
        for (int i = C - 1; i >= 0; --i) {
          const size_t r = s.row_k(b, t0 + i, h);
          float *dqo = dQ + r, *dko = dK + r, *dgo = dG + r, *dgi = &lg[i * K];
          const float *dqi = &lq[i * K], *dki = &lk[i * K];
          if (i + 1 < C) {
            const float* dgn = &lg[(i + 1) * K];
#pragma omp simd
            for (int d = 0; d < K; ++d) dgi[d] += dgn[d];
          }
#pragma omp simd
          for (int d = 0; d < K; ++d) {
            dqo[d] = scale * dqi[d];
            dko[d] = dki[d];
            dgo[d] = dgi[d];
          }
        }
      }
    }
  }
  return ffi::Error::Success();
}

template <typename B>
static auto with_attrs(B binding) {
  return std::move(binding).template Attr<float>("scale").template Attr<int64_t>("chunk");
}

// q, k, v, g, beta, s0 -> o, states, s_final
static auto forward_binding() {
  return with_attrs(f32_rets<3>(f32_args<6>(ffi::Ffi::Bind())))
      .template Attr<int64_t>("save_states")
      .template Attr<int64_t>("threads");
}
// q, k, v, g, beta, states, dout, ds_final -> dq, dk, dv, dg, dbeta, ds0
static auto backward_binding() {
  return with_attrs(f32_rets<6>(f32_args<8>(ffi::Ffi::Bind()))).template Attr<int64_t>("threads");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuDeltaRuleForward, Forward, forward_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxwmCpuDeltaRuleBackward, Backward, backward_binding());
