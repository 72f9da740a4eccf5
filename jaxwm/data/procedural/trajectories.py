"""Camera trajectory families of the procedural dataset (ViewRope App. C.3, ReWorld §4.3).

- ``rotate_loop``: rotate away and back about a fixed centre at constant angular speed,
  over any of the 7 combinations of yaw, pitch and roll; the return frame is exactly the
  start pose.
- ``free``: segments of RotateOnly, MoveOnly, MoveAndRotate and Orbit (ViewBench Part 2),
  kept inside the scene's camera zone.
- ``palindrome``: a ``free`` path followed by its exact reverse.
- walks (:data:`WALKS`, the translation eval family): ``forward``, ``backward``, ``sideways``,
  ``orbit`` (about a point ahead, looking at it) and ``move_rotate`` (forward while turning), at a
  fixed length, where parallax makes depth matter.

Camera-relative axes in the OpenCV basis: yaw about the camera's y (down) axis (positive
turns right), pitch about x (positive looks up, since ``R_x(a) z = (0, -sin a, cos a)``), roll about z (the optical axis). Poses
are ``[F, 4, 4]`` float64 camera-to-world in the scene's world frame (y down).
"""

import itertools

import numpy as np

from jaxwm.geometry.rotations import make_se3, rotation_about_axis

AXES = ("yaw", "pitch", "roll")
AXIS_COMBOS = tuple("+".join(c) for n in (1, 2, 3) for c in itertools.combinations(AXES, n))  # 7 combos
MAGNITUDES_DEG = (30.0, 45.0, 75.0, 90.0, 180.0)
FAMILIES = ("rotate_loop", "free", "palindrome")
SEGMENT_TYPES = ("RotateOnly", "MoveOnly", "MoveAndRotate", "Orbit")
WALKS = ("forward", "backward", "sideways", "orbit", "move_rotate")
WALK_LENGTH_M = 0.8  # path length of forward / backward / sideways walks (move_rotate: 0.6 of it)
ORBIT_DEG, ORBIT_RADIUS_M, MOVE_ROTATE_DEG = 40.0, 1.5, 30.0


def _camera_rotation(yaw, pitch, roll):
  """``R_y(yaw) R_x(pitch) R_z(roll)`` (camera-relative, OpenCV basis; see module doc)."""
  return rotation_about_axis(yaw, 1) @ rotation_about_axis(pitch, 0) @ rotation_about_axis(roll, 2)


def loop_profile(num_frames):
  """Triangular profile ``s(f)``: 0 -> 1 -> 0 at constant speed, then 0 (hold).

  Returns:
    ``(s [F] float64, return_frame)``: ``s`` is exactly 0 at frame 0 and at ``return_frame``.
  """
  n_away = (num_frames - 1) // 2
  if n_away < 1:
    raise ValueError(f"num_frames must be >= 3 for a loop; got {num_frames}")
  f = np.arange(num_frames)
  s = np.where(f <= n_away, f, np.maximum(2 * n_away - f, 0)) / n_away
  return s.astype(np.float64), 2 * n_away


def rotate_loop(start_c2w, axes, magnitude_deg, num_frames):
  """Rotate-away-rotate-back about the camera centre.

  Args:
    start_c2w: ``[4, 4]`` start pose.
    axes: one of :data:`AXIS_COMBOS`, e.g. ``"yaw+pitch"``; each named axis turns by the
      full magnitude at the far point.
    magnitude_deg: peak angle in degrees.
    num_frames: ``F``.

  Returns:
    ``(c2w [F, 4, 4], return_frame)``.
  """
  names = axes.split("+")
  if not names or any(a not in AXES for a in names):
    raise ValueError(f"axes must combine {AXES} with '+'; got {axes!r}")
  s, ret = loop_profile(num_frames)
  ang = np.radians(magnitude_deg) * s
  zero = np.zeros_like(ang)
  rel = _camera_rotation(*(ang if a in names else zero for a in AXES))
  c2w = np.repeat(np.asarray(start_c2w, np.float64)[None], num_frames, 0)
  c2w[:, :3, :3] = c2w[:, :3, :3] @ rel
  return c2w, ret


def start_pose(rng, zone):
  """A random upright start pose inside ``zone [2, 3]``: random heading, small pitch."""
  pos = rng.uniform(zone[0], zone[1])
  rot = rotation_about_axis(rng.uniform(0, 2 * np.pi), 1) @ rotation_about_axis(np.radians(rng.uniform(-12, 12)), 0)
  return make_se3(rot, pos)


