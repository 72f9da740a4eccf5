"""Converters for the camera files users bring, to OpenCV camera-to-world.

- RealEstate10K: a text file whose first line is the video URL, then one line per frame:
  ``timestamp fx fy cx cy 0 0`` followed by the 12 entries of a row-major 3x4
  world-to-camera matrix (OpenCV basis), intrinsics normalised by the image size.
- OpenGL / Blender: 4x4 camera-to-world matrices with camera axes x right, y up, z back
  (e.g. the ``transform_matrix`` entries of a NeRF ``transforms.json``).
- nerfstudio / DL3DV ``transforms.json``: OpenGL ``frames[].transform_matrix``, pixel intrinsics
  ``fl_x, fl_y, cx, cy`` of a ``w x h`` image at the top level or per frame (or Blender's
  ``camera_angle_x``); frames ordered by ``file_path`` (natural order); translations taken as metres.
- c2w JSON (:func:`parse_c2w_json`): camera-to-world matrices with a declared camera-axis
  convention and translation unit, e.g. ReWorld's ``camera.json`` (OpenGL axes, centimetres).

Every parser returns OpenCV camera-to-world ``[F, 4, 4]`` float64 with translations in metres
and intrinsics ``[F, 3, 3]`` float64 in pixels of the requested ``image_hw``; intrinsics stored
for another image size are rescaled (``fx, cx`` by ``W' / W``; ``fy, cy`` by ``H' / H``). The
world frame is kept as stored (training re-anchors on a window's first frame). Path-level
readers, writers and the ``read_cameras`` dispatcher are in ``jaxwm.geometry.camera_files``.
"""

import json
import math
import re

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


UNITS = {"m": 1.0, "cm": 0.01, "mm": 0.001}  # metres per unit
CONVENTIONS = ("opencv", "opengl")
C2W_JSON_VERSION = 1


def scale_intrinsics(intrinsics, from_hw, to_hw):
  """``[..., 3, 3]`` pixel intrinsics of a ``from_hw`` image -> the same camera at ``to_hw`` (a resize)."""
  k = np.array(intrinsics, dtype=np.float64)
  sy, sx = to_hw[0] / from_hw[0], to_hw[1] / from_hw[1]
  k[..., 0, :] *= sx
  k[..., 1, :] *= sy
  return k


def _loads(text, what):
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{what} is not valid JSON: {e}") from None


def _k_matrix(spec, what):
  """A ``3x3`` list or ``{"fx", "fy", "cx", "cy"}`` (``fy`` defaults to ``fx``) -> ``[3, 3]`` float64."""
  if isinstance(spec, dict):
    try:
      fx = float(spec["fx"])
      return np.array([[fx, 0.0, float(spec["cx"])], [0.0, float(spec.get("fy", fx)), float(spec["cy"])],
                       [0.0, 0.0, 1.0]])
    except KeyError as e:
      raise ValueError(f"{what} needs fx, cx, cy (and optionally fy); missing {e}") from None
  k = np.asarray(spec, dtype=np.float64)
  if k.shape != (3, 3):
    raise ValueError(f"{what} must be a 3x3 matrix or {{fx, fy, cx, cy}}; got shape {k.shape}")
  return k


def parse_c2w_json(text, image_hw):
  """Parses a c2w JSON camera file (the schema ``format_c2w_json`` writes)::

    {"version": 1,                          # optional
     "convention": "opengl" | "opencv",     # camera axes: x right, y up, z back | x right, y down, z forward
     "unit": "m" | "cm" | "mm",             # of the translations
     "image_hw": [H, W],                    # optional: the image the pixel intrinsics refer to
                                            #   (default: the caller's image_hw)
     "intrinsics": [[3x3]] | {"fx", "fy", "cx", "cy"},   # shared by all frames
     "frames": [{"c2w": [[4x4]], "intrinsics": ...}, ...]}  # per-frame intrinsics override the shared

  Returns:
    dict with ``c2w [F, 4, 4]`` (float64, OpenCV, metres) and ``intrinsics [F, 3, 3]``
    (float64, pixels of ``image_hw``).
  """
  meta = _loads(text, "c2w JSON")
  if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
    raise ValueError("c2w JSON needs a non-empty 'frames' list")
  if meta.get("version", C2W_JSON_VERSION) != C2W_JSON_VERSION:
    raise ValueError(f"c2w JSON version {meta['version']!r} is not supported (expected {C2W_JSON_VERSION})")
  conv, unit = meta.get("convention"), meta.get("unit")
  if conv not in CONVENTIONS:
    raise ValueError(f"c2w JSON 'convention' must be one of {CONVENTIONS}; got {conv!r}")
  if unit not in UNITS:
    raise ValueError(f"c2w JSON 'unit' must be one of {tuple(UNITS)}; got {unit!r}")
  ks, mats = [], []
  for i, fr in enumerate(meta["frames"]):
    if not isinstance(fr, dict) or "c2w" not in fr:
      raise ValueError(f"c2w JSON frame {i} has no 'c2w'")
    spec = fr.get("intrinsics", meta.get("intrinsics"))
    if spec is None:
      raise ValueError(f"c2w JSON frame {i} has no intrinsics (neither shared nor per frame)")
    ks.append(_k_matrix(spec, f"c2w JSON frame {i} intrinsics"))
    m = np.asarray(fr["c2w"], dtype=np.float64)
    if m.shape != (4, 4):
      raise ValueError(f"c2w JSON frame {i} 'c2w' must be 4x4; got shape {m.shape}")
    mats.append(m)
  c2w = np.stack(mats)
  if conv == "opengl":
    c2w = opengl_to_opencv(c2w)
  c2w[:, :3, 3] *= UNITS[unit]
  k = np.stack(ks)
  if "image_hw" in meta:
    k = scale_intrinsics(k, tuple(meta["image_hw"]), image_hw)
  validate_cameras(c2w, k)
  return {"c2w": c2w, "intrinsics": k}


