"""The attention kernel's softmax rows (``xla_kernels/cpu_attention.cc``, ``cpu_math.h``) piece by piece, one thread.

  python benchmarks/cpu_softmax.py                        # 960 rows of 960 keys (a batch and head of the default)
  python benchmarks/cpu_softmax.py --rows 576 --keys 576 --repeats 50

Times, best of ``--repeats`` over the whole matrix (ms):
- the row maximum as an ``omp simd`` reduction written with ``std::max`` (the kernel until 2026-12-06: g++ leaves
  it scalar) and ``cpu_math.h``'s ``row_max``, written ``s > m ? s : m`` (now: vectorised);
- ``exp_row`` (the exponentials and their sum);
- the pass that divided every probability by its row sum (the kernel until 2026-12-06; now the output is divided).

:func:`build` makes the small library these run in, with the kernels' flags (``tests/test_cpu_math.py`` uses it
too).
"""

import argparse
import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from timing import run_times  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from xla_kernels import cpu_build  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = """
#include <algorithm>
#include <cfloat>
#include <cstddef>
#include "cpu_math.h"
extern "C" float exp_row_c(const float* in, float shift, const uint8_t* keep, float* out, int n) {
  return exp_row(in, shift, keep, out, n);
}
extern "C" float exp_rows(const float* in, const float* shift, float* out, int rows, int n) {
  float total = 0.0f;
  for (int i = 0; i < rows; ++i) total += exp_row(in + (size_t)i * n, shift[i], nullptr, out + (size_t)i * n, n);
  return total;
}
extern "C" float max_std(const float* s, float* out, int rows, int n) {
  for (int i = 0; i < rows; ++i) {
    const float* r = s + (size_t)i * n;
    float mx = -FLT_MAX;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; ++j) mx = std::max(mx, r[j]);
    out[i] = mx;
  }
  return out[0];
}
extern "C" float max_rows(const float* s, float* out, int rows, int n) {
  for (int i = 0; i < rows; ++i) out[i] = row_max(s + (size_t)i * n, n);
  return out[0];
}
extern "C" void scale_rows(float* s, const float* c, int rows, int n) {
  for (int i = 0; i < rows; ++i) {
    float* r = s + (size_t)i * n;
#pragma omp simd
    for (int j = 0; j < n; ++j) r[j] *= c[i];
  }
}
"""


def build(directory):
  """``ctypes.CDLL`` of ``exp_row_c`` (``exp_row`` of one row), ``exp_rows`` (of many), ``max_std``,
  ``max_rows`` (``row_max``) and ``scale_rows``, built with g++ in ``directory``."""
  d = pathlib.Path(directory)
  (d / "rows.cc").write_text(_ROWS)
  subprocess.run(["g++", *cpu_build.FLAGS, f"-I{cpu_build.HERE}", str(d / "rows.cc"), "-o", str(d / "lib.so")],
                 check=True, capture_output=True)
  lib = ctypes.CDLL(str(d / "lib.so"))
  ptr, f32, i32 = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
  lib.exp_row_c.restype, lib.exp_row_c.argtypes = f32, [ptr, f32, ptr, ptr, i32]
  lib.exp_rows.restype, lib.exp_rows.argtypes = f32, [ptr, ptr, ptr, i32, i32]
  for fn in ("max_std", "max_rows"):
    getattr(lib, fn).restype, getattr(lib, fn).argtypes = f32, [ptr, ptr, i32, i32]
  lib.scale_rows.argtypes = [ptr, ptr, i32, i32]
  return lib


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", type=int, default=960)
  p.add_argument("--keys", type=int, default=960)
  p.add_argument("--repeats", type=int, default=30)
  a = p.parse_args()
  if min(a.rows, a.keys, a.repeats) < 1:
    p.error(f"--rows {a.rows}, --keys {a.keys}, --repeats {a.repeats}: each must be >= 1")
  with tempfile.TemporaryDirectory() as d:
    lib = build(d)
    s = np.random.default_rng(0).normal(0, 3, (a.rows, a.keys)).astype(np.float32)
    out, mx = np.empty_like(s), np.empty(a.rows, np.float32)
    lib.max_rows(s.ctypes.data, mx.ctypes.data, a.rows, a.keys)
    inv = np.full(a.rows, 0.01, np.float32)
    ptr = lambda x: x.ctypes.data  # pylint: disable=unnecessary-lambda-assignment
    rows = {
        "row maximum, `std::max` (before)": lambda: lib.max_std(ptr(s), ptr(mx), a.rows, a.keys),
        "row maximum, `row_max`: `s > m ? s : m` (now)": lambda: lib.max_rows(ptr(s), ptr(mx), a.rows, a.keys),
        "`exp_row` (exponentials and their sum)": lambda: lib.exp_rows(ptr(s), ptr(mx), ptr(out), a.rows, a.keys),
        "normalising every probability (before; now the output rows)": lambda: lib.scale_rows(ptr(out), ptr(inv),
                                                                                             a.rows, a.keys),
    }
    print(f"{a.rows} rows of {a.keys} keys, one thread, best of {a.repeats} (ms)\n")
    print("| piece | ms |\n| --- | --- |")
    for name, fn in rows.items():
      print(f"| {name} | {min(run_times(fn, a.repeats)) * 1e3:.3f} |")


if __name__ == "__main__":
  main()
