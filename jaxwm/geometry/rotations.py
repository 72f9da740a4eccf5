"""Rotations and rigid transforms: axis-angle, minimal z-to-ray rotation, geodesic angle,
SE(3) compose/invert/interpolate, Euler ZYX.

All functions broadcast over leading dimensions and accept numpy (any float dtype, float64
for references) or jax arrays (traceable under jit).
"""

from jaxwm.geometry._xp import asarray, xp_of

_SMALL = 1e-6


def skew(v):
  """``[..., 3] -> [..., 3, 3]`` cross-product matrix, ``skew(a) @ b = a x b``."""
  xp = xp_of(v)
  v = asarray(xp, v)
  x, y, z = v[..., 0], v[..., 1], v[..., 2]
  o = xp.zeros_like(x)
  return xp.stack([xp.stack([o, -z, y], -1), xp.stack([z, o, -x], -1), xp.stack([-y, x, o], -1)], -2)


def axis_angle_to_matrix(aa):
  """Rodrigues' formula: ``[..., 3]`` axis * angle (radians) -> ``[..., 3, 3]`` rotation.

  ``R = I + sin(a)/a [w]x + (1 - cos a)/a^2 [w]x^2``, with Taylor terms near ``a = 0``.
  """
  xp = xp_of(aa)
  aa = asarray(xp, aa)
  theta2 = xp.sum(aa * aa, axis=-1)[..., None, None]
  small = theta2 < _SMALL**2 * 1e2
  safe2 = xp.where(small, 1.0, theta2)
  theta = xp.sqrt(safe2)
  a = xp.where(small, 1.0 - theta2 / 6.0, xp.sin(theta) / theta)
  b = xp.where(small, 0.5 - theta2 / 24.0, (1.0 - xp.cos(theta)) / safe2)
  k = skew(aa)
  eye = xp.eye(3, dtype=aa.dtype)
  return eye + a * k + b * (k @ k)


def matrix_to_axis_angle(rot):
  """``[..., 3, 3]`` rotation -> ``[..., 3]`` axis * angle with angle in ``[0, pi]``.

  Stable near 0 (via ``atan2`` of the skew part) and near ``pi`` (axis from the
  symmetric part ``(R + I) / 2 = a a^T`` there).
  """
  xp = xp_of(rot)
  rot = asarray(xp, rot)
  vee = xp.stack([rot[..., 2, 1] - rot[..., 1, 2], rot[..., 0, 2] - rot[..., 2, 0],
                  rot[..., 1, 0] - rot[..., 0, 1]], -1)  # 2 sin(a) * axis
  sin2 = xp.linalg.norm(vee, axis=-1)
  cos = (rot[..., 0, 0] + rot[..., 1, 1] + rot[..., 2, 2] - 1.0) / 2.0
  theta = xp.arctan2(sin2 / 2.0, cos)
  # Generic and small-angle branch: axis*angle = vee * theta / (2 sin theta).
  small = sin2 < 1e-6
  factor = xp.where(small, 0.5 + theta**2 / 12.0, theta / xp.where(small, 1.0, sin2))
  generic = vee * factor[..., None]
  # Near pi: a a^T = (sym(R) - cos I) / (1 - cos); take its dominant row, sign from vee.
  near_pi = cos < -0.9
  eye = xp.eye(3, dtype=rot.dtype)
  denom = xp.where(near_pi, 1.0 - cos, 1.0)[..., None, None]
  aat = ((rot + xp.swapaxes(rot, -1, -2)) / 2.0 - cos[..., None, None] * eye) / denom
  diag = xp.stack([aat[..., 0, 0], aat[..., 1, 1], aat[..., 2, 2]], -1)
  onehot = (xp.arange(3) == xp.argmax(diag, axis=-1)[..., None]).astype(rot.dtype)
  row = xp.sum(aat * onehot[..., :, None], axis=-2)
  axis = row / xp.sqrt(xp.maximum(xp.sum(diag * onehot, -1), 1e-12))[..., None]
  sign = xp.where(xp.sum(axis * vee, -1) < 0, -1.0, 1.0)
  return xp.where(near_pi[..., None], axis * (sign * theta)[..., None], generic)


