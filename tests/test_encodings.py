"""Camera encodings: ViewRope's relative-rotation identity, invariance to a change of world
frame, PRoPE against its reference formulas, zero-initialised MRoPE/Plücker, channel checks,
and for every encoding: training steps and streaming == teacher-forcing layout."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_poses, random_rotations, tiny_config

from jaxwm.diffusion import flow
from jaxwm.encodings.base import tile_transform
from jaxwm.encodings.channels import resolve_channels
from jaxwm.encodings.prope import PRoPE
from jaxwm.encodings.viewrope import viewrope_rotate
from jaxwm.models.conditioning import Cameras
from jaxwm.models.config import CameraConfig, ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.ops.attention import dot_product_attention
from jaxwm.sampling.streaming import KVCache, chunk_forward, commit
from jaxwm.training.layout import chunk_ids, teacher_forcing_layout

BASE = ModelConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12, freq_dim=32)
NUM_FRAMES, CHUNK, HW, IMG = 5, 2, (4, 4), 16  # latent 4x4, stride 4 -> 16x16 pixel frames
VARIANTS = {
    "viewrope": dict(encoding="viewrope"),
    "viewrope_hw_low_replace": dict(encoding="viewrope", channels="hw_low_replace"),
    "gta": dict(encoding="gta", translation_scale=0.5),
    "prope": dict(encoding="prope"),
    "prope_per_token": dict(encoding="prope", per_token=True),
    "mrope": dict(encoding="mrope"),
    "plucker": dict(encoding="rope3d", plucker=True),
    "worldrope": dict(encoding="worldrope", channels="hw"),
    "worldrope_mixed": dict(encoding="worldrope", channels="hw", mixed_frequencies=True, hypotheses=2),
}


def _cfg(**cam):
  base = BASE if cam.get("channels", "t_low") in ("t_low", "hw") else dataclasses.replace(BASE, dim=128)  # hw >= 12
  return dataclasses.replace(base, camera=CameraConfig(**cam))


def _intrinsics(rng, n):
  k = np.zeros((n, 3, 3))
  k[:, 0, 0] = k[:, 1, 1] = rng.uniform(12, 20, n)
  k[:, 0, 2] = k[:, 1, 2] = 8 + rng.uniform(-1, 1, n)
  k[:, 2, 2] = 1
  return k


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  layout = teacher_forcing_layout(NUM_FRAMES, CHUNK)
  s = len(layout.frame_pos)
  c2w = np.stack([random_poses(rng, NUM_FRAMES, scale=0.5) for _ in range(2)])
  k = np.stack([_intrinsics(rng, NUM_FRAMES) for _ in range(2)])
  return {
      "layout": layout, "s": s,
      "clip": jnp.asarray(rng.normal(size=(2, NUM_FRAMES, *HW, 12)), jnp.float32),
      "noisy": jnp.asarray(rng.normal(size=(2, len(layout.noisy_frames), *HW, 12)), jnp.float32),
      "t": jnp.asarray(rng.uniform(0.1, 0.9, size=(2, len(layout.noisy_frames))), jnp.float32),
      "c2w": c2w, "k": k,
  }


def _seq_cams(d, c2w):
  idx = d["layout"].frame_pos.astype(int)
  return Cameras(jnp.asarray(c2w[:, idx], jnp.float32), jnp.asarray(d["k"][:, idx], jnp.float32))


def _init(model, d):
  x = jnp.zeros((2, d["s"], *HW, 12))
  frames = d["layout"].frames(2, _seq_cams(d, d["c2w"]))
  return nn.unbox(jax.jit(model.init)(jax.random.key(0), x, jnp.zeros((2, d["s"])), frames))


def _perturb_params(variables, scale=0.05):
  """Zero-initialised parts made non-zero, so that the camera paths matter."""
  leaves, tree = jax.tree_util.tree_flatten(variables)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _train_layout(model, variables, d, c2w):
  lay = d["layout"]
  seq = jnp.concatenate([d["clip"][:, lay.clean_frames], d["noisy"]], 1)
  ts = jnp.concatenate([jnp.zeros((2, lay.num_clean)), d["t"] * flow.TIMESTEP_SCALE], 1)
  fwd = jax.jit(lambda v, c: model.apply(v, seq, ts, lay.frames(2, c))[0])
  return fwd(variables, _seq_cams(d, c2w))[:, lay.num_clean:]


def _rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_viewrope_relative_rotation_identity(rng):
  d = 32
  idx = list(range(8, 20))  # four triples
  q = rng.normal(size=(1, 2, 1, d))
  k = rng.normal(size=(1, 2, 1, d))
  rot = random_rotations(rng, 2)[None]
  qr = np.asarray(viewrope_rotate(jnp.asarray(q), jnp.asarray(rot), idx), np.float64)
  kr = np.asarray(viewrope_rotate(jnp.asarray(k), jnp.asarray(rot), idx), np.float64)
  for i in range(2):
    for j in range(2):
      got = qr[0, i, 0, idx] @ kr[0, j, 0, idx]
      want = sum(q[0, i, 0, idx[3 * m:3 * m + 3]] @ rot[0, i].T @ rot[0, j] @ k[0, j, 0, idx[3 * m:3 * m + 3]]
                 for m in range(4))
      # float32 rotations: absolute error ~1e-7 per O(1) term, so a near-zero product needs an absolute bound.
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Channels outside the placement are untouched.
  np.testing.assert_array_equal(qr[..., :8], q[..., :8].astype(np.float32))


@pytest.mark.parametrize("name,world", [("viewrope", "rotation"), ("viewrope_hw_low_replace", "rotation"),
                                        ("gta", "se3"), ("prope", "se3"), ("prope_per_token", "se3"),
                                        ("worldrope", "se3"), ("worldrope_mixed", "se3")])
def test_invariance_to_world_frame(data, rng, name, world):
  model = WanModel(_cfg(**VARIANTS[name]))
  variables = _perturb_params(_init(model, data))
  w = np.eye(4)
  w[:3, :3] = random_rotations(rng, 1)[0]
  if world == "se3":
    w[:3, 3] = rng.normal(size=3)
  base = _train_layout(model, variables, data, data["c2w"])
  moved = _train_layout(model, variables, data, w @ data["c2w"])
  assert _rel(moved, base) <= 1e-5
  # The cameras do matter: moving one frame's camera alone changes the output.
  other = data["c2w"].copy()
  other[:, 2] = w @ other[:, 2]
  assert _rel(_train_layout(model, variables, data, other), base) > 1e-3


def test_prope_with_identity_intrinsics_is_gta(data):
  d = dict(data)
  k = np.zeros_like(d["k"])
  k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2], k[..., 2, 2] = IMG, IMG, IMG / 2, IMG / 2, 1
  d["k"] = k  # normalised intrinsics = identity
  gta, prope = WanModel(_cfg(encoding="gta")), WanModel(_cfg(encoding="prope"))
  variables = _perturb_params(_init(gta, d))
  np.testing.assert_allclose(_train_layout(prope, variables, d, d["c2w"]), _train_layout(gta, variables, d, d["c2w"]),
                             rtol=1e-5, atol=1e-5)


def test_prope_matches_reference_formulas(rng):
  """``prope/per_img_camera.py`` written out: q <- P^T q, k, v <- P^-1 (.), out <- P out on 4-tiles."""
  hw, n, d, h = (8, 12), 6, 16, 2
  c2w, k = random_poses(rng, 2), _intrinsics(rng, 2)
  q, kk, v = (rng.normal(size=(1, 2 * n, h, d)) for _ in range(3))
  cam = PRoPE().tensors(CameraConfig(encoding="prope", vae_stride=2), jnp.asarray(c2w[None], jnp.float32),
                        jnp.asarray(k[None], jnp.float32), (2, 3), (2, 2))
  idx = list(range(d))
  got = dot_product_attention(tile_transform(jnp.asarray(q, jnp.float32), jnp.swapaxes(cam.g, -1, -2), idx),
                              tile_transform(jnp.asarray(kk, jnp.float32), cam.g_inv, idx),
                              tile_transform(jnp.asarray(v, jnp.float32), cam.g_inv, idx))
  got = np.asarray(tile_transform(got, cam.g, idx))
  # Reference, float64.
  w, hh = hw[1], hw[0]
  ps, pinvs = [], []
  for i in range(2):
    kn = np.array([[k[i, 0, 0] / w, 0, k[i, 0, 2] / w - 0.5], [0, k[i, 1, 1] / hh, k[i, 1, 2] / hh - 0.5], [0, 0, 1]])
    lift = np.eye(4)
    lift[:3, :3] = kn
    viewmat = np.linalg.inv(c2w[i])
    ps.append(lift @ viewmat)
    lift_inv = np.eye(4)
    lift_inv[:3, :3] = np.linalg.inv(kn)
    pinvs.append(c2w[i] @ lift_inv)
  def tiles(x, mats):  # x [2n, h, d]; mats per camera
    out = x.copy()
    for t in range(2 * n):
      out[t] = np.einsum("ij,hmj->hmi", mats[t // n], x[t].reshape(h, d // 4, 4)).reshape(h, d)
    return out
  qr = tiles(q[0], [p.T for p in ps])
  kr, vr = tiles(kk[0], pinvs), tiles(v[0], pinvs)
  logits = np.einsum("qhd,khd->hqk", qr, kr) / np.sqrt(d)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ref = tiles(np.einsum("hqk,khd->qhd", probs, vr), ps)
  np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mrope", "plucker"])
def test_zero_initialised_encodings_start_as_rope3d(data, name):
  model = WanModel(_cfg(**VARIANTS[name]))
  variables = _init(model, data)
  plain = WanModel(BASE)
  shared = jax.tree_util.tree_map(lambda x: x, variables)
  params = dict(shared["params"])
  extra = [k for k in params if k.startswith(("mrope", "plucker"))]
  blocks = dict(params["blocks"])
  attn = {k: v for k, v in blocks["attn1"].items() if not k.startswith("mrope")}
  blocks["attn1"] = attn
  params["blocks"] = blocks
  for k in extra:
    params.pop(k)
  out = _train_layout(model, variables, data, data["c2w"])
  ref = _train_layout(plain, {"params": params}, data, data["c2w"])
  np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
  grads = jax.grad(lambda v: jnp.sum(_train_layout(model, v, data, data["c2w"]) ** 2))(variables)["params"]
  if name == "mrope":
    zero_init = [grads["mrope_mlp_out"]["kernel"], grads["blocks"]["attn1"]["mrope_v"]["kernel"],
                 grads["blocks"]["attn1"]["mrope_out"]["kernel"]]
  else:
    zero_init = [grads["plucker_out"]["kernel"]]
  for g in zero_init:
    assert float(jnp.abs(g).max()) > 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_streaming_equals_training_layout(data, name):
  model = WanModel(_cfg(**VARIANTS[name]))
  variables = _perturb_params(_init(model, data))
  train_out = _train_layout(model, variables, data, data["c2w"])
  lay = data["layout"]
  cache = KVCache.empty(model.cfg, 2, NUM_FRAMES, 4)
  commit_j = jax.jit(lambda c, x, pos, cams: commit(model, variables, c, x, pos, cameras=cams))
  fwd_j = jax.jit(lambda c, x, tt, pos, cams: chunk_forward(model, variables, c, x, tt, pos, cameras=cams)[0])
  ids = chunk_ids(NUM_FRAMES, CHUNK)
  noisy_chunk = lay.chunk[lay.num_clean:]
  for c in range(ids.max() + 1):
    frames = np.flatnonzero(ids == c)
    pos = jnp.broadcast_to(jnp.asarray(frames, jnp.float32), (2, len(frames)))
    cams = Cameras(jnp.asarray(data["c2w"][:, frames], jnp.float32), jnp.asarray(data["k"][:, frames], jnp.float32))
    if c > 0:
      sel = np.flatnonzero(noisy_chunk == c)
      v = fwd_j(cache, data["noisy"][:, sel], data["t"][:, sel], pos, cams)
      np.testing.assert_allclose(v, train_out[:, sel], atol=1e-5, rtol=1e-5)
    cache = commit_j(cache, data["clip"][:, frames], pos, cams)


@pytest.mark.parametrize("name", ["worldrope", "worldrope_mixed", "viewrope"])
def test_denoising_with_views_hoisted_equals_step_by_step_forwards(data, name):
  """``denoise`` computes the cache's per-view keys once per chunk (``CameraEncoding.cache_views``: WorldRoPE's
  ``transform_keys`` of every cached key for the chunk's cameras) instead of in each Euler step's forward; its
  result equals the Euler steps of plain ``chunk_forward`` calls, which transform cache and own keys together, and
  the commit pass given the same views writes what it writes computing its own."""
  from jaxwm.encodings.base import model_poses  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.streaming import denoise  # pylint: disable=g-import-not-at-top
  model = WanModel(_cfg(**VARIANTS[name]))
  cfg = model.cfg
  variables = _perturb_params(_init(model, data))
  cache = KVCache.empty(cfg, 2, NUM_FRAMES, 4)
  cams = lambda f: Cameras(jnp.asarray(data["c2w"][:, f], jnp.float32), jnp.asarray(data["k"][:, f], jnp.float32))  # pylint: disable=unnecessary-lambda-assignment
  pos = lambda f: jnp.broadcast_to(jnp.asarray(f, jnp.float32), (2, len(f)))  # pylint: disable=unnecessary-lambda-assignment
  commit_j = jax.jit(lambda c, x, p, k: commit(model, variables, c, x, p, cameras=k))
  for f in ([0], [1, 2]):  # a cache of 3 frames; the chunk 3-4 is denoised against it
    cache = commit_j(cache, data["clip"][:, f], pos(f), cams(f))
  f = [3, 4]
  views = cfg.encoding.cache_views(cfg, cache.keys, model_poses(cams(f).c2w, cfg.camera.translation_scale),
                                   cams(f).intrinsics)
  assert bool(views) == (name != "viewrope")  # only per-view keys have something to hoist
  schedule = flow.sampling_schedule(3, 3.0)
  noise = jax.random.normal(jax.random.key(1), data["clip"][:, :2].shape)
  got = jax.jit(lambda c, x: denoise(model, variables, c, x, pos(f), schedule, cameras=cams(f)))(cache, noise)
  step = jax.jit(lambda c, x, t: chunk_forward(model, variables, c, x, jnp.full((2, 2), t), pos(f), cameras=cams(f))[0])
  want = noise
  for t, t_next in zip(schedule[:-1], schedule[1:]):
    want = flow.euler_step(want, step(cache, want, t), t, t_next)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
  # The commit pass that follows reads the same views: it writes what a commit computing its own writes.
  with_views, alone = (jax.jit(lambda c, x, v: commit(model, variables, c, x, pos(f), cameras=cams(f), views=v))(
      cache, got, v) for v in (views, None))
  for entry in alone.keys:
    np.testing.assert_allclose(with_views.keys[entry], alone.keys[entry], atol=2e-5, rtol=2e-5, err_msg=entry)
  assert set(with_views.keys) == set(cache.keys)  # the views are not stored


@pytest.mark.parametrize("name", ["viewrope", "prope_per_token", "worldrope"])  # mrope/plucker: see zero-init tests
def test_tiny_model_trains_with_encoding(name, tmp_path):
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.model.camera = dict(CameraConfig(**VARIANTS[name]).__dict__)
  tr = Trainer(c, tmp_path, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
  state = tr.init_state()
  batch = tr.put_batch(next(iter(tr.make_loader())))
  before = [np.asarray(x) for x in jax.tree_util.tree_leaves(state.params)]
  losses = []
  with jax.set_mesh(tr.mesh):
    for _ in range(3):
      state, m = tr.train_step(state, batch, jax.random.key(0))
      losses.append(float(m["loss"]))
  assert all(np.isfinite(losses))
  assert any(np.abs(np.asarray(a) - b).max() > 0 for a, b in zip(jax.tree_util.tree_leaves(state.params), before))


@pytest.mark.parametrize("enc,channels,match", [
    ("viewrope", [[0, 10]], "not a multiple of 3"),
    ("gta", [[0, 6]], "not a multiple of 4"),
    ("prope", [[28, 36]], "outside the head's 32 channels"),
    ("viewrope", "t_high", "is not a placement"),
    ("viewrope", "hw_low", "needs 12 channels in each of the h and w RoPE blocks"),
    ("worldrope", "t_low", "must be whole h/w RoPE pairs"),
    ("gta", [[0, 8], [4, 12]], "overlap"),
])
def test_bad_channel_ranges_are_rejected(enc, channels, match):
  with pytest.raises(ValueError, match=match):
    ModelConfig.from_dict({**{k: v for k, v in BASE.__dict__.items() if k != "camera"},
                           "camera": {"encoding": enc, "channels": channels}})
  assert resolve_channels("hw_low", 128, "viewrope", 3) == (((74, 86), (116, 128)), False)
  assert resolve_channels("t_low", 128, "gta", 4) == (((32, 44),), False)
