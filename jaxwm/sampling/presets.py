"""Named camera trajectories for ``sample.py --preset`` (rotate-away-rotate-back loops)."""

import re

import numpy as np

from jaxwm.data.procedural.clips import pinhole_intrinsics
from jaxwm.data.procedural.trajectories import AXES, rotate_loop

PRESET_HELP = "NAME<deg>, NAME one of yaw, pitch, roll or a '+' combination, e.g. yaw90, yaw+pitch45, roll30"


def preset_trajectory(name, num_frames, image_hw, fov_deg=70.0):
  """A rotate-away-rotate-back loop from the identity pose, e.g. ``"yaw90"``.

  Returns:
    ``(c2w [F, 4, 4] float32, intrinsics [F, 3, 3] float32, return_frame)``.
  """
  m = re.fullmatch(r"((?:yaw|pitch|roll)(?:\+(?:yaw|pitch|roll))*)(\d+(?:\.\d+)?)", name)
  if not m or len(set(m.group(1).split("+"))) != len(m.group(1).split("+")):
    raise ValueError(f"unknown preset {name!r}; expected {PRESET_HELP}")
  axes = "+".join(a for a in AXES if a in m.group(1).split("+"))
  c2w, ret = rotate_loop(np.eye(4), axes, float(m.group(2)), num_frames)
  k = np.repeat(pinhole_intrinsics(image_hw, fov_deg)[None], num_frames, 0)
  return c2w.astype(np.float32), k, ret
