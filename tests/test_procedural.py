"""Procedural scenes: determinism, exact loop returns, depth, warp consistency, data sources."""

import dataclasses
import threading

import numpy as np
import pytest

from jaxwm import geometry as g
from jaxwm.data.procedural import (AXIS_COMBOS, EVAL_LOOPS, ProceduralClips, make_clip, make_scene, make_trajectory,
                                   pinhole_intrinsics, render)
from jaxwm.data.procedural import trajectories as traj


def test_identical_poses_give_identical_frames():
  scene = make_scene(5)
  c = make_clip(5, 3, 9, (24, 32), "free")
  c2w = np.concatenate([c["c2w"], c["c2w"][::-1]])
  k = np.concatenate([c["intrinsics"], c["intrinsics"]])
  frames, depth = render(scene, c2w, k, (24, 32), chunk_frames=5)  # different batching too
  np.testing.assert_array_equal(frames[:9], frames[9:][::-1])
  np.testing.assert_array_equal(depth[:9], depth[9:][::-1])
  np.testing.assert_array_equal(frames[:9], c["frames"])


@pytest.mark.parametrize("g,channels,size", [(5, 3, 256), (2, 1, 7), (17, 4, 33), (65, 3, 100)])
def test_texture_upsampling_is_bilinear_with_aligned_corners(g, channels, size):
  """``_upsample`` against float64 bilinear interpolation written per output pixel (corners on corners)."""
  from jaxwm.data.procedural.textures import _upsample  # pylint: disable=g-import-not-at-top
  grid = np.random.default_rng(g).random((g, g, channels), dtype=np.float32)
  got = _upsample(grid, size)
  u = np.arange(size) * (g - 1) / (size - 1)
  i0 = np.minimum(np.floor(u).astype(int), g - 2)
  w = u - i0
  want = np.empty((size, size, channels))
  for r in range(size):
    for c in range(size):
      a, b, fr, fc = i0[r], i0[c], w[r], w[c]
      want[r, c] = ((1 - fr) * (1 - fc) * grid[a, b] + (1 - fr) * fc * grid[a, b + 1] + fr * (1 - fc) * grid[a + 1, b]
                    + fr * fc * grid[a + 1, b + 1])
  assert got.shape == (size, size, channels)
  np.testing.assert_allclose(got, want, atol=1e-5)  # positions are float32 linspace values
  np.testing.assert_array_equal(got[[0, 0, -1, -1], [0, -1, 0, -1]], grid[[0, 0, -1, -1], [0, -1, 0, -1]])


def test_concurrent_callers_share_one_build_of_a_room(monkeypatch):
  """A loader's reader threads asking for clips of one room at once get one build, the same object, equal to a
  build alone (``functools.lru_cache`` alone let each of them build: 8 readers, 8 builds)."""
  from jaxwm.data.procedural import scene as scene_lib  # pylint: disable=g-import-not-at-top
  alone = make_scene(101)
  scene_lib.clear_scene_cache()
  built, lock = [], threading.Lock()
  real = scene_lib.make_texture

  def counted(rng, size):
    with lock:
      built.append(size)
    return real(rng, size)

  monkeypatch.setattr(scene_lib, "make_texture", counted)
  start, got = threading.Barrier(8), [None] * 8

  def reader(i):
    start.wait()
    got[i] = make_scene(101)

  threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(s is got[0] for s in got)
  assert len(built) == 6 + len(got[0].sphere_textures) + len(got[0].box_textures)  # one room's textures, once
  for f in dataclasses.fields(alone):
    if f.name != "mips":
      np.testing.assert_array_equal(getattr(got[0], f.name), getattr(alone, f.name))
  assert make_scene(101, 256) is got[0]  # the default size by name or by value: one cache entry