def rotation_z_to(r):
  """Minimal rotation taking ``z = [0, 0, 1]`` to the unit vector ``r``: ``[..., 3] -> [..., 3, 3]``.

  ViewRope's ``R_local`` (Eq. 6): rotation about ``z x r`` by ``acos(z . r)``. Closed form
  ``I + [v]x + [v]x^2 / (1 + c)`` with ``v = z x r = (-r_y, r_x, 0)`` and ``c = r_z``; exact
  identity at ``r = z``. Undefined for ``r = -z`` (never in front of a pinhole camera): the
  denominator is clamped there.
  """
  xp = xp_of(r)
  r = asarray(xp, r)
  x, y, c = r[..., 0], r[..., 1], r[..., 2]
  inv = 1.0 / xp.maximum(1.0 + c, 1e-12)
  rows = [
      xp.stack([1.0 - x * x * inv, -x * y * inv, x], -1),
      xp.stack([-x * y * inv, 1.0 - y * y * inv, y], -1),
      xp.stack([-x, -y, c], -1),
  ]
  return xp.stack(rows, -2)


def geodesic_angle(r1, r2=None):
  """Angle (radians, ``[0, pi]``) of ``r1^T r2`` (or of ``r1`` alone): ``[..., 3, 3] -> [...]``.

  Uses ``atan2(|vee(M - M^T)| / 2, (tr M - 1) / 2)``, accurate near 0 and near pi.
  """
  xp = xp_of(r1, r2)
  m = asarray(xp, r1)
  if r2 is not None:
    m = xp.swapaxes(m, -1, -2) @ asarray(xp, r2)
  vee = xp.stack([m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]], -1)
  cos = (m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2] - 1.0) / 2.0
  return xp.arctan2(xp.linalg.norm(vee, axis=-1) / 2.0, cos)


def make_se3(rot, trans):
  """``[..., 3, 3]``, ``[..., 3]`` -> ``[..., 4, 4]`` homogeneous transform."""
  xp = xp_of(rot, trans)
  rot, trans = asarray(xp, rot), asarray(xp, trans)
  top = xp.concatenate([rot, trans[..., :, None]], -1)
  bottom = xp.broadcast_to(xp.asarray([0.0, 0.0, 0.0, 1.0], dtype=top.dtype), top.shape[:-2] + (1, 4))
  return xp.concatenate([top, bottom], -2)


def se3_inverse(t):
  """Closed-form inverse of ``[..., 4, 4]`` rigid transforms: ``[R^T, -R^T t]``."""
  xp = xp_of(t)
  t = asarray(xp, t)
  rot_t = xp.swapaxes(t[..., :3, :3], -1, -2)
  return make_se3(rot_t, -(rot_t @ t[..., :3, 3:4])[..., 0])


def se3_compose(a, b):
  """``a @ b`` for ``[..., 4, 4]`` rigid transforms (apply ``b`` first)."""
  xp = xp_of(a, b)
  return asarray(xp, a) @ asarray(xp, b)


def slerp_rotation(r0, r1, alpha):
  """Geodesic interpolation ``R0 exp(alpha log(R0^T R1))``; ``alpha`` broadcasts against ``[...]``."""
  xp = xp_of(r0, r1, alpha)
  r0, r1 = asarray(xp, r0), asarray(xp, r1)
  alpha = asarray(xp, alpha)
  delta = matrix_to_axis_angle(xp.swapaxes(r0, -1, -2) @ r1)
  return r0 @ axis_angle_to_matrix(delta * alpha[..., None])


