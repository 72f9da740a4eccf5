"""Keys and mouse drags -> camera poses for interactive sessions (OpenCV camera: x right, y down, z forward).

Every motion is an increment in the current camera's own frame, applied once per generated frame:
``c2w_{n+1} = c2w_n @ [R | t]`` with

- keys ``w`` / ``s``: ``t = (0, 0, +-speed)`` (forward / back along the view direction);
  ``a`` / ``d``: ``t = (-+speed, 0, 0)`` (left / right); ``r`` / ``f``: ``t = (0, -+speed, 0)`` (up / down:
  up is ``-y``);
- ``left`` / ``right``: yaw ``R = R_y(-+turn)`` (turning right rotates the view direction ``z`` towards ``+x``);
  ``up`` / ``down``: pitch ``R = R_x(+-turn)`` (looking up rotates ``z`` towards ``-y``);
- a mouse drag of ``(dx, dy)`` pixels: yaw ``dx * mouse_deg`` and pitch ``-dy * mouse_deg`` degrees, spread over
  the chunk's frames (dragging right turns right, dragging up looks up).

``speed`` is in the model's translation units per frame (training divided its source's by
``data.scale_divisor``), ``turn`` in degrees per frame. :func:`return_path` flies back to a pose (frame 0's:
the loop-closure moment) by slerp of the rotation and a straight line of the translation.
"""

import dataclasses
import math

import numpy as np

from jaxwm.geometry.rotations import interpolate_poses, rotation_about_axis

KEYS = {  # key -> (translation direction in the camera frame, (yaw sign, pitch sign))
    "w": ((0, 0, 1), (0, 0)), "s": ((0, 0, -1), (0, 0)), "a": ((-1, 0, 0), (0, 0)), "d": ((1, 0, 0), (0, 0)),
    "r": ((0, -1, 0), (0, 0)), "f": ((0, 1, 0), (0, 0)),
    "left": ((0, 0, 0), (-1, 0)), "right": ((0, 0, 0), (1, 0)), "up": ((0, 0, 0), (0, 1)),
    "down": ((0, 0, 0), (0, -1)),
}


@dataclasses.dataclass(frozen=True)
class Controls:
  """Speeds of the increments (module doc): ``speed`` units and ``turn`` degrees per frame, ``mouse_deg``
  degrees per dragged pixel."""
  speed: float = 0.05
  turn: float = 5.0
  mouse_deg: float = 0.2

  def __post_init__(self):
    for name in ("speed", "turn", "mouse_deg"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"Controls.{name}={v!r}: must be a finite number >= 0")

  def increment(self, keys=(), drag=(0.0, 0.0), frames=1):
    """The per-frame ``[4, 4]`` increment for the held ``keys`` and a ``drag`` spread over ``frames``."""
    keys = tuple(keys)
    bad = [k for k in keys if k not in KEYS]
    if bad:
      raise ValueError(f"keys: {bad[0]!r} is not a control; the controls are {', '.join(KEYS)}")
    dx, dy = (float(v) for v in drag)
    if not (math.isfinite(dx) and math.isfinite(dy)):
      raise ValueError(f"drag={drag!r}: must be two finite numbers (pixels)")
    if not isinstance(frames, int) or frames < 1:
      raise ValueError(f"frames={frames!r}: must be an integer >= 1")
    move = np.sum([KEYS[k][0] for k in keys] or [(0, 0, 0)], axis=0).astype(np.float64)
    yaw = sum(KEYS[k][1][0] for k in keys) * self.turn + dx * self.mouse_deg / frames
    pitch = sum(KEYS[k][1][1] for k in keys) * self.turn - dy * self.mouse_deg / frames
    rot = (rotation_about_axis(np.radians(yaw), 1) @ rotation_about_axis(np.radians(pitch), 0))
    inc = np.eye(4)
    inc[:3, :3] = rot
    inc[:3, 3] = self.speed * move
    return inc

  def chunk(self, c2w, frames, keys=(), drag=(0.0, 0.0)):
    """The next ``frames`` poses ``[frames, 4, 4]`` from the current pose ``c2w [4, 4]``, the keys held and the
    drag spread over them."""
    inc = self.increment(keys, drag, frames)
    out, pose = [], np.asarray(c2w, np.float64)
    for _ in range(frames):
      pose = pose @ inc
      out.append(pose)
    return np.stack(out)


def return_path(c2w, target, frames):
  """``frames`` poses ``[frames, 4, 4]`` from ``c2w`` (excluded) to ``target`` (the last one, exactly): the
  rotation by slerp, the translation on a straight line, at even steps."""
  if not isinstance(frames, int) or frames < 1:
    raise ValueError(f"frames={frames!r}: must be an integer >= 1")
  alpha = np.arange(1, frames + 1, dtype=np.float64) / frames
  path = np.asarray(interpolate_poses(np.asarray(c2w, np.float64)[None], np.asarray(target, np.float64)[None],
                                      alpha))
  path[-1] = target
  return path