def test_clips_are_deterministic():
  a = make_clip(2, 7, 5, (16, 16), "palindrome")
  b = make_clip(2, 7, 5, (16, 16), "palindrome")
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("axes", AXIS_COMBOS)
def test_rotation_loop_returns_to_first_frame(axes):
  c = make_clip(11, 4, 13, (24, 24), "rotate_loop", axes=axes, magnitude_deg=75.0)
  ret = int(c["return_frame"])
  assert ret == 12
  np.testing.assert_array_equal(c["c2w"][ret], c["c2w"][0])
  np.testing.assert_array_equal(c["frames"][ret], c["frames"][0])
  # Rotation only: the camera centre never moves, and the far point is a different view.
  np.testing.assert_array_equal(c["c2w"][:, :3, 3], np.broadcast_to(c["c2w"][0, :3, 3], (13, 3)))
  assert np.abs(c["frames"][6].astype(int) - c["frames"][0]).mean() > 5


@pytest.mark.parametrize("axis,column,sign", [("yaw", 0, 1.0), ("pitch", 1, -1.0)])
def test_rotation_loop_axes_and_speed(axis, column, sign):
  start = np.eye(4)
  c2w, ret = traj.rotate_loop(start, axis, 90.0, 21)
  ang = g.geodesic_angle(c2w[0, :3, :3], c2w[:, :3, :3])
  np.testing.assert_allclose(ang[10], np.pi / 2, atol=1e-12)  # peak = magnitude
  steps = g.geodesic_angle(c2w[:-1, :3, :3], c2w[1:, :3, :3])
  np.testing.assert_allclose(steps[:ret], np.radians(9.0), atol=1e-12)  # constant angular speed
  # Yaw turns right (+x), pitch looks up (-y in OpenCV): the forward axis at the far point.
  assert sign * c2w[10, column, 2] > 0.99


def test_free_paths_stay_in_zone_and_use_every_segment_type():
  seen = set()
  for seed in range(12):
    scene = make_scene(100 + seed, texture_size=16)
    c2w, _ = make_trajectory(scene, seed, 60, "free")
    rng = np.random.default_rng(seed)
    _, segs = traj.free_path(rng, traj.start_pose(rng, scene.camera_zone), scene.camera_zone, 60)
    seen |= {s for s, _ in segs}
    pos = c2w[:, :3, 3]
    assert np.all(pos >= scene.camera_zone[0] - 1e-9) and np.all(pos <= scene.camera_zone[1] + 1e-9)
    g.validate_cameras(c2w)
    # Bounded motion per frame.
    assert np.linalg.norm(np.diff(pos, axis=0), axis=1).max() < 0.2
  assert seen == set(traj.SEGMENT_TYPES)


def test_camera_zone_is_clear_of_objects():
  for seed in range(20):
    s = make_scene(200 + seed, texture_size=16)
    lo, hi = s.camera_zone
    assert np.all(-s.half_extent < lo) and np.all(hi < s.half_extent)
    for c, r in zip(s.sphere_center, s.sphere_radius):
      nearest = np.clip(c, lo, hi)
      assert np.linalg.norm(nearest - c) > r
    for blo, bhi in zip(s.box_lo, s.box_hi):
      assert np.any(bhi <= lo) or np.any(blo >= hi)


@pytest.mark.parametrize("num_frames", [9, 10])
def test_palindrome_is_exact_reverse(num_frames):
  c = make_clip(3, 5, num_frames, (16, 16), "palindrome")
  ret = int(c["return_frame"])
  n = (num_frames + 1) // 2
  assert ret == 2 * n - 2 and ret < num_frames
  for j in range(n):
    np.testing.assert_array_equal(c["c2w"][n - 1 + j], c["c2w"][n - 1 - j])
    np.testing.assert_array_equal(c["frames"][n - 1 + j], c["frames"][n - 1 - j])


