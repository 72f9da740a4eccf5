"""Camera files: every format round-trips to the same OpenCV metric cameras; bad files give one-line errors."""

import json

import numpy as np
import pytest
from conftest import random_intrinsics, random_poses

from jaxwm.geometry import formats
from jaxwm.geometry.camera_files import detect_format, read_cameras, write_cameras

HW = (48, 64)

# (file name, write_cameras keyword arguments)
WRITERS = [
    ("cams.txt", {}),
    ("cams_cv_m.json", {"convention": "opencv", "unit": "m"}),
    ("cams_gl_cm.json", {"convention": "opengl", "unit": "cm"}),
    ("cams_gl_mm.json", {"convention": "opengl", "unit": "mm"}),
    ("transforms.json", {"fmt": "nerfstudio"}),
    ("cams.npy", {}),
    ("cams.npz", {}),
]


@pytest.fixture(name="traj")
def _traj(rng):
  return random_poses(rng, 6), random_intrinsics(rng, 6, HW)


@pytest.mark.parametrize("name,kw", WRITERS, ids=[w[0] for w in WRITERS])
def test_every_format_round_trips(tmp_path, traj, name, kw):
  c2w, k = traj
  path = write_cameras(tmp_path / name, c2w, k, HW, **kw)
  cams = read_cameras(path, HW)
  np.testing.assert_allclose(cams["c2w"], c2w, atol=1e-5)
  np.testing.assert_allclose(cams["intrinsics"], k, atol=1e-5)
  assert cams["c2w"].dtype == np.float64 and cams["intrinsics"].shape == (6, 3, 3)
  # Every format but .npy records the image size its intrinsics are in: read at twice the size.
  if name != "cams.npy":
    big = read_cameras(path, (96, 128))
    np.testing.assert_allclose(big["intrinsics"][:, :2], 2 * k[:, :2], atol=1e-5)


def test_shared_intrinsics(tmp_path, traj):
  c2w, k = traj
  k1 = np.broadcast_to(k[0], k.shape)
  text = formats.format_nerfstudio_transforms(c2w, k1, HW)
  assert "fl_x" in json.loads(text) and "fl_x" not in json.loads(text)["frames"][0]  # top level
  (tmp_path / "t.json").write_text(text)
  np.testing.assert_allclose(read_cameras(tmp_path / "t.json", HW)["intrinsics"], k1, atol=1e-9)
  np.save(tmp_path / "a.npy", c2w)
  np.save(tmp_path / "a.K.npy", k[0])  # one [3, 3] for every frame
  np.testing.assert_allclose(read_cameras(tmp_path / "a.npy", HW)["intrinsics"], k1)


def test_reworld_style_json_by_hand(tmp_path):
  """OpenGL axes, centimetres: a camera 1 m along x looking down world -z with y up."""
  meta = {"convention": "opengl", "unit": "cm", "intrinsics": {"fx": 50, "fy": 50, "cx": 32, "cy": 24},
          "frames": [{"c2w": [[1, 0, 0, 100], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]}]}
  (tmp_path / "camera.json").write_text(json.dumps(meta))
  assert detect_format(tmp_path / "camera.json") == "c2w_json"
  cams = read_cameras(tmp_path / "camera.json", HW)
  np.testing.assert_allclose(cams["c2w"][0], [[1, 0, 0, 1], [0, -1, 0, 0], [0, 0, -1, 0], [0, 0, 0, 1]])
  np.testing.assert_allclose(cams["intrinsics"][0], [[50, 0, 32], [0, 50, 24], [0, 0, 1]])


