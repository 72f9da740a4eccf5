"""Camera file converters: RealEstate10K and OpenGL/Blender, to OpenCV camera-to-world."""

import json

import numpy as np
import pytest
from conftest import random_intrinsics, random_poses

from jaxwm import geometry as g

RE10K = """https://www.youtube.com/watch?v=abcdefghijk
1000 0.5 0.8 0.5 0.5 0 0 1 0 0 0.1 0 1 0 -0.2 0 0 1 0.3
2000 0.5 0.8 0.5 0.5 0 0 0 0 -1 0 0 1 0 0 1 0 0 1.5
"""


def test_parse_realestate10k_by_hand():
  cams = g.parse_realestate10k(RE10K, image_hw=(90, 160))
  np.testing.assert_array_equal(cams["timestamps"], [1000, 2000])
  np.testing.assert_allclose(cams["intrinsics"][0], [[80, 0, 80], [0, 72, 45], [0, 0, 1]])
  # Frame 0: w2c = [I | (0.1, -0.2, 0.3)] so the camera centre is -(0.1, -0.2, 0.3).
  np.testing.assert_allclose(cams["c2w"][0, :3, 3], [-0.1, 0.2, -0.3])
  np.testing.assert_allclose(cams["c2w"][0, :3, :3], np.eye(3))
  # Frame 1: w2c rotation maps world x to camera z... its inverse is the transpose.
  w2c = np.array([[0, 0, -1, 0], [0, 1, 0, 0], [1, 0, 0, 1.5], [0, 0, 0, 1]])
  np.testing.assert_allclose(cams["c2w"][1], np.linalg.inv(w2c), atol=1e-12)


def test_realestate10k_round_trip(rng):
  c2w, k = random_poses(rng, 7), random_intrinsics(rng, 7, (90, 160))
  text = g.format_realestate10k(c2w, k, (90, 160))
  back = g.parse_realestate10k(text, (90, 160))
  np.testing.assert_allclose(back["c2w"], c2w, atol=1e-9)
  np.testing.assert_allclose(back["intrinsics"], k, atol=1e-9)


def test_realestate10k_errors():
  with pytest.raises(ValueError, match="line 4 has 4 fields"):
    g.parse_realestate10k(RE10K + "1 2 3 4\n", (9, 16))
  with pytest.raises(ValueError, match="no camera lines"):
    g.parse_realestate10k("https://x\n", (9, 16))
  bad = RE10K.replace("0 1 0 -0.2", "0 2 0 -0.2")
  with pytest.raises(ValueError, match="c2w at frame 0: rotation is not orthonormal"):
    g.parse_realestate10k(bad, (9, 16))


def test_opengl_to_opencv():
  # An OpenGL camera at the origin looking down world -z with y up. In OpenCV terms its
  # forward (+z) is world -z and its down (+y) is world -y.
  cv = g.parse_opengl_c2w_list([np.eye(4)])
  np.testing.assert_allclose(cv[0, :3, 2], [0, 0, -1])
  np.testing.assert_allclose(cv[0, :3, 1], [0, -1, 0])
  np.testing.assert_allclose(cv[0, :3, 0], [1, 0, 0])
  np.testing.assert_allclose(g.opencv_to_opengl(cv), [np.eye(4)])


def test_blender_transforms_projection_agrees(rng):
  """A world point projects to the same pixel in the OpenGL and converted OpenCV models."""
  gl = random_poses(rng, 3)
  meta = {"camera_angle_x": 0.9, "w": 64, "h": 48, "frames": [{"transform_matrix": m.tolist()} for m in gl]}
  cams = g.parse_blender_transforms(json.dumps(meta))
  for i in range(3):
    x = gl[i] @ np.array([0.3, -0.4, -2.0, 1.0])  # in front of the OpenGL camera
    # OpenGL projection: camera looks down -z, image y goes up.
    pc = np.linalg.inv(gl[i]) @ x
    f = 0.5 * 64 / np.tan(0.45)
    u_gl, v_gl = 32 + f * pc[0] / -pc[2], 24 - f * pc[1] / -pc[2]
    cv = np.linalg.inv(cams["c2w"][i]) @ x
    uv = cams["intrinsics"][i] @ cv[:3]
    np.testing.assert_allclose(uv[:2] / uv[2], [u_gl, v_gl], atol=1e-9)
  with pytest.raises(ValueError, match="matrices must be a list of 4x4"):
    g.parse_opengl_c2w_list(np.zeros((2, 3, 4)))