def test_depth_closed_form_in_empty_room():
  s = make_scene(0, texture_size=16)
  empty = dataclasses.replace(s, sphere_center=np.zeros((0, 3), np.float32), sphere_radius=np.zeros(0, np.float32),
                              sphere_textures=s.sphere_textures[:0], box_lo=np.zeros((0, 3), np.float32),
                              box_hi=np.zeros((0, 3), np.float32), box_textures=s.box_textures[:0], mips={})
  hx, hy, hz = s.half_extent.astype(np.float64)
  pos = np.array([0.3, -0.2, 0.5])
  c2w = g.make_se3(np.eye(3), pos)[None]
  k = pinhole_intrinsics((32, 32), 70.0)[None]
  _, depth = render(empty, c2w, k, (32, 32))
  # Looking down +z: every pixel that hits the far wall has z-depth hz - z0.
  rays = g.pixel_rays(k[0].astype(np.float64), g.pixel_centers(32, 32), normalize=False)
  t_wall = (hz - pos[2]) * np.ones((32, 32))
  t_x = np.where(rays[..., 0] > 0, hx - pos[0], -hx - pos[0]) / rays[..., 0]
  t_y = np.where(rays[..., 1] > 0, hy - pos[1], -hy - pos[1]) / rays[..., 1]
  expected = np.minimum(t_wall, np.minimum(t_x, t_y))
  np.testing.assert_allclose(depth[0], expected, rtol=1e-5)


def _warp_agreement(clip, surface, t, k, tol):
  img = clip["frames"].astype(np.float32) / 255.0
  warped, valid = g.warp_frame(img[t], clip["depth"][t], clip["intrinsics"][t], clip["c2w"][t], clip["depth"][k],
                               clip["intrinsics"][k], clip["c2w"][k])
  # Exclude pixels whose bilinear footprint in frame t straddles two surfaces (a room
  # corner, a box edge): there the colour is discontinuous although the depth is not.
  uv, _ = g.warp_coordinates(clip["depth"][k], clip["intrinsics"][k], clip["c2w"][k], clip["intrinsics"][t],
                             clip["c2w"][t])
  h, w = surface.shape[1:]
  same = np.ones(valid.shape, bool)
  for du in (-0.5, 0.5):
    for dv in (-0.5, 0.5):
      x = np.clip(np.floor(uv[..., 0] + du), 0, w - 1).astype(int)
      y = np.clip(np.floor(uv[..., 1] + dv), 0, h - 1).astype(int)
      same &= surface[t][y, x] == surface[k]
  mask = valid & same
  err = np.abs(warped - img[k]).max(-1)[mask]
  return mask.mean(), (err <= tol).mean()


@pytest.mark.parametrize("seed", [0, 1])
def test_warp_reproduces_other_frames(seed):
  clip = make_clip(seed, seed, 13, (64, 64), "free")
  _, _, surface = render(make_scene(seed), clip["c2w"], clip["intrinsics"], (64, 64), return_surface=True)
  for t, k in [(0, 4), (3, 9), (12, 6)]:
    covisible, agree = _warp_agreement(clip, surface, t, k, tol=0.06)
    assert covisible > 0.2
    assert agree >= 0.99, (t, k, covisible, agree)


def test_warp_detects_wrong_pose():
  """The warp criterion can fail: with a perturbed source pose, far fewer pixels agree."""
  clip = make_clip(0, 0, 13, (64, 64), "free")
  _, _, surface = render(make_scene(0), clip["c2w"], clip["intrinsics"], (64, 64), return_surface=True)
  bad = dict(clip, c2w=clip["c2w"].copy())
  bad["c2w"][0] = clip["c2w"][0] @ g.make_se3(g.axis_angle_to_matrix(np.array([0.0, 0.08, 0.0])), np.zeros(3))
  _, agree = _warp_agreement(bad, surface, 0, 4, tol=0.06)
  assert agree < 0.9


def test_source_splits_and_seeds():
  train = ProceduralClips("train", num_clips=50, clips_per_scene=2)
  ev = ProceduralClips("eval", num_clips=50)
  train_seeds = [train.seeds(i) for i in range(50)]
  eval_seeds = [ev.seeds(i) for i in range(50)]
  assert not {s for s, _ in train_seeds} & {s for s, _ in eval_seeds}
  assert not {t for _, t in train_seeds} & {t for _, t in eval_seeds}
  assert train_seeds[0][0] == train_seeds[1][0] != train_seeds[2][0]  # clips_per_scene
  with pytest.raises(ValueError, match="split must be one of"):
    ProceduralClips("test")
  with pytest.raises(ValueError, match="family must be"):
    ProceduralClips(family="spiral")
  with pytest.raises(IndexError):
    train[50]