def format_c2w_json(c2w, intrinsics, image_hw, convention="opencv", unit="m"):
  """Writes OpenCV metric cameras as c2w JSON (inverse of :func:`parse_c2w_json`) in ``convention`` and ``unit``."""
  if convention not in CONVENTIONS or unit not in UNITS:
    raise ValueError(f"convention must be one of {CONVENTIONS} and unit one of {tuple(UNITS)}; "
                     f"got {convention!r}, {unit!r}")
  c2w, k = np.array(c2w, np.float64), np.asarray(intrinsics, np.float64)
  validate_cameras(c2w, k)
  if convention == "opengl":
    c2w = opencv_to_opengl(c2w)
  c2w[:, :3, 3] /= UNITS[unit]
  frames = [{"c2w": m.tolist(), "intrinsics": kk.tolist()} for m, kk in zip(c2w, k)]
  return json.dumps({"version": C2W_JSON_VERSION, "convention": convention, "unit": unit,
                     "image_hw": [int(image_hw[0]), int(image_hw[1])], "frames": frames})


def _natural_key(s):
  return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(s))]


def parse_nerfstudio_transforms(text, image_hw):
  """Reads a nerfstudio / DL3DV ``transforms.json`` (see module doc); distortion terms are ignored.

  Returns:
    dict with ``c2w [F, 4, 4]`` (float64, OpenCV) and ``intrinsics [F, 3, 3]`` (pixels of ``image_hw``).
  """
  meta = _loads(text, "transforms.json")
  if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
    raise ValueError("transforms.json needs a non-empty 'frames' list")
  frames = meta["frames"]
  if all(isinstance(fr, dict) and "file_path" in fr for fr in frames):
    frames = sorted(frames, key=lambda fr: _natural_key(fr["file_path"]))
  ks, mats = [], []
  for i, fr in enumerate(frames):
    if not isinstance(fr, dict) or "transform_matrix" not in fr:
      raise ValueError(f"transforms.json frame {i} has no 'transform_matrix'")
    get = lambda key, fr=fr: fr.get(key, meta.get(key))  # per frame overrides top level
    w, h = get("w"), get("h")
    src_hw = (float(h), float(w)) if w is not None and h is not None else tuple(image_hw)
    if get("fl_x") is not None:
      fx = float(get("fl_x"))
      fy = float(get("fl_y") if get("fl_y") is not None else fx)
    elif get("camera_angle_x") is not None:
      fx = 0.5 * src_hw[1] / math.tan(0.5 * float(get("camera_angle_x")))
      fy = 0.5 * src_hw[0] / math.tan(0.5 * float(get("camera_angle_y"))) if get("camera_angle_y") else fx
    else:
      raise ValueError(f"transforms.json frame {i} has no focal length (fl_x or camera_angle_x)")
    cx = float(get("cx")) if get("cx") is not None else src_hw[1] / 2.0
    cy = float(get("cy")) if get("cy") is not None else src_hw[0] / 2.0
    ks.append(scale_intrinsics([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], src_hw, image_hw))
    mats.append(fr["transform_matrix"])
  try:
    c2w = parse_opengl_c2w_list(mats)
  except ValueError as e:
    raise ValueError(f"transforms.json: {e}") from None
  k = np.stack(ks)
  validate_cameras(c2w, k)
  return {"c2w": c2w, "intrinsics": k}


def format_nerfstudio_transforms(c2w, intrinsics, image_hw, per_frame=None):
  """Writes a nerfstudio ``transforms.json`` (inverse of :func:`parse_nerfstudio_transforms`).

  Intrinsics go to the top level when all frames share them (``per_frame=None``), else per frame.
  """
  c2w, k = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
  validate_cameras(c2w, k)
  h, w = int(image_hw[0]), int(image_hw[1])
  if per_frame is None:
    per_frame = not np.allclose(k, k[:1], rtol=0, atol=0)
  ks = lambda kk: {"fl_x": kk[0, 0], "fl_y": kk[1, 1], "cx": kk[0, 2], "cy": kk[1, 2], "w": w, "h": h}
  meta = {"camera_model": "PINHOLE"} if per_frame else {"camera_model": "PINHOLE", **ks(k[0])}
  meta["frames"] = [{"file_path": f"images/frame_{i:05d}.png", "transform_matrix": m.tolist(),
                     **(ks(kk) if per_frame else {})} for i, (m, kk) in enumerate(zip(opencv_to_opengl(c2w), k))]
  return json.dumps(meta)
