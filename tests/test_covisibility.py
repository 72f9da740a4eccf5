"""Co-visibility from depth against closed forms (a fronto-parallel wall seen from shifted and turned
cameras, an occluder), the co-visible mass against its definition, the attention probe's weights
(rows sum to one, nothing on masked or unselected frames) and ReWorld's revisit pairs."""

import dataclasses

import numpy as np

from jaxwm.evaluation.covisibility import covisible_mass, token_covisibility
from jaxwm.evaluation.loop_closure import revisit_pairs

H = W = 64
F_PX = 32.0
K = np.array([[F_PX, 0, W / 2], [0, F_PX, H / 2], [0, 0, 1]])


def _cams(xs, yaw_deg=None):
  c2w = np.tile(np.eye(4), (len(xs), 1, 1))
  c2w[:, 0, 3] = xs
  if yaw_deg is not None:
    a = np.radians(yaw_deg)
    c2w[1, :3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
  return c2w, np.tile(K, (len(xs), 1, 1))


def test_wall_shifted_by_one_token():
  # A wall at z = 2; moving the camera by 1 m shifts the image by f * 1 / 2 = 16 px = one token (4 x 4 grid).
  z = 2.0
  depth = np.full((2, H, W), z)
  c2w, k = _cams([0.0, 1.0])
  cov = token_covisibility(depth, c2w, k, 0, (4, 4))
  assert cov.shape == (16, 2, 16)
  np.testing.assert_array_equal(cov[:, 0], np.eye(16, dtype=bool))  # a frame with itself: the same token
  want = np.zeros((16, 16), bool)
  for r in range(4):
    for c in range(1, 4):
      want[r * 4 + c, r * 4 + c - 1] = True  # the camera moved right: content moves one token left
  np.testing.assert_array_equal(cov[:, 1], want)


def test_turned_away_and_occluded_frames_see_nothing():
  depth = np.full((2, H, W), 2.0)
  c2w, k = _cams([0.0, 0.0], yaw_deg=180.0)
  assert not token_covisibility(depth, c2w, k, 0, (4, 4))[:, 1].any()
  c2w, k = _cams([0.0, 0.0])
  occluded = depth.copy()
  occluded[1] = 1.0  # something 1 m in front of the second camera hides the wall
  assert not token_covisibility(occluded, c2w, k, 0, (4, 4))[:, 1].any()
  assert token_covisibility(depth, c2w, k, 0, (4, 4))[:, 1].any()


def test_covisible_mass_against_its_definition():
  rng = np.random.default_rng(0)
  attn = rng.random((3, 4, 5))
  attn /= attn.sum(axis=(1, 2), keepdims=True)
  covis = rng.random((3, 4, 5)) < 0.3
  covis[2] = False  # a query without co-visible keys: excluded
  history = np.array([True, True, False, True])
  r = covisible_mass(attn, covis, history)
  for q in range(2):
    h = sum(attn[q, f, n] for f in range(4) for n in range(5) if history[f])
    v = sum(attn[q, f, n] for f in range(4) for n in range(5) if history[f] and covis[q, f, n])
    nv = sum(covis[q, f, n] for f in range(4) for n in range(5) if history[f])
    np.testing.assert_allclose(r["mass"][q], v / h)
    np.testing.assert_allclose(r["chance"][q], nv / 15)
  assert np.isnan(r["mass"][2])
  uniform = np.where(history[None, :, None], 1.0, 0.0) * np.ones((3, 4, 5))
  ru = covisible_mass(uniform, covis, history)
  np.testing.assert_allclose(ru["mass"][:2], ru["chance"][:2])  # uniform attention sits at chance


def test_revisit_pairs_follow_reworld():
  assert revisit_pairs(8) == [(0, 8), (1, 7)]
  # k = 96 latents: t < 19.2 and gap 95 - 2t >= 48, at most five pairs.
  assert revisit_pairs(95) == [(0, 95), (1, 94), (2, 93), (3, 92), (4, 91)]


def test_probe_weights_on_the_tiny_checkpoint(tiny_checkpoint):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation.attention_probe import attention_weights  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  config, model, variables, _ = load_model(workdir)
  f = config.data.num_frames
  lat = jax.random.normal(jax.random.key(0), (1, f, 4, 4, 48))
  c2w = jnp.tile(jnp.eye(4), (1, f, 1, 1)).at[:, :, 0, 3].set(jnp.linspace(0, 1, f))
  cams = {"c2w": c2w, "intrinsics": jnp.tile(jnp.asarray(K, jnp.float32), (1, f, 1, 1))}
  pr = attention_weights(model, variables, lat, cams, f - 1, config.recipe.chunk_size)
  w = pr["weights"]  # [L, N, Fk, N]
  assert w.shape[0] == model.cfg.num_layers and w.shape[2] == len(pr["key_frames"])
  assert pr["layers"] == list(range(model.cfg.num_layers))
  np.testing.assert_allclose(w.sum(axis=(2, 3)), 1.0, rtol=1e-5)
  # Keys the layout masks (later clean frames, other noisy chunks) get nothing; the history gets something.
  reach = pr["history"] | (np.arange(len(pr["history"])) >= len(pr["history"]) - config.recipe.chunk_size)
  assert np.all(w[:, :, ~reach] == 0) and np.all(w[:, :, pr["history"]].sum(axis=(2, 3)) > 0)
  # A frame-sparse version of the same parameters attends only the selected history frames.
  att = dataclasses.replace(model.cfg.attention, sparsity="frame_topk", top_k=2)
  sparse = WanModel(dataclasses.replace(model.cfg, attention=att))
  ps = attention_weights(sparse, variables, lat, cams, f - 1, config.recipe.chunk_size)
  assert ps["selected"].shape == (model.cfg.num_layers, 2)
  for layer in range(model.cfg.num_layers):
    keep = set(ps["selected"][layer][ps["selected"][layer] >= 0].tolist())
    hist = np.flatnonzero(ps["history"])
    dropped = [j for j in hist if j not in keep]
    assert len(keep) == 2 and np.all(ps["weights"][layer][:, dropped] == 0)
    np.testing.assert_allclose(ps["weights"][layer].sum(axis=(1, 2)), 1.0, rtol=1e-5)
