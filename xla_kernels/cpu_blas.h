// The BLAS sgemm that the C++ kernels (xla_kernels/*.cc) multiply with: scipy's OpenBLAS, whose address Python hands
// to each library's setter (cpu_build.scipy_sgemm), and a row-major product on top of it.
#pragma once

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);

// This library's `sgemm` (null until set) and its exported setter `setter(void*)`.
#define JAXWM_SGEMM(setter)      \
  static sgemm_t sgemm = nullptr; \
  extern "C" void setter(void* p) { sgemm = (sgemm_t)p; }

// Row-major c [m, n] = alpha op(a) op(b) + beta c (op: transpose where ta / tb) by the column-major `f`: a row-major
// [r, c] matrix with row stride ld is, column-major, its transpose.
static inline void rowmajor_mm(sgemm_t f, bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                               const float* b, int ldb, float beta, float* c, int ldc) {
  f(tb ? "T" : "N", ta ? "T" : "N", &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}