def test_nerfstudio_by_hand(tmp_path):
  """Frames in file_path order (natural sort), per-frame intrinsics override, camera_angle_x fallback."""
  eye = np.eye(4).tolist()
  moved = np.eye(4)
  moved[0, 3] = 2.0
  meta = {"fl_x": 40.0, "cx": 32.0, "cy": 24.0, "w": 64, "h": 48,
          "frames": [{"file_path": "images/frame_10.png", "transform_matrix": moved.tolist(), "fl_x": 80.0},
                     {"file_path": "images/frame_2.png", "transform_matrix": eye}]}
  (tmp_path / "transforms.json").write_text(json.dumps(meta))
  cams = read_cameras(tmp_path / "transforms.json", (24, 32))  # half size
  np.testing.assert_allclose(cams["c2w"][:, 0, 3], [0.0, 2.0])
  np.testing.assert_allclose(cams["intrinsics"][:, 0, 0], [20.0, 40.0])
  np.testing.assert_allclose(cams["intrinsics"][:, 1, 1], [20.0, 40.0])  # fl_y defaults to fl_x
  np.testing.assert_allclose(cams["intrinsics"][0, :2, 2], [16.0, 12.0])
  blender = {"camera_angle_x": 2 * np.arctan(0.5), "frames": [{"transform_matrix": eye}]}
  (tmp_path / "b.json").write_text(json.dumps(blender))
  np.testing.assert_allclose(read_cameras(tmp_path / "b.json", HW)["intrinsics"][0, 0, 0], 64.0)


NAN_TXT = "url\n0 0.5 0.5 0.5 0.5 0 0 1 0 0 nan 0 1 0 0 0 0 1 0\n"
SKEW_TXT = "url\n0 0.5 0.5 0.5 0.5 0 0 1 0.5 0 0 0 1 0 0 0 0 1 0\n"
GOOD = {"convention": "opencv", "unit": "m", "intrinsics": [[50, 0, 32], [0, 50, 24], [0, 0, 1]],
        "frames": [{"c2w": np.eye(4).tolist()}]}
BAD_FILES = [
    ("a.json", "{not json", "not valid JSON"),
    ("a.json", json.dumps({"frames": [{"pose": 1}]}), "neither a c2w JSON"),
    ("a.json", json.dumps(dict(GOOD, unit="inch")), r"'unit' must be one of \('m', 'cm', 'mm'\); got 'inch'"),
    ("a.json", json.dumps(dict(GOOD, convention="blender")), "'convention' must be one of"),
    ("a.json", json.dumps(dict(GOOD, frames=[{"c2w": [[1, 0], [0, 1]]}])),
     r"frame 0 'c2w' must be 4x4; got shape \(2, 2\)"),
    ("a.json", json.dumps({k: v for k, v in GOOD.items() if k != "intrinsics"}), "frame 0 has no intrinsics"),
    ("t.json", json.dumps({"frames": [{"transform_matrix": np.eye(4).tolist()}]}), "frame 0 has no focal length"),
    ("a.txt", NAN_TXT, "c2w at frame 0: non-finite values"),
    ("a.txt", SKEW_TXT, "c2w at frame 0: rotation is not orthonormal"),
    ("a.txt", "url\n1 2 3\n", "line 2 has 3 fields"),
    ("a.npy", None, "missing a.K.npy"),
    ("a.npz", b"PK garbage", "a.npz is not a numpy file"),
    ("a.yaml", "x: 1", r"unknown camera file suffix '.yaml'"),
]


@pytest.mark.parametrize("name,content,match", BAD_FILES, ids=[b[2][:30] for b in BAD_FILES])
def test_bad_files_give_one_line_errors(tmp_path, name, content, match):
  path = tmp_path / name
  if content is None:
    np.save(path, np.tile(np.eye(4), (2, 1, 1)))
  elif isinstance(content, bytes):
    path.write_bytes(content)
  else:
    path.write_text(content)
  with pytest.raises(ValueError, match=match) as e:
    read_cameras(path, HW)
  assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_array_shape_errors(tmp_path):
  np.savez(tmp_path / "a.npz", c2w=np.tile(np.eye(4), (3, 1, 1)), K=np.tile(np.eye(3), (2, 1, 1)))
  with pytest.raises(ValueError, match=r"K must have shape \[3, 3\] or \[F, 3, 3\] with F = 3; got \(2, 3, 3\)"):
    read_cameras(tmp_path / "a.npz", HW)
  np.savez(tmp_path / "b.npz", c2w=np.eye(4))
  with pytest.raises(ValueError, match=r"npz needs keys 'c2w' and 'K'; has \['c2w'\]"):
    read_cameras(tmp_path / "b.npz", HW)
  with pytest.raises(ValueError, match="no such file"):
    read_cameras(tmp_path / "missing.txt", HW)
  with pytest.raises(ValueError, match="fmt must be 'auto' or one of"):
    read_cameras(tmp_path / "a.npz", HW, fmt="colmap")