def interpolate_poses(t0, t1, alpha):
  """Interpolates ``[..., 4, 4]`` poses: rotation slerp, translation lerp, at ``alpha`` in ``[0, 1]``."""
  xp = xp_of(t0, t1, alpha)
  t0, t1, alpha = asarray(xp, t0), asarray(xp, t1), asarray(xp, alpha)
  rot = slerp_rotation(t0[..., :3, :3], t1[..., :3, :3], alpha)
  trans = (1.0 - alpha[..., None]) * t0[..., :3, 3] + alpha[..., None] * t1[..., :3, 3]
  return make_se3(rot, trans)


def downsample_poses(c2w, factor):
  """``[F, 4, 4] -> [F // factor, 4, 4]``: each group of ``factor`` poses becomes one, SE(3)-aware
  (ReWorld App. A.2): translations averaged, rotations averaged on the manifold (the chordal mean,
  projected back onto SO(3) by SVD), never the arithmetic mean of matrices, which is singular
  across a palindrome's mirror point."""
  xp = xp_of(c2w)
  c2w = asarray(xp, c2w)
  f = (c2w.shape[0] // factor) * factor
  g = c2w[:f].reshape((f // factor, factor, 4, 4))
  m = g[:, :, :3, :3].mean(axis=1)
  u, _, vt = xp.linalg.svd(m)
  d = xp.sign(xp.linalg.det(u @ vt))
  fix = xp.concatenate([xp.ones(d.shape + (2,), dtype=m.dtype), d[..., None]], -1)
  rot = (u * fix[:, None, :]) @ vt
  return make_se3(rot, g[:, :, :3, 3].mean(axis=1))


def _axis_rotation(xp, angle, axis):
  c, s = xp.cos(angle), xp.sin(angle)
  o, l = xp.zeros_like(angle), xp.ones_like(angle)
  if axis == 0:
    rows = [[l, o, o], [o, c, -s], [o, s, c]]
  elif axis == 1:
    rows = [[c, o, s], [o, l, o], [-s, o, c]]
  else:
    rows = [[c, -s, o], [s, c, o], [o, o, l]]
  return xp.stack([xp.stack(r, -1) for r in rows], -2)


def rotation_about_axis(angle, axis):
  """Rotation by ``angle`` (radians, ``[...]``) about coordinate axis 0 (x), 1 (y) or 2 (z)."""
  if axis not in (0, 1, 2):
    raise ValueError(f"axis must be 0 (x), 1 (y) or 2 (z); got {axis!r}")
  xp = xp_of(angle)
  return _axis_rotation(xp, asarray(xp, angle), axis)


def euler_zyx_to_matrix(yaw, pitch, roll):
  """``R = R_z(yaw) R_y(pitch) R_x(roll)`` (the ViewBench convention, App. C.4); radians."""
  xp = xp_of(yaw, pitch, roll)
  yaw, pitch, roll = (asarray(xp, a) for a in (yaw, pitch, roll))
  return _axis_rotation(xp, yaw, 2) @ _axis_rotation(xp, pitch, 1) @ _axis_rotation(xp, roll, 0)


def matrix_to_euler_zyx(rot):
  """Inverse of :func:`euler_zyx_to_matrix`: ``[..., 3, 3] -> (yaw, pitch, roll)``.

  ``pitch`` in ``[-pi/2, pi/2]``; at gimbal lock (``|pitch| = pi/2``) roll is set to 0.
  """
  xp = xp_of(rot)
  rot = asarray(xp, rot)
  sp = xp.clip(-rot[..., 2, 0], -1.0, 1.0)
  pitch = xp.arcsin(sp)
  lock = xp.abs(sp) > 1.0 - 1e-7
  yaw = xp.where(lock, xp.arctan2(-rot[..., 0, 1], rot[..., 1, 1]), xp.arctan2(rot[..., 1, 0], rot[..., 0, 0]))
  roll = xp.where(lock, 0.0, xp.arctan2(rot[..., 2, 1], rot[..., 2, 2]))
  return yaw, pitch, roll

