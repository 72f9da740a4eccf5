"""Camera validation shared by every public entry point that takes cameras."""

import numpy as np

ORTHONORMAL_ATOL = 1e-4  # max |R^T R - I| entry and |det R - 1|.


def _is_concrete(x):
  try:
    np.asarray(x)
    return True
  except Exception:  # jax tracers under jit  # pylint: disable=broad-except
    return False


def validate_cameras(c2w, intrinsics=None, *, atol=ORTHONORMAL_ATOL, name="c2w"):
  """Checks camera-to-world poses (and intrinsics) and raises ``ValueError`` naming the problem.

  Checks, in order: shapes (``c2w [..., F, 4, 4]``, ``intrinsics [..., F, 3, 3]`` with the
  same leading shape), finiteness, orthonormal rotation (``max |R^T R - I| <= atol``),
  ``det R = +1`` (within ``atol``), last row ``[0, 0, 0, 1]``, positive focal lengths.
  The error names the frame index (flattened over leading dimensions as ``(b, f)``).

  Value checks need concrete arrays; under ``jit`` (tracers) only shapes are checked.

  Returns:
    None.
  """
  shape = tuple(np.shape(c2w))
  if len(shape) < 2 or shape[-2:] != (4, 4):
    raise ValueError(f"{name} must have shape [..., 4, 4]; got shape {shape}")
  if intrinsics is not None:
    kshape = tuple(np.shape(intrinsics))
    if len(kshape) < 2 or kshape[-2:] != (3, 3):
      raise ValueError(f"intrinsics must have shape [..., 3, 3]; got shape {kshape}")
    if kshape[:-2] != shape[:-2]:
      raise ValueError(f"intrinsics leading shape {kshape[:-2]} does not match {name} leading shape {shape[:-2]}")
  if not _is_concrete(c2w) or (intrinsics is not None and not _is_concrete(intrinsics)):
    return
  lead = shape[:-2]
  t = np.asarray(c2w, dtype=np.float64).reshape((-1, 4, 4))

  def where(i):
    return f"frame {tuple(int(j) for j in np.unravel_index(i, lead)) if len(lead) > 1 else i}"

  def fail(mask, what, arg=name):
    bad = np.flatnonzero(mask)
    if bad.size:
      i = int(bad[0])
      raise ValueError(f"{arg} at {where(i)}: {what(i)} ({bad.size} bad frame(s) in total)")

  fail(~np.isfinite(t).all(axis=(1, 2)), lambda i: f"non-finite values {t[i].tolist()}")
  rot = t[:, :3, :3]
  ortho_err = np.abs(np.swapaxes(rot, 1, 2) @ rot - np.eye(3)).max(axis=(1, 2))
  fail(ortho_err > atol, lambda i: f"rotation is not orthonormal (max |R^T R - I| = {ortho_err[i]:.3g} > atol {atol})")
  det = np.linalg.det(rot)
  fail(np.abs(det - 1.0) > atol, lambda i: f"rotation determinant is {det[i]:.6g}, expected +1 (a reflection?)")
  last = np.abs(t[:, 3] - np.array([0.0, 0.0, 0.0, 1.0])).max(axis=1)
  fail(last > atol, lambda i: f"last row is {t[i, 3].tolist()}, expected [0, 0, 0, 1]")
  if intrinsics is not None:
    k = np.asarray(intrinsics, dtype=np.float64).reshape((-1, 3, 3))
    fail(~np.isfinite(k).all(axis=(1, 2)), lambda i: f"non-finite values {k[i].tolist()}", "intrinsics")
    fail((k[:, 0, 0] <= 0) | (k[:, 1, 1] <= 0),
         lambda i: f"non-positive focal length fx={k[i, 0, 0]:.6g}, fy={k[i, 1, 1]:.6g}", "intrinsics")
    fail(np.abs(k[:, 2] - np.array([0.0, 0.0, 1.0])).max(axis=1) > atol,
         lambda i: f"last row is {k[i, 2].tolist()}, expected [0, 0, 1]", "intrinsics")
