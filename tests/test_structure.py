"""One home per concept: a new camera encoding is one class and one registry entry; poses are
normalised causally and identically in training and streaming; the interactive API equals the
rollout; LOCI hybrid layers cost only what they use."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_poses, tiny_config, train_steps

from jaxwm.data.window import ClipWindow
from jaxwm.encodings import registry
from jaxwm.encodings.base import CameraEncoding
from jaxwm.encodings.rope3d import apply_rotary
from jaxwm.geometry.rotations import rotation_about_axis
from jaxwm.models.conditioning import Cameras
from jaxwm.models.config import CameraConfig, LociConfig, ModelConfig
from jaxwm.models.init import init_params
from jaxwm.models.transformer import WanModel
from jaxwm.sampling.streaming import StreamingSampler
from jaxwm.training.layout import teacher_forcing_layout
from jaxwm.training.step import make_loss_fn


def _yaw(c2w):
  """Heading of the camera's optical axis about the world y axis: ``[...]``."""
  z = c2w[..., :3, 2]
  return jnp.arctan2(z[..., 0], z[..., 2])


class YawRope(CameraEncoding):
  """A toy encoding: rotary phases ``yaw * w`` on channel pairs, so logits see relative headings."""
  name = "toy_yaw"
  unit = 2

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    return jnp.repeat(_yaw(c2w), grid_hw[0] * grid_hw[1], axis=1)  # [B, S*N]

  def _rotate(self, x, yaw, plan):
    pairs = np.asarray(sorted({c // 2 for c in plan.idx}))
    angles = jnp.zeros(x.shape[:2] + (x.shape[-1] // 2,))
    angles = angles.at[..., pairs].set(yaw[..., None] * (1.0 + np.arange(len(pairs))))
    return apply_rotary(x, angles)

  def encode_q(self, q, cam, plan):
    return self._rotate(q, cam, plan)

  def encode_kv(self, k, v, cam, plan, params):
    return self._rotate(k, cam, plan), v


@pytest.fixture(name="toy")
def _toy():
  registry.register_encoding(YawRope())
  yield "toy_yaw"
  registry.ENCODINGS.pop("toy_yaw")


def test_a_new_encoding_is_one_class_and_one_registry_entry(toy, tmp_path):
  c = tiny_config()
  c.model.camera.update(encoding=toy, channels="t_low")
  tr, state, losses = train_steps(c, tmp_path)
  assert all(np.isfinite(losses))
  cfg = tr.model.cfg
  assert cfg.camera_conditioned
  with pytest.raises(ValueError, match="not a multiple of 2"):
    ModelConfig(dim=64, num_heads=2, camera=CameraConfig(encoding=toy, channels=((0, 3),)))
  # Invariant to a common change of heading (the logits see yaw differences only), and the
  # cameras matter: turning one frame alone changes what the model streams.
  hw = c.data.image_size // c.data.latent_stride
  sampler = StreamingSampler(tr.model, {"params": state.params}, batch_size=1, max_frames=5, latent_hw=(hw, hw),
                             channels=48, num_steps=2)
  rng = np.random.default_rng(0)
  yaws = rng.uniform(-1, 1, 5)
  c2w = np.stack([np.asarray(rotation_about_axis(a, 1)) for a in yaws])
  c2w4 = np.tile(np.eye(4), (5, 1, 1))
  c2w4[:, :3, :3] = c2w
  k = np.tile(np.array([[16.0, 0, 8], [0, 16, 8], [0, 0, 1]]), (5, 1, 1))
  first = jax.random.normal(jax.random.key(1), (1, 1, hw, hw, 48))

  def stream(poses):
    return sampler.rollout(first, 5, 2, jax.random.key(0), {"c2w": poses[None], "intrinsics": k[None]})

  base = stream(c2w4)
  turn = np.eye(4)
  turn[:3, :3] = np.asarray(rotation_about_axis(0.7, 1))
  np.testing.assert_allclose(stream(turn @ c2w4), base, atol=2e-5)
  other = c2w4.copy()
  other[3] = turn @ other[3]
  assert float(np.abs(stream(other) - base).max()) > 1e-4


class _RecordPoses(CameraEncoding):
  """Records the (model) poses every forward sees, keyed by frame (frame id = focal length - 100)."""
  name = "record_poses"
  uses_channels = False
  seen = []

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    jax.debug.callback(lambda f, p: self.seen.append((np.asarray(f), np.asarray(p))), intrinsics[..., 0, 0], c2w)
    return None


def _frame_poses(seen):
  """``{frame: pose}`` from recorded ``(focal [B, S], poses [B, S, 4, 4])``; a frame seen twice agrees
  (empty cache slots, focal 1, are skipped)."""
  out = {}
  for focal, poses in seen:
    for f, p in zip(np.rint(focal[0] - 100).astype(int), poses[0]):
      if f < 0:
        continue
      if f in out:
        np.testing.assert_allclose(p, out[f], atol=1e-6)
      out[f] = p
  return out


def test_pose_normalisation_is_causal_and_the_same_in_training_and_streaming(tmp_path):
  """Streaming a long trajectory gives every frame the pose training gives it on any window starting with
  the trajectory, and the same relative poses on any other window (same translation units)."""
  rec = registry.register_encoding(_RecordPoses())
  try:
    cfg = ModelConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=32, in_channels=12, out_channels=12, freq_dim=16,
                      camera=CameraConfig(encoding="record_poses", translation_scale=0.5, vae_stride=2))
    model = WanModel(cfg)
    n = 25
    rng = np.random.default_rng(0)
    traj = random_poses(rng, n, scale=3.0)
    traj = np.linalg.inv(traj[0]) @ traj  # re-anchored, as sample.py gives it
    focal = 100.0 + np.arange(n)
    k = np.zeros((n, 3, 3))
    k[:, 0, 0] = k[:, 1, 1] = focal
    k[:, 0, 2] = k[:, 1, 2] = 4.0
    k[:, 2, 2] = 1
    params = nn.unbox(init_params(model, jax.random.key(0), (1, 2, 4, 4, 12), 8))
    sampler = StreamingSampler(model, {"params": params}, batch_size=1, max_frames=n, latent_hw=(4, 4), channels=12,
                               num_steps=1)
    rec.seen.clear()
    sampler.rollout(jnp.zeros((1, 1, 4, 4, 12)), n, 4, jax.random.key(0),
                    {"c2w": traj[None].astype(np.float32), "intrinsics": k[None].astype(np.float32)})
    streamed = _frame_poses(rec.seen)
    assert sorted(streamed) == list(range(n))
    clip = {"frames": np.zeros((n, 8, 8, 3), np.uint8), "c2w": traj, "intrinsics": k}
    for frames, start in ((5, 0), (9, 0), (17, 0), (9, 13), (17, 8)):
      window = ClipWindow(frames, 1, 8).random_map(clip, _FixedStart(start))
      layout = teacher_forcing_layout(frames, 2)
      loss = make_loss_fn(model, layout, tiny_config().recipe, 2)  # 8x8 frames -> 4x4x12 latents
      rec.seen.clear()
      loss(params, {k_: jnp.asarray(v)[None] for k_, v in window.items()}, jax.random.key(1))
      trained = _frame_poses(rec.seen)
      assert sorted(trained) == list(range(start, start + frames))
      for f in trained:
        if start == 0:  # same anchor: the same pose
          np.testing.assert_allclose(trained[f], streamed[f], atol=1e-5)
        rel_t = np.linalg.inv(trained[start]) @ trained[f]
        rel_s = np.linalg.inv(streamed[start]) @ streamed[f]
        np.testing.assert_allclose(rel_t, rel_s, atol=1e-4)  # same units whatever the window
      np.testing.assert_allclose(trained[start + 1][:3, 3],  # translations times the fixed scale, nothing else
                                 0.5 * (np.linalg.inv(traj[start]) @ traj[start + 1])[:3, 3], atol=1e-5)
  finally:
    registry.ENCODINGS.pop("record_poses")


class _FixedStart:
  """A stand-in for ``np.random.Generator`` that makes ``ClipWindow`` start at ``start``, no palindrome."""

  def __init__(self, start):
    self.start = start

  def integers(self, lo, hi):
    assert lo <= self.start < hi
    return self.start

  def random(self):
    return 1.0


def test_interactive_generation_equals_the_rollout():
  """A user giving cameras chunk by chunk (not knowing the rest) gets exactly what a rollout of the whole
  trajectory gives: nothing is normalised over the trajectory (GTA reads translations)."""
  cfg = ModelConfig(dim=32, num_heads=2, num_layers=2, ffn_dim=32, in_channels=12, out_channels=12, freq_dim=16,
                    camera=CameraConfig(encoding="gta", channels="all", vae_stride=2))
  model = WanModel(cfg)
  params = nn.unbox(init_params(model, jax.random.key(0), (1, 2, 4, 4, 12), 8))
  sampler = StreamingSampler(model, {"params": params}, batch_size=1, max_frames=7, latent_hw=(4, 4), channels=12,
                             num_steps=2)
  rng = np.random.default_rng(3)
  traj = random_poses(rng, 7, scale=4.0)
  traj = (np.linalg.inv(traj[0]) @ traj)[None].astype(np.float32)
  k = np.tile(np.array([[8.0, 0, 4], [0, 8, 4], [0, 0, 1]], np.float32), (1, 7, 1, 1))
  first = jax.random.normal(jax.random.key(2), (1, 1, 4, 4, 12))
  key = jax.random.key(5)
  rolled = sampler.rollout(first, 7, 2, key, {"c2w": traj, "intrinsics": k})
  cams = Cameras(jnp.asarray(traj), jnp.asarray(k))
  session = sampler.session(first, key, cams.frames(slice(0, 1)))
  for c in range(3):
    session.next({"c2w": traj[:, 1 + 2 * c:3 + 2 * c], "intrinsics": k[:, 1 + 2 * c:3 + 2 * c]})
  np.testing.assert_allclose(session.frames, rolled, atol=1e-6)
  with pytest.raises(ValueError, match="free cache slots"):
    session.next(cams.frames(slice(1, 3)))
  # Causal: the future's poses (here: three times farther away) leave every earlier chunk as it was.
  far = traj.copy()
  far[:, 5:, :3, 3] *= 3.0
  moved = sampler.rollout(first, 7, 2, key, {"c2w": far, "intrinsics": k})
  np.testing.assert_array_equal(moved[:, :5], rolled[:, :5])
  assert float(np.abs(moved[:, 5:] - rolled[:, 5:]).max()) > 1e-4


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def test_loci_hybrid_layers_carry_memory_only_where_used():
  """At the Wan2.2-5B shape: LOCI's parameters = the backbone + 15 memory branches (closed form)."""
  from configs import wan22_ti2v_5b  # pylint: disable=g-import-not-at-top
  base = ModelConfig.from_dict(wan22_ti2v_5b.get_config().model)
  loci = dataclasses.replace(base, loci=LociConfig(enabled=True))

  def abstract(cfg):
    return jax.eval_shape(lambda key: nn.unbox(init_params(WanModel(cfg), key, (1, 2, 4, 4, 48), 64)),
                          jax.random.key(0))

  p_base, p_loci = abstract(base), abstract(loci)
  d, h = base.dim, base.num_heads
  # q, k, v, out: dim x dim + bias; beta: dim -> H; retention: [mean; first] (2 dim) -> H * Dh/2, and a_h; gate.
  branch = 4 * (d * d + d) + (d * h + h) + (2 * d * (d // 2) + d // 2) + h + d
  assert _count(p_loci) == _count(p_base) + 15 * branch
  assert len(loci.layer_groups) == 17
  for name, stack in p_loci.items():
    if name.startswith("blocks_"):
      lo, hi = map(int, name.split("_")[1:])
      assert ("memory" in stack) == (lo in loci.loci.blocks), name
      assert jax.tree_util.tree_leaves(stack)[0].shape[0] == hi - lo


def test_hybrid_layers_compute_no_history_softmax():
  """A model whose every layer is hybrid, with the memory gate closed: outputs ignore the history
  entirely (no history softmax), and its streaming cache holds no keys."""
  cfg = ModelConfig(dim=32, num_heads=2, num_layers=2, ffn_dim=32, in_channels=12, out_channels=12, freq_dim=16,
                    camera=CameraConfig(encoding="viewrope", channels=((0, 6),), vae_stride=2),
                    loci=LociConfig(enabled=True, blocks=(0, 1), chunk_size=8))
  model = WanModel(cfg)
  layout = teacher_forcing_layout(5, 2)
  s = len(layout.frame_pos)
  params = nn.unbox(init_params(model, jax.random.key(0), (1, s, 4, 4, 12), 8))
  rng = np.random.default_rng(0)
  seq = jnp.asarray(rng.normal(size=(1, s, 4, 4, 12)), jnp.float32)
  cams = Cameras.identity(1, s, 8.0, 4.0)
  fwd = jax.jit(lambda x: model.apply({"params": params}, x, jnp.zeros((1, s)), layout.frames(1, cams))[0])
  base = fwd(seq)
  moved = fwd(seq.at[:, 0].add(3.0))  # the first frame: history of every later chunk
  own = np.flatnonzero(layout.chunk != 0)
  np.testing.assert_allclose(moved[:, own], base[:, own], atol=1e-6)
  from jaxwm.models.cache import KVCache  # pylint: disable=g-import-not-at-top
  cache = KVCache.empty(cfg, 1, 5, 4)
  assert cache.keys["k"].shape[0] == 0 and cache.mem.shape[0] == 2
  # No score matrix over the sequence is ever formed (a masked dense softmax would form [.., L, L]).
  tokens = s * 4
  jaxpr = jax.make_jaxpr(lambda x: model.apply({"params": params}, x, jnp.zeros((1, s)), layout.frames(1, cams))[0])(seq)
  assert not [v.aval.shape for v in _all_outputs(jaxpr.jaxpr) if v.aval.shape[-2:] == (tokens, tokens)]
  plain = dataclasses.replace(cfg, loci=LociConfig(enabled=False))
  plain_jaxpr = jax.make_jaxpr(lambda x: WanModel(plain).apply(
      {"params": init_params(WanModel(plain), jax.random.key(0), (1, s, 4, 4, 12), 8)}, x, jnp.zeros((1, s)),
      layout.frames(1, cams))[0])(seq)
  assert [v for v in _all_outputs(plain_jaxpr.jaxpr) if v.aval.shape[-2:] == (tokens, tokens)]  # the check sees one


def _all_outputs(jaxpr):
  """Every equation output of ``jaxpr`` and of the jaxprs inside it (scans, remat, custom rules)."""
  for eqn in jaxpr.eqns:
    yield from (v for v in eqn.outvars if hasattr(v.aval, "shape"))
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _all_outputs(inner)


def _recurrent_kernel(q, k, v, g, beta, *, initial_state, interpret, scale=None, output_final_state=True,
                      chunk_size=64):
  """A 'kernel' as a new backend would add one (the reference's signature plus ``interpret``): here the
  token-by-token delta rule, an algorithm independent of the chunked reference it stands in for."""
  from jaxwm.ops import delta_rule as dr  # pylint: disable=g-import-not-at-top
  del interpret, chunk_size
  return dr.delta_rule_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state)


def test_a_new_kernel_is_one_function_and_one_table_line(monkeypatch):
  """``kernels.IMPLEMENTATIONS``: one line (here :func:`register_implementation`) makes ``impl=<name>`` reach the
  kernel through the one dispatch and makes ``model.loci.impl`` accept the name; unknown names are refused with
  the list."""
  from jaxwm import kernels  # pylint: disable=g-import-not-at-top
  from jaxwm.ops import delta_rule as dr  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(kernels.IMPLEMENTATIONS, "delta_rule", dict(kernels.IMPLEMENTATIONS["delta_rule"]))
  kernels.register_implementation("delta_rule", "recurrent_jnp", _recurrent_kernel)
  assert kernels.impls("delta_rule") == ("xla", "pallas_tpu", "pallas_gpu", "cpu_flash", "recurrent_jnp")
  ks = jax.random.split(jax.random.key(0), 6)
  b, t, h, d = 1, 11, 2, 4
  q, k, v = (jax.random.normal(x, (b, t, h, d)) for x in ks[:3])
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  g = -jax.nn.softplus(jax.random.normal(ks[3], (b, t, h, d)))
  beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, h)))
  s0 = jax.random.normal(ks[5], (b, h, d, d))
  o, s = kernels.delta_rule_chunked(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=4,
                                    impl="recurrent_jnp")
  o_ref, s_ref = dr.delta_rule_chunked(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=4)
  np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=1e-5)
  assert LociConfig(impl="recurrent_jnp").impl == "recurrent_jnp"
  with pytest.raises(ValueError, match=r"delta-rule impl must be one of \('xla', 'pallas_tpu', 'pallas_gpu', "
                     r"'cpu_flash', 'recurrent_jnp'\); got impl='nope'"):
    kernels.delta_rule_chunked(q, k, v, g, beta, impl="nope")
  with pytest.raises(ValueError, match="already has an implementation 'pallas_tpu'"):
    kernels.register_implementation("delta_rule", "pallas_tpu", _recurrent_kernel)


def test_a_new_task_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
  """``jaxwm.tasks.TASKS``: a :class:`jaxwm.training.runner.Task` in its own module (here a counter with no model)
  plus one registry line; the shared loop gives it the log cadence, the non-finite stop, checkpoint cadence,
  hooks and the workdir lock."""
  import json  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  from jaxwm.training import runner  # pylint: disable=g-import-not-at-top
  from jaxwm.training.workdir import run_locked  # pylint: disable=g-import-not-at-top

  class Counter(runner.Task):
    name = "count"

    def __init__(self, config, workdir):
      self.config, self.workdir, self.num_steps, self.saved = config, workdir, config.train.num_steps, []

    def checkpointer(self):
      return type("NoCkpt", (), {"latest_step": lambda s: self.saved[-1] if self.saved else None,
                                 "close": lambda s: None})()

    def make_loader(self):
      return iter(range(100))

    def restore_or_init(self, ckpt, data_iter):
      return 0.0, 0

    def step(self, state, host_batch, step):
      state += host_batch
      return state, {"total": state, "check": float("inf") if step == 3 else 1.0}

    def loss(self, metrics):
      return metrics["total"]

    def summarise(self, window, rate):
      return {"total": window[-1]["total"], "steps": len(window)}

    def on_save(self, ckpt, done, state, data_iter):
      self.saved.append(done)

  seen = []

  class Spy(runner.Hook):
    def scalars(self, task, state, done):
      return {"spy": float(done)}

    def after_save(self, task, state, done):
      seen.append(done)

  module = type(sys)("counting_task")
  module.run = lambda config, workdir, mesh=None, progress=True, hooks=(): run_locked(
      lambda c, w, m, p: run_steps_keep(Counter(c, w), p, hooks), config, workdir, mesh, progress)
  made = []

  def run_steps_keep(task, progress, hooks):
    made.append(task)
    return runner.run_steps(task, progress, hooks)

  monkeypatch.setitem(sys.modules, "counting_task", module)
  monkeypatch.setitem(tasks.TASKS, "count", tasks.TaskEntry("counting_task"))  # the one line
  c = tiny_config(**{"train.num_steps": 3, "train.log_every": 2, "train.ckpt_every": 2})
  c.train.task = "count"
  _, history = tasks.run(c, tmp_path / "w", progress=False, hooks=[Spy()])
  assert history == [0.0, 1.0, 3.0] and made[0].saved == [2, 3] and seen == [1, 2, 3]
  rows = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 2, "total": 1.0, "steps": 2, "spy": 2.0}, {"step": 3, "total": 3.0, "steps": 1, "spy": 3.0}]
  c.train.num_steps = 4  # step 4's metrics are not finite: stopped before its checkpoint
  made.clear()
  with pytest.raises(runner.NonFiniteLossError, match=r"non-finite count state at step 4 \(check inf\)"):
    tasks.run(c, tmp_path / "w2", progress=False, hooks=())
  assert made[0].saved == [2]


def test_no_script_directory_shadows_the_standard_library():
  """``benchmarks/`` and the repository root are put on ``sys.path`` by scripts and tests; a module there named as a
  standard library module (``benchmarks/encodings.py`` was) shadows it in every subprocess that inherits the path,
  and Python may not even start. (``configs/`` is a package, imported as ``configs.<name>``.)"""
  import pathlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[1]
  names = {p.relative_to(root).as_posix(): p.stem for d in (root, root / "benchmarks") for p in d.glob("*.py")}
  assert names and not [path for path, stem in names.items() if stem in sys.stdlib_module_names]
