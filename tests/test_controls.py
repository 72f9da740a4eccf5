"""Interactive controls (jaxwm.sampling.controls): each key's motion in closed form in the OpenCV camera frame,
drags spread over a chunk, the way back to frame 0 exact, bad input refused in one line."""

import numpy as np
import pytest

from jaxwm.geometry.rotations import geodesic_angle
from jaxwm.sampling.controls import KEYS, Controls, return_path


def _yawed(deg):
  a = np.radians(deg)
  pose = np.eye(4)
  pose[:3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
  pose[:3, 3] = [1.0, 2.0, 3.0]
  return pose


def test_each_key_moves_the_camera_along_its_own_axes():
  c = Controls(speed=0.1, turn=10.0)
  start = _yawed(30.0)
  fwd = c.chunk(start, 4, ["w"])
  np.testing.assert_allclose(fwd[-1][:3, 3], start[:3, 3] + 0.4 * start[:3, 2], atol=1e-12)  # along the view
  np.testing.assert_allclose(fwd[-1][:3, :3], start[:3, :3], atol=1e-12)
  up = c.chunk(start, 2, ["r"])[-1]
  np.testing.assert_allclose(up[:3, 3], start[:3, 3] - 0.2 * start[:3, 1], atol=1e-12)  # up is -y (OpenCV)
  both = c.chunk(start, 1, ["w", "d"])[-1]
  np.testing.assert_allclose(both[:3, 3], start[:3, 3] + 0.1 * (start[:3, 2] + start[:3, 0]), atol=1e-12)
  right = c.chunk(np.eye(4), 3, ["right"])
  assert right[-1][0, 2] > 0 and np.isclose(float(geodesic_angle(right[-1][:3, :3])), np.radians(30.0))
  np.testing.assert_allclose(right[-1][:3, :3], _yawed(30.0)[:3, :3], atol=1e-12)  # 3 turns of 10 deg = R_y(30)
  np.testing.assert_array_equal(right[-1][:3, 3], 0.0)
  look_up = c.chunk(np.eye(4), 1, ["up"])[-1]
  assert look_up[1, 2] < 0  # the view direction tilts towards -y
  np.testing.assert_allclose(c.chunk(start, 5, ["left", "right", "w", "s"]), np.stack([start] * 5), atol=1e-12)
  for pose in c.chunk(start, 6, ["w", "left", "up"]):
    np.testing.assert_allclose(pose[:3, :3] @ pose[:3, :3].T, np.eye(3), atol=1e-12)
  assert set(KEYS) == {"w", "a", "s", "d", "r", "f", "left", "right", "up", "down"}


def test_a_drag_turns_the_camera_by_its_pixels_spread_over_the_chunk():
  c = Controls(mouse_deg=0.5)
  path = c.chunk(np.eye(4), 4, drag=(40.0, 0.0))  # 20 degrees right, 5 per frame
  angles = [float(np.degrees(geodesic_angle(p[:3, :3]))) for p in path]
  np.testing.assert_allclose(angles, [5, 10, 15, 20], atol=1e-9)
  assert path[-1][0, 2] > 0
  assert c.chunk(np.eye(4), 2, drag=(0.0, -10.0))[-1][1, 2] < 0  # dragging up looks up


def test_the_return_path_ends_exactly_at_frame_0():
  c = Controls(speed=0.2, turn=15.0)
  start = np.eye(4)
  away = c.chunk(start, 6, ["w", "right", "up"])[-1]
  back = return_path(away, start, 5)
  assert back.shape == (5, 4, 4)
  np.testing.assert_array_equal(back[-1], start)
  dist = [np.linalg.norm(p[:3, 3]) for p in back]
  assert all(a > b for a, b in zip(dist, dist[1:]))  # closer every frame
  turn = [float(geodesic_angle(p[:3, :3])) for p in back]
  np.testing.assert_allclose(np.diff(turn), np.diff(turn)[0], atol=1e-9)  # slerp: even angular steps


def test_bad_input_is_refused_naming_it():
  with pytest.raises(ValueError, match="keys: 'x' is not a control"):
    Controls().chunk(np.eye(4), 2, ["w", "x"])
  with pytest.raises(ValueError, match=r"Controls.speed=nan: must be a finite number >= 0"):
    Controls(speed=float("nan"))
  with pytest.raises(ValueError, match="drag="):
    Controls().chunk(np.eye(4), 2, drag=(float("inf"), 0))
  with pytest.raises(ValueError, match="frames=0"):
    return_path(np.eye(4), np.eye(4), 0)
