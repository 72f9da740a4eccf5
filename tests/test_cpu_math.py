"""``xla_kernels/cpu_math.h``'s ``exp_row`` (the attention kernel's softmax exponentials): its AVX-512 form and its
generic form (``-DJAXWM_GENERIC_SIMD``), built side by side into one small library, give the same bits for every
entry, ``exp_nonpositive``'s, within a few float32 ulps of float64's ``exp``; masked and out-of-range entries are 0,
NaN stays NaN, and nothing past ``n`` is written. On a host without AVX-512 both are the generic form, and the test
still holds that form against float64."""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from xla_kernels import cpu_build

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="builds a C++ test library with g++")

_WRAP = """
#include "cpu_math.h"
extern "C" float exp_row_{name}(const float* in, float shift, const uint8_t* keep, float* out, int n) {{
  return exp_row(in, shift, keep, out, n);
}}
extern "C" int avx512_{name}() {{
#ifdef JAXWM_EXP_ROW_AVX512
  return 1;
#else
  return 0;
#endif
}}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  d = tmp_path_factory.mktemp("cpu_math")
  (d / "generic.cc").write_text("#define JAXWM_GENERIC_SIMD\n" + _WRAP.format(name="generic"))
  (d / "native.cc").write_text(_WRAP.format(name="native"))
  flags = [f for f in cpu_build.FLAGS if f != "-shared"]
  subprocess.run(["g++", *flags, "-shared", f"-I{cpu_build.HERE}", str(d / "generic.cc"), str(d / "native.cc"),
                  "-o", str(d / "lib.so")], check=True, capture_output=True)
  out = ctypes.CDLL(str(d / "lib.so"))
  for name in ("generic", "native"):
    fn = getattr(out, f"exp_row_{name}")
    fn.restype = ctypes.c_float
    fn.argtypes = [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
  assert out.avx512_generic() == 0
  return out


def _run(fn, x, shift, keep, guard=7, in_place=False):
  """``(out, sum)`` of ``fn`` on float32 ``x`` (``keep``: uint8 or None); ``guard`` sentinel entries past ``n``
  must come back untouched."""
  n = x.size
  buf = np.full(n + guard, 12345.0, np.float32)
  x = np.ascontiguousarray(x, np.float32)
  if in_place:
    buf[:n] = x
  keep_ptr = None if keep is None else np.ascontiguousarray(keep, np.uint8).ctypes.data
  src = buf.ctypes.data if in_place else x.ctypes.data
  total = fn(src, np.float32(shift), keep_ptr, buf.ctypes.data, n)
  np.testing.assert_array_equal(buf[n:], 12345.0)
  return buf[:n].copy(), float(total)


def _rows():
  rng = np.random.default_rng(0)
  edge = np.array([0.0, -0.0, -1e-30, -87.0, np.nextafter(np.float32(-87), np.float32(0)),
                   np.nextafter(np.float32(-87), np.float32(-100)), -86.99, -87.5, -88.0, -103.9, -150.0,
                   -3.4e38, -np.inf, np.nan], np.float32)
  grid = np.linspace(-120, 0, 4001, dtype=np.float32)
  for n in (0, 1, 15, 16, 17, 31, 32, 33, 63, 960, 1001):
    x = rng.uniform(-30, 0, n).astype(np.float32)
    x[:min(n, edge.size)] = edge[:min(n, edge.size)]
    yield n, x
  yield grid.size, grid


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shift", [0.0, 3.25])
def test_both_forms_give_the_same_bits_near_float64(lib, masked, shift):
  rng = np.random.default_rng(1)
  for n, x in _rows():
    keep = (rng.uniform(size=n) < 0.6).astype(np.uint8) * rng.integers(1, 255, n).astype(np.uint8) if masked \
        else None
    inp = (x + np.float32(shift)).astype(np.float32)  # exp_row subtracts shift again
    got = {}
    for name in ("generic", "native"):
      got[name] = _run(getattr(lib, f"exp_row_{name}"), inp, shift, keep)
    (g, gs), (nv, ns) = got["generic"], got["native"]
    np.testing.assert_array_equal(g.view(np.uint32)[~np.isnan(g)], nv.view(np.uint32)[~np.isnan(g)])
    np.testing.assert_array_equal(np.isnan(g), np.isnan(nv))
    arg = (inp - np.float32(shift)).astype(np.float64)  # the float32 difference the kernel exponentiates
    want = np.where(arg < -87, 0.0, np.exp(arg))
    if keep is not None:
      want = np.where(keep != 0, want, 0.0)
      assert np.all(nv[keep == 0] == 0)
    live = ~np.isnan(want)
    np.testing.assert_allclose(nv[live], want[live], rtol=4e-7, atol=0)
    nan = np.isnan(arg) if keep is None else np.isnan(arg) & (keep != 0)
    assert np.array_equal(np.isnan(nv), nan)
    if nan.any():
      assert np.isnan(gs) and np.isnan(ns)
    else:
      np.testing.assert_allclose([gs, ns], want.sum(), rtol=2e-6)


def test_in_place_and_the_host_form(lib):
  x = np.linspace(-40, 0, 1001, dtype=np.float32)
  for name in ("generic", "native"):
    fn = getattr(lib, f"exp_row_{name}")
    np.testing.assert_array_equal(_run(fn, x, 0.0, None, in_place=True)[0], _run(fn, x, 0.0, None)[0])
  host = cpu_build.host_cpu()
  has = all(f" {flag}" in host or f" {flag}\n" in host for flag in ("avx512f", "avx512bw", "avx512vl"))
  assert lib.avx512_native() == int(has), host
