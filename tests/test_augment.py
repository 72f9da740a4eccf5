"""ReWorld's training recipe: chunk-drop and head-window masks against explicit constructions,
head routing cycling through its pool and continuing after a checkpoint restart."""

import jax
import numpy as np

from conftest import tiny_config
from jaxwm.training import augment
from jaxwm.training.layout import teacher_forcing_layout


def test_chunk_drop_mask_by_explicit_construction():
  lay = teacher_forcing_layout(13, 2)  # clean chunks 0..5, noisy chunks 1..6
  for seed in range(4):
    m = np.asarray(augment.chunk_drop_mask(jax.random.key(seed), lay.mask, lay.chunk, 2, lay.chunk[lay.writer]))
    # Recover the keep-set from the last noisy chunk's row, then rebuild the whole mask by hand.
    last = len(lay.chunk) - 1
    kept = {0} | {int(lay.chunk[j]) for j in np.flatnonzero(m[last]) if lay.chunk[j] != lay.chunk[last]}
    want = np.zeros_like(lay.mask)
    for i in range(len(lay.chunk)):
      for j in range(len(lay.chunk)):
        want[i, j] = lay.mask[i, j] and (lay.chunk[j] in kept or lay.chunk[j] == lay.chunk[i])
    np.testing.assert_array_equal(m, want)
    past = {int(c) for c in lay.chunk[:lay.num_clean]} - {0}
    assert len(kept & past) == 2  # the sink + `keep` others of the history
    assert m.any(1).all() and np.all(np.diag(m))  # queries never dropped: every frame sees itself
  # The same key gives the same keep-set (one per step, shared by every shard).
  a = augment.chunk_drop_mask(jax.random.key(3), lay.mask, lay.chunk, keep=2)
  np.testing.assert_array_equal(a, augment.chunk_drop_mask(jax.random.key(3), lay.mask, lay.chunk, keep=2))


def test_head_window_mask_by_explicit_construction():
  lay = teacher_forcing_layout(9, 2)
  heads = np.array([True, False, False, True])
  m = np.asarray(augment.head_window_mask(lay.mask, lay.frame_pos, lay.frame_pos, heads, window=3))
  for h in range(4):
    for i in range(len(lay.frame_pos)):
      for j in range(len(lay.frame_pos)):
        want = lay.mask[i, j] and (heads[h] or lay.frame_pos[i] - lay.frame_pos[j] < 3)
        assert m[h, i, j] == want


def test_routing_pool():
  pool = augment.routing_pool(0, 24, 12, 0.25)
  assert pool.shape == (12, 24) and (pool.sum(1) == 6).all()
  assert len({tuple(r) for r in pool}) > 1
  np.testing.assert_array_equal(pool, augment.routing_pool(0, 24, 12, 0.25))


def test_routing_continues_exactly_after_a_restart(tmp_path):
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.recipe.head_windows.update(enabled=True, window=2, pool=3, global_fraction=0.5)
  c.recipe.chunk_drop.update(enabled=True, keep=1)
  tr = Trainer(c, tmp_path, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
  batch = tr.put_batch(next(iter(tr.make_loader())))
  key = jax.random.key(0)

  def steps(state, n):
    with jax.set_mesh(tr.mesh):
      for _ in range(n):
        state, _ = tr.train_step(state, batch, key)
    return state

  straight = steps(tr.init_state(), 4)  # pool entries 0, 1, 2, 0
  ck = tr.checkpointer()
  ck.save(2, steps(tr.init_state(), 2))
  ck.wait()
  restored, step = ck.restore(tr.restore_target())
  ck.close()
  assert step == 2 and restored.routing.shape == (3, 2) and (np.asarray(restored.routing).sum(1) == 1).all()
  np.testing.assert_array_equal(restored.routing, straight.routing)  # the pool is in the checkpoint
  resumed = steps(restored, 2)  # entries 2, 0 again after the restart
  for a, b in zip(jax.tree_util.tree_leaves(resumed.params), jax.tree_util.tree_leaves(straight.params)):
    np.testing.assert_array_equal(a, b)


def _clip(n=9, size=16):
  from jaxwm.data.procedural import ProceduralClips  # pylint: disable=g-import-not-at-top
  return ProceduralClips("train", num_clips=1, num_frames=n, image_hw=(size, size), family="mixed")[0]


def test_palindrome_windows_and_per_source_normalisation():
  from jaxwm.data.window import ClipWindow  # pylint: disable=g-import-not-at-top
  from jaxwm.geometry.formats import opencv_to_opengl  # pylint: disable=g-import-not-at-top
  clip = _clip()
  w = ClipWindow(5, 2, 16, palindrome_prob=1.0).random_map(clip, np.random.default_rng(0))
  for i in range(5):  # out along the path and exactly back
    np.testing.assert_array_equal(w["frames"][i], w["frames"][4 - i])
    np.testing.assert_allclose(w["c2w"][i], w["c2w"][4 - i], atol=1e-6)
  plain = ClipWindow(5, 2, 16).random_map(clip, np.random.default_rng(0))
  assert not np.array_equal(plain["frames"][0], plain["frames"][4]) or not np.allclose(plain["c2w"][0], plain["c2w"][4])
  scaled = ClipWindow(5, 2, 16, scale_divisor=4.0).random_map(clip, np.random.default_rng(0))
  np.testing.assert_allclose(scaled["c2w"][:, :3, 3], plain["c2w"][:, :3, 3] / 4.0, atol=1e-6)
  gl = dict(clip, c2w=opencv_to_opengl(np.asarray(clip["c2w"], np.float64)))
  back = ClipWindow(5, 2, 16, convention="opengl").random_map(gl, np.random.default_rng(0))
  np.testing.assert_allclose(back["c2w"], plain["c2w"], atol=1e-5)


def test_se3_pose_downsampling_across_a_mirror_point():
  from jaxwm.geometry.rotations import downsample_poses, rotation_about_axis  # pylint: disable=g-import-not-at-top
  c2w = np.tile(np.eye(4), (2, 1, 1))
  c2w[0, :3, :3] = rotation_about_axis(np.deg2rad(80.0), 1)
  c2w[1, :3, :3] = rotation_about_axis(np.deg2rad(-80.0), 1)
  c2w[:, 0, 3] = [1.0, 3.0]
  (mean,) = downsample_poses(c2w, 2)
  np.testing.assert_allclose(mean[:3, :3], np.eye(3), atol=1e-9)  # the geodesic midpoint
  np.testing.assert_allclose(mean[:3, 3], [2.0, 0.0, 0.0])
  assert abs(np.linalg.det(c2w[:, :3, :3].mean(0))) < 0.1  # the arithmetic mean is nearly singular


def test_checkpoints_from_before_head_routing_still_restore(tmp_path):
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  tr = Trainer(tiny_config(), tmp_path, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
  state = tr.init_state()
  ck = tr.checkpointer()
  ck.save(1, {k: getattr(state, k) for k in ("step", "params", "opt_state", "ema")})  # the old layout
  ck.wait()
  restored, step = ck.restore(tr.restore_target())
  ck.close()
  assert step == 1 and restored.routing == {}
  for a, b in zip(jax.tree_util.tree_leaves(restored.params), jax.tree_util.tree_leaves(state.params)):
    np.testing.assert_array_equal(a, b)
