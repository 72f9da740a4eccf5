"""``xla_kernels/cpu_math.h``'s softmax-row pieces, built into a small library by ``benchmarks/cpu_softmax.py``
with the kernels' flags: ``exp_row`` (the attention kernel's exponentials and their sum) against float64's ``exp``
over masks, NaN, ``-inf``, the ``-87`` cut-off, every tail length and in-place use, and nothing written past the row;
``row_max`` against numpy's maximum, a NaN skipped."""

import os
import shutil
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="builds a C++ test library with g++")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  import cpu_softmax  # pylint: disable=g-import-not-at-top
  return cpu_softmax.build(tmp_path_factory.mktemp("cpu_math"))


def _run(lib, x, shift, keep, guard=7, in_place=False):
  """``(out, sum)`` of ``exp_row`` on float32 ``x`` (``keep``: uint8 or None); ``guard`` sentinel entries past
  ``n`` must come back untouched."""
  n = x.size
  buf = np.full(n + guard, 12345.0, np.float32)
  x = np.ascontiguousarray(x, np.float32)
  if in_place:
    buf[:n] = x
  keep_ptr = None if keep is None else np.ascontiguousarray(keep, np.uint8).ctypes.data
  total = lib.exp_row_c(buf.ctypes.data if in_place else x.ctypes.data, np.float32(shift), keep_ptr, buf.ctypes.data,
                        n)
  np.testing.assert_array_equal(buf[n:], 12345.0)
  return buf[:n].copy(), float(total)


def _rows():
  rng = np.random.default_rng(0)
  edge = np.array([0.0, -0.0, -1e-30, -87.0, np.nextafter(np.float32(-87), np.float32(0)),
                   np.nextafter(np.float32(-87), np.float32(-100)), -86.99, -87.5, -88.0, -103.9, -150.0,
                   -3.4e38, -np.inf, np.nan], np.float32)
  for n in (0, 1, 15, 16, 17, 31, 32, 33, 63, 960, 1001):
    x = rng.uniform(-30, 0, n).astype(np.float32)
    x[:min(n, edge.size)] = edge[:min(n, edge.size)]
    yield x
  yield np.linspace(-120, 0, 4001, dtype=np.float32)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shift", [0.0, 3.25])
def test_exp_row_matches_float64(lib, masked, shift):
  rng = np.random.default_rng(1)
  for x in _rows():
    n = x.size
    keep = ((rng.uniform(size=n) < 0.6) * rng.integers(1, 255, n)).astype(np.uint8) if masked else None
    inp = (x + np.float32(shift)).astype(np.float32)  # exp_row subtracts shift again
    out, total = _run(lib, inp, shift, keep)
    arg = (inp - np.float32(shift)).astype(np.float64)  # the float32 difference the kernel exponentiates
    want = np.where(arg < -87, 0.0, np.exp(arg))
    if keep is not None:
      want = np.where(keep != 0, want, 0.0)
      assert np.all(out[keep == 0] == 0)
    live = ~np.isnan(want)
    np.testing.assert_allclose(out[live], want[live], rtol=4e-7, atol=0)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    if nan.any():
      assert np.isnan(total)
    else:
      np.testing.assert_allclose(total, want.sum(), rtol=2e-6)


def test_in_place_and_row_max(lib):
  x = np.linspace(-40, 0, 1001, dtype=np.float32)
  np.testing.assert_array_equal(_run(lib, x, 0.0, None, in_place=True)[0], _run(lib, x, 0.0, None)[0])
  rng = np.random.default_rng(2)
  for n in (1, 15, 16, 17, 33, 960):
    s = rng.normal(0, 5, (3, n)).astype(np.float32)
    s[1, n // 2] = np.nan  # skipped
    got = np.empty(3, np.float32)
    lib.max_rows(s.ctypes.data, got.ctypes.data, 3, n)
    want = np.where(np.isnan(s[:, 0]), np.finfo(np.float32).min, s[:, 0]) if n == 1 else np.nanmax(s, axis=1)
    np.testing.assert_array_equal(got, want)
  empty = np.empty(0, np.float32)
  lib.max_rows(empty.ctypes.data, got.ctypes.data, 1, 0)
  assert got[0] == np.finfo(np.float32).min
