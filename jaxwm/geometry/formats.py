"""Converters for the camera files users bring, to OpenCV camera-to-world.

- RealEstate10K: a text file whose first line is the video URL, then one line per frame:
  ``timestamp fx fy cx cy 0 0`` followed by the 12 entries of a row-major 3x4
  world-to-camera matrix (OpenCV basis), intrinsics normalised by the image size.
- OpenGL / Blender: 4x4 camera-to-world matrices with camera axes x right, y up, z back
  (e.g. the ``transform_matrix`` entries of a NeRF ``transforms.json``).
"""

import json
import math

import numpy as np

from jaxwm.geometry.rotations import se3_inverse
from jaxwm.geometry.validate import validate_cameras

# OpenGL camera axes (x right, y up, z back) -> OpenCV (x right, y down, z forward).
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def opengl_to_opencv(c2w_gl):
  """``[..., 4, 4]`` OpenGL/Blender camera-to-world -> OpenCV camera-to-world (``c2w @ diag(1,-1,-1,1)``)."""
  return np.asarray(c2w_gl, dtype=np.float64) @ GL_TO_CV


def opencv_to_opengl(c2w_cv):
  """Inverse of :func:`opengl_to_opencv` (the flip is its own inverse)."""
  return np.asarray(c2w_cv, dtype=np.float64) @ GL_TO_CV


def parse_realestate10k(text_or_lines, image_hw):
  """Parses a RealEstate10K camera file.

  Args:
    text_or_lines: the file's text, or an iterable of its lines. Lines that are not 19
      numbers (the URL header, blanks) are skipped.
    image_hw: ``(H, W)`` of the frames the intrinsics will be used at.

  Returns:
    dict with ``timestamps [F]`` (int64, microseconds), ``c2w [F, 4, 4]`` (float64,
    OpenCV) and ``intrinsics [F, 3, 3]`` (float64, pixels of ``image_hw``).
  """
  lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else list(text_or_lines)
  rows = []
  for n, line in enumerate(lines):
    parts = line.split()
    if len(parts) != 19:
      if n == 0 or not parts:
        continue
      raise ValueError(f"RealEstate10K line {n + 1} has {len(parts)} fields, expected 19: {line[:80]!r}")
    try:
      rows.append([float(p) for p in parts])
    except ValueError as e:
      raise ValueError(f"RealEstate10K line {n + 1} is not numeric: {line[:80]!r}") from e
  if not rows:
    raise ValueError("RealEstate10K input has no camera lines")
  a = np.asarray(rows, dtype=np.float64)
  h, w = image_hw
  f = a.shape[0]
  k = np.zeros((f, 3, 3))
  k[:, 0, 0], k[:, 1, 1] = a[:, 1] * w, a[:, 2] * h
  k[:, 0, 2], k[:, 1, 2] = a[:, 3] * w, a[:, 4] * h
  k[:, 2, 2] = 1.0
  w2c = np.tile(np.eye(4), (f, 1, 1))
  w2c[:, :3, :4] = a[:, 7:19].reshape(f, 3, 4)
  c2w = se3_inverse(w2c)
  validate_cameras(c2w, k)
  return {"timestamps": a[:, 0].astype(np.int64), "c2w": c2w, "intrinsics": k}


def format_realestate10k(c2w, intrinsics, image_hw, timestamps=None, url="https://example.invalid/jaxwm"):
  """Writes cameras in the RealEstate10K text format (inverse of :func:`parse_realestate10k`)."""
  c2w = np.asarray(c2w, np.float64)
  k = np.asarray(intrinsics, np.float64)
  validate_cameras(c2w, k)
  h, w = image_hw
  w2c = se3_inverse(c2w)
  if timestamps is None:
    timestamps = np.arange(len(c2w)) * 33333
  out = [url]
  for ts, kk, m in zip(timestamps, k, w2c):
    nums = [kk[0, 0] / w, kk[1, 1] / h, kk[0, 2] / w, kk[1, 2] / h, 0.0, 0.0, *m[:3, :4].reshape(-1)]
    out.append(" ".join([str(int(ts))] + [repr(float(x)) for x in nums]))
  return "\n".join(out) + "\n"


def parse_opengl_c2w_list(matrices):
  """A list of ``4x4`` OpenGL/Blender camera-to-world matrices -> ``[F, 4, 4]`` OpenCV, validated."""
  m = np.asarray(matrices, dtype=np.float64)
  if m.ndim != 3 or m.shape[1:] != (4, 4):
    raise ValueError(f"matrices must be a list of 4x4 camera-to-world matrices; got shape {m.shape}")
  c2w = opengl_to_opencv(m)
  validate_cameras(c2w)
  return c2w


def parse_blender_transforms(text, image_hw=None):
  """Reads a NeRF/Blender ``transforms.json`` (``camera_angle_x`` and ``frames[].transform_matrix``).

  Returns:
    dict with ``c2w [F, 4, 4]`` (OpenCV) and ``intrinsics [F, 3, 3]``; the image size is
    ``image_hw`` or the file's ``h``/``w`` entries.
  """
  meta = json.loads(text)
  if "frames" not in meta or "camera_angle_x" not in meta:
    raise ValueError("transforms.json needs 'frames' and 'camera_angle_x'")
  if image_hw is None:
    if "h" not in meta or "w" not in meta:
      raise ValueError("image_hw is required when transforms.json has no 'h' and 'w'")
    image_hw = (int(meta["h"]), int(meta["w"]))
  h, w = image_hw
  c2w = parse_opengl_c2w_list([fr["transform_matrix"] for fr in meta["frames"]])
  fx = 0.5 * w / math.tan(0.5 * float(meta["camera_angle_x"]))
  fy = 0.5 * h / math.tan(0.5 * float(meta["camera_angle_y"])) if "camera_angle_y" in meta else fx
  k = np.array([[fx, 0.0, w / 2.0], [0.0, fy, h / 2.0], [0.0, 0.0, 1.0]])
  return {"c2w": c2w, "intrinsics": np.broadcast_to(k, (len(c2w), 3, 3)).copy()}