def test_eval_loops_cover_every_axis_and_magnitude():
  assert len(EVAL_LOOPS) == 35
  src = ProceduralClips("eval", num_clips=35, num_frames=5, image_hw=(8, 8), family="loops")
  seen = {(str(src[i]["axes"]), float(src[i]["magnitude_deg"])) for i in (0, 6, 34)}
  assert seen == {EVAL_LOOPS[0], EVAL_LOOPS[6], EVAL_LOOPS[34]}


def test_grain_loader_matches_direct_indexing():
  import grain.python as grain  # pylint: disable=g-import-not-at-top
  src = ProceduralClips("train", num_clips=6, num_frames=3, image_hw=(8, 8), family="free")
  sampler = grain.IndexSampler(num_records=6, shard_options=grain.NoSharding(), shuffle=True, num_epochs=1, seed=3)
  loader = grain.DataLoader(data_source=src, sampler=sampler, worker_count=0)
  got = list(loader)
  assert len(got) == 6
  seeds = sorted(int(x["trajectory_seed"]) for x in got)
  assert seeds == [src.seeds(i)[1] for i in range(6)]
  for x in got:
    i = (int(x["trajectory_seed"]) - 0) // 2
    np.testing.assert_array_equal(x["frames"], src[i]["frames"])


@pytest.mark.parametrize("kind", ["forward", "backward", "sideways", "orbit", "move_rotate"])
def test_walks_move_as_named_and_stay_in_the_zone(kind):
  from jaxwm.data.procedural import trajectories as traj  # pylint: disable=g-import-not-at-top
  zone = np.array([[-1.0, -0.5, -1.2], [1.0, 0.5, 1.2]])
  c2w = traj.walk(np.random.default_rng(3), zone, kind, 17)
  pos, rot = c2w[:, :3, 3], c2w[:, :3, :3]
  assert ((pos >= zone[0] - 1e-9) & (pos <= zone[1] + 1e-9)).all()
  np.testing.assert_allclose(np.einsum("fij,fkj->fik", rot, rot), np.tile(np.eye(3), (17, 1, 1)), atol=1e-9)
  step = pos[-1] - pos[0]
  r0 = rot[0]
  yaw = np.degrees(np.arccos(np.clip((np.trace(r0.T @ rot[-1]) - 1) / 2, -1, 1)))
  if kind in ("forward", "backward", "sideways"):
    axis = r0[:, 0] if kind == "sideways" else r0[:, 2] * (1 if kind == "forward" else -1)
    axis_h = axis * np.array([1, 0, 1])  # the walk is level: along the heading, without the pitch
    np.testing.assert_allclose(abs(step @ axis_h) / np.linalg.norm(axis_h), traj.WALK_LENGTH_M, rtol=1e-6)
    assert step @ axis > 0 or kind == "sideways"
    assert yaw == pytest.approx(0, abs=1e-6)
  elif kind == "orbit":
    assert yaw == pytest.approx(traj.ORBIT_DEG, abs=1e-6)
    # The orbit centre sits ORBIT_RADIUS_M ahead (level) of every pose.
    fwd = rot[:, :, 2] * np.array([1, 0, 1])
    centres = pos + traj.ORBIT_RADIUS_M * fwd / np.linalg.norm(fwd, axis=1, keepdims=True)
    np.testing.assert_allclose(centres, np.repeat(centres[:1], 17, 0), atol=1e-9)
  else:
    assert yaw == pytest.approx(traj.MOVE_ROTATE_DEG, abs=1e-6)
    assert np.linalg.norm(step) == pytest.approx(0.6 * traj.WALK_LENGTH_M)


def test_walks_eval_family_cycles_the_kinds():
  from jaxwm.data.procedural import WALKS, ProceduralClips  # pylint: disable=g-import-not-at-top
  src = ProceduralClips("eval", num_clips=6, num_frames=5, image_hw=(16, 16), family="walks")
  assert [str(src[i]["family"]) for i in range(6)] == list(WALKS) + [WALKS[0]]
  assert int(src[0]["return_frame"]) == -1