def free_path(rng, start_c2w, zone, num_frames, min_segment=6, max_segment=20):
  """A random sequence of RotateOnly / MoveOnly / MoveAndRotate / Orbit segments.

  Orientation is tracked as world yaw, pitch (limited to +-40 deg) and roll (+-20 deg);
  translation happens in the horizontal plane (WASD) plus small vertical drift, and is
  clamped to ``zone`` so the camera stays in the room and clear of objects.

  Returns:
    ``(c2w [F, 4, 4], segments)`` with ``segments`` a list of ``(type, start_frame)``.
  """
  rot0 = np.asarray(start_c2w)[:3, :3]
  fwd = rot0[:, 2]
  yaw = np.arctan2(fwd[0], fwd[2])
  pitch = np.arcsin(np.clip(-fwd[1], -1, 1))
  roll = 0.0
  pos = np.asarray(start_c2w)[:3, 3].astype(np.float64)
  poses, segments = [], []
  seg_left, kind, rate, vel, orbit = 0, None, None, None, None
  for f in range(num_frames):
    if seg_left == 0:
      kind = SEGMENT_TYPES[rng.integers(len(SEGMENT_TYPES))]
      seg_left = int(rng.integers(min_segment, max_segment + 1))
      segments.append((kind, f))
      rate = np.radians([rng.uniform(-4, 4), rng.uniform(-1.5, 1.5),
                         rng.uniform(-1.5, 1.5) if rng.random() < 0.25 else 0.0])
      speed = rng.uniform(0.02, 0.06)
      heading = rng.choice([0.0, np.pi / 2, np.pi, -np.pi / 2, np.pi / 4, -np.pi / 4])
      vel = speed * np.array([np.sin(heading), rng.uniform(-0.15, 0.15), np.cos(heading)])
      if kind == "Orbit":
        radius = rng.uniform(1.0, 2.5)
        orbit = (pos + radius * np.array([np.sin(yaw), 0.0, np.cos(yaw)]), rng.choice([-1, 1]) * rng.uniform(1.5, 3.5))
    rot = _camera_rotation(yaw, pitch, roll)
    poses.append(make_se3(rot, pos))
    seg_left -= 1
    if kind in ("RotateOnly", "MoveAndRotate"):
      yaw += rate[0]
      pitch = np.clip(pitch + rate[1], np.radians(-40), np.radians(40))
      roll = np.clip(roll + rate[2], np.radians(-20), np.radians(20))
    if kind in ("MoveOnly", "MoveAndRotate"):
      c, s = np.cos(yaw), np.sin(yaw)
      step = np.array([c * vel[0] + s * vel[2], vel[1], -s * vel[0] + c * vel[2]])
      pos = np.clip(pos + step, zone[0], zone[1])
    if kind == "Orbit":
      centre, rate_deg = orbit
      a = np.radians(rate_deg)
      off = pos - centre
      off = np.array([np.cos(a) * off[0] + np.sin(a) * off[2], off[1], -np.sin(a) * off[0] + np.cos(a) * off[2]])
      new = np.clip(centre + off, zone[0], zone[1])
      if not np.allclose(new, centre + off):
        orbit = (centre, -rate_deg)  # bounce off the zone boundary
      pos, yaw = new, yaw + a
    roll *= 0.97 if kind not in ("RotateOnly", "MoveAndRotate") else 1.0
  return np.stack(poses), segments


def palindrome(path, num_frames):
  """A path followed by its exact reverse: ``path[:n] + path[n-2::-1]``, ``n = (F + 1) // 2``.

  For even ``F`` the last frame holds the start pose.

  Returns:
    ``(c2w [F, 4, 4], return_frame)`` with ``c2w[return_frame] == c2w[0]`` exactly.
  """
  n = (num_frames + 1) // 2
  if n < 2 or len(path) < n:
    raise ValueError(f"palindrome needs num_frames >= 3 and a path of >= {n} poses; got F={num_frames}, "
                     f"len(path)={len(path)}")
  out = np.concatenate([path[:n], path[n - 2::-1]])
  if len(out) < num_frames:
    out = np.concatenate([out, path[:1]])
  return out, 2 * n - 2


def walk(rng, zone, kind, num_frames):
  """A translation walk of :data:`WALKS` at constant speed, upright with a small random pitch, placed so that
  the whole path stays inside ``zone [2, 3]`` (the box kept clear of objects).

  In the heading frame (``z`` forward, ``x`` right): ``forward`` / ``backward`` move by
  ``+-WALK_LENGTH_M`` along ``z``; ``sideways`` by ``WALK_LENGTH_M`` along ``+x`` or ``-x``; ``orbit`` circles a point
  ``ORBIT_RADIUS_M`` ahead by ``+-ORBIT_DEG`` while looking at it; ``move_rotate`` moves ``0.6 WALK_LENGTH_M``
  forward while turning by ``+-MOVE_ROTATE_DEG``.

  Returns:
    ``c2w [F, 4, 4]`` float64.
  """
  if kind not in WALKS:
    raise ValueError(f"walk kind must be one of {WALKS}; got {kind!r}")
  s = np.linspace(0.0, 1.0, num_frames)
  heading = rng.uniform(0, 2 * np.pi)
  pitch = np.radians(rng.uniform(-8, 8))
  sign = rng.choice([-1.0, 1.0])
  zero = np.zeros_like(s)
  yaw = np.full_like(s, heading)
  if kind in ("forward", "backward"):
    rel = np.stack([zero, zero, (1 if kind == "forward" else -1) * WALK_LENGTH_M * s], -1)
  elif kind == "sideways":
    rel = np.stack([sign * WALK_LENGTH_M * s, zero, zero], -1)
  elif kind == "move_rotate":
    rel = np.stack([zero, zero, 0.6 * WALK_LENGTH_M * s], -1)
    yaw = heading + sign * np.radians(MOVE_ROTATE_DEG) * s
  else:  # orbit: the camera at centre - r (sin a, 0, cos a), a = heading + angle, looking at the centre
    a = sign * np.radians(ORBIT_DEG) * s
    rel = ORBIT_RADIUS_M * np.stack([-np.sin(a), zero, 1 - np.cos(a)], -1)
    yaw = heading + a
  offsets = rel @ rotation_about_axis(heading, 1).T  # heading frame -> world
  lo = np.asarray(zone[0]) - offsets.min(0)
  hi = np.asarray(zone[1]) - offsets.max(0)
  start = np.where(lo <= hi, rng.uniform(np.minimum(lo, hi), np.maximum(lo, hi)), (lo + hi) / 2)
  return np.stack([make_se3(_camera_rotation(y, pitch, 0.0), start + o) for y, o in zip(yaw, offsets)])
