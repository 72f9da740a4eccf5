"""Backbone, teacher-forcing layout and streaming: causality, layout/streaming equivalence,
compile-once streaming, guidance, latents, flow matching, the Wan2.2-5B shape."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.diffusion import flow
from jaxwm.models import vae
from jaxwm.models.config import ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.sampling import StreamingSampler
from jaxwm.sampling import streaming
from jaxwm.sampling.streaming import KVCache, chunk_forward, commit
from jaxwm.training.layout import chunk_ids, teacher_forcing_layout

CFG = ModelConfig(dim=32, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12, freq_dim=32,
                  text_dim=16)
NUM_FRAMES, CHUNK, HW = 7, 2, (4, 4)  # chunks: {0}, {1,2}, {3,4}, {5,6}


@pytest.fixture(scope="module")
def setup():
  model = WanModel(CFG)
  layout = teacher_forcing_layout(NUM_FRAMES, CHUNK)
  s = len(layout.frame_pos)
  x = jnp.zeros((1, s, *HW, CFG.in_channels))
  variables = nn.unbox(jax.jit(model.init)(jax.random.key(0), x, jnp.zeros((1, s))))
  rng = np.random.default_rng(0)
  clip = jnp.asarray(rng.normal(size=(2, NUM_FRAMES, *HW, CFG.in_channels)), jnp.float32)
  noisy = jnp.asarray(rng.normal(size=(2, len(layout.noisy_frames), *HW, CFG.in_channels)), jnp.float32)
  t = jnp.asarray(rng.uniform(0.1, 0.9, size=(2, len(layout.noisy_frames))), jnp.float32)
  fwd = jax.jit(lambda v, seq, ts: model.apply(v, seq, ts, layout.frames(2))[0])
  return model, layout, variables, clip, noisy, t, fwd


def _training_output(setup, clip, noisy):
  _, layout, variables, _, _, t, fwd = setup
  seq = jnp.concatenate([clip[:, layout.clean_frames], noisy], 1)
  ts = jnp.concatenate([jnp.zeros((2, layout.num_clean)), t * flow.TIMESTEP_SCALE], 1)
  return fwd(variables, seq, ts)[:, layout.num_clean:]


def test_layout_mask_by_hand():
  lay = teacher_forcing_layout(5, 2)  # chunks {0}, {1,2}, {3,4}
  np.testing.assert_array_equal(chunk_ids(5, 2), [0, 1, 1, 2, 2])
  np.testing.assert_array_equal(lay.clean_frames, [0, 1, 2])
  np.testing.assert_array_equal(lay.noisy_frames, [1, 2, 3, 4])
  c, n = True, False
  # rows: clean 0, clean 1, clean 2, noisy 1, noisy 2, noisy 3, noisy 4
  expected = np.array([
      [c, n, n, n, n, n, n],
      [c, c, c, n, n, n, n],
      [c, c, c, n, n, n, n],
      [c, n, n, c, c, n, n],
      [c, n, n, c, c, n, n],
      [c, c, c, n, n, c, c],
      [c, c, c, n, n, c, c],
  ])
  np.testing.assert_array_equal(lay.mask, expected)
  with pytest.raises(ValueError, match="must be 1 \\+ k \\* chunk_size"):
    teacher_forcing_layout(6, 2)


def test_training_layout_is_causal(setup):
  _, layout, _, clip, noisy, _, _ = setup
  base = _training_output(setup, clip, noisy)
  noisy_chunk = layout.chunk[layout.num_clean:]
  for c in (1, 2):
    future = np.flatnonzero(chunk_ids(NUM_FRAMES, CHUNK) > c)
    clip2 = clip.at[:, future].add(5.0)
    noisy2 = noisy.at[:, np.flatnonzero(noisy_chunk > c)].add(5.0)
    out = _training_output(setup, clip2, noisy2)
    keep = np.flatnonzero(noisy_chunk <= c)
    np.testing.assert_allclose(out[:, keep], base[:, keep], atol=1e-6)
    assert np.abs(np.asarray(out - base)).max() > 1e-3  # the perturbation does reach later chunks


def test_streaming_equals_training_layout(setup):
  model, layout, variables, clip, noisy, t, _ = setup
  train_out = _training_output(setup, clip, noisy)
  n = (HW[0] // 2) * (HW[1] // 2)
  cache = KVCache.empty(CFG, 2, NUM_FRAMES, n)
  commit_j = jax.jit(lambda c, x, pos: commit(model, variables, c, x, pos))
  fwd_j = jax.jit(lambda c, x, tt, pos: chunk_forward(model, variables, c, x, tt, pos)[0])
  ids = chunk_ids(NUM_FRAMES, CHUNK)
  noisy_chunk = layout.chunk[layout.num_clean:]
  for c in range(ids.max() + 1):
    frames = np.flatnonzero(ids == c)
    pos = jnp.broadcast_to(jnp.asarray(frames, jnp.float32), (2, len(frames)))
    if c > 0:  # denoise chunk c against the clean history in the cache
      sel = np.flatnonzero(noisy_chunk == c)
      v = fwd_j(cache, noisy[:, sel], t[:, sel], pos)
      np.testing.assert_allclose(v, train_out[:, sel], atol=1e-5, rtol=1e-5)
    cache = commit_j(cache, clip[:, frames], pos)
  assert int(cache.length) == NUM_FRAMES


def test_denoising_leaves_cache_untouched_and_streaming_is_causal(setup):
  model, _, variables, clip, _, _, _ = setup
  sampler = StreamingSampler(model, variables, batch_size=2, max_frames=NUM_FRAMES, latent_hw=HW,
                             channels=CFG.in_channels, num_steps=3)
  first = clip[:, :1]
  key = jax.random.key(1)
  full = sampler.rollout(first, NUM_FRAMES, CHUNK, key)
  assert full.shape == (2, NUM_FRAMES, *HW, CFG.in_channels)
  np.testing.assert_array_equal(full[:, 0], first[:, 0])
  # A shorter rollout with the same keys reproduces the earlier chunks exactly: later chunks
  # (here: absent) cannot influence them.
  short = sampler.rollout(first, 5, CHUNK, key)
  np.testing.assert_allclose(short, full[:, :5], atol=1e-6)
  # Denoising reads the cache and never writes it.
  cache = sampler.start(first)
  before = jax.tree_util.tree_map(np.asarray, cache)
  streaming._denoise_jit(model=model, variables=variables, cache=cache,  # pylint: disable=protected-access
                         noise=jnp.ones((2, CHUNK, *HW, CFG.in_channels)), frame_pos=jnp.ones((2, CHUNK)),
                         schedule=sampler.schedule, context=None, guidance=1.0)
  for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(cache)):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_streaming_compiles_once(setup):
  model, _, variables, clip, _, _, _ = setup
  sampler = StreamingSampler(model, variables, batch_size=2, max_frames=11, latent_hw=HW, channels=CFG.in_channels,
                             num_steps=2)
  cache = sampler.start(clip[:, :1])
  _, cache = sampler.generate(cache, jax.random.key(0), CHUNK)
  sizes = (streaming._denoise_jit._cache_size(), streaming._commit_jit._cache_size())  # pylint: disable=protected-access
  for c in range(4):
    _, cache = sampler.generate(cache, jax.random.key(c + 1), CHUNK)
  assert (streaming._denoise_jit._cache_size(), streaming._commit_jit._cache_size()) == sizes  # pylint: disable=protected-access
  assert int(cache.length) == 11


def test_classifier_free_guidance():
  cfg = ModelConfig(**{**CFG.__dict__, "cross_attn": True})
  model = WanModel(cfg)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(1, 1, *HW, cfg.in_channels)), jnp.float32)
  ctx = jnp.asarray(np.random.default_rng(2).normal(size=(1, 3, cfg.text_dim)), jnp.float32)
  variables = nn.unbox(jax.jit(model.init)(jax.random.key(0), x, jnp.zeros((1, 1)), context=ctx))
  key = jax.random.key(3)
  cond = StreamingSampler(model, variables, batch_size=1, max_frames=3, latent_hw=HW, channels=cfg.in_channels,
                          num_steps=1, context=ctx)
  unc = StreamingSampler(model, variables, batch_size=1, max_frames=3, latent_hw=HW, channels=cfg.in_channels,
                         num_steps=1, context=jnp.zeros_like(ctx))
  g = StreamingSampler(model, variables, batch_size=1, max_frames=3, latent_hw=HW, channels=cfg.in_channels,
                       num_steps=1, context=ctx, guidance=4.0)
  # One Euler step from t=1 to 0: x0 = z - v, so guided = z - (v_u + 4 (v_c - v_u)).
  z = jax.random.normal(key, (1, 2, *HW, cfg.in_channels))
  xc, _ = cond.generate(cond.start(x), key, 2)
  xu, _ = unc.generate(unc.start(x), key, 2)
  xg, cache = g.generate(g.start(x), key, 2)
  vc, vu = z - xc, z - xu
  np.testing.assert_allclose(xg, z - (vu + 4.0 * (vc - vu)), atol=1e-4)
  assert cache.keys["k"].shape[1] == 2  # one cache row per branch
  with pytest.raises(ValueError, match="guidance"):
    StreamingSampler(WanModel(CFG), variables, batch_size=1, max_frames=3, latent_hw=HW, channels=12, guidance=2.0)


def test_space_to_depth_latents():
  frames = np.random.default_rng(0).integers(0, 256, size=(2, 3, 8, 12, 3), dtype=np.uint8)
  lat = vae.encode(jnp.asarray(frames), 4)
  assert lat.shape == (2, 3, 2, 3, 48)
  # Latent pixel (a, b), channel (i * 4 + j) * 3 + c holds frame pixel (4a + i, 4b + j), colour c.
  np.testing.assert_allclose(lat[1, 2, 1, 2, (3 * 4 + 1) * 3 + 2], frames[1, 2, 7, 9, 2] / 127.5 - 1, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(vae.to_uint8(vae.decode(lat, 4))), frames)


def test_flow_matching_closed_forms():
  x0, eps = jnp.full((1, 2, 3), 2.0), jnp.full((1, 2, 3), -1.0)
  t = jnp.array([[0.25, 1.0]])
  xt = flow.noise(x0, eps, t)
  np.testing.assert_allclose(xt[0, 0], 0.75 * 2 - 0.25)
  np.testing.assert_allclose(xt[0, 1], -1.0)
  # One exact Euler step along the true velocity recovers x0 from any t.
  v = flow.velocity_target(x0, eps)
  np.testing.assert_allclose(flow.euler_step(xt, v, t[..., None], 0.0), x0, atol=1e-6)
  s = flow.sampling_schedule(4, shift=3.0)
  u = np.linspace(1, 0, 5)
  np.testing.assert_allclose(s, 3 * u / (1 + 2 * u), atol=1e-6)


def test_wan22_ti2v_5b_shape():
  from configs import wan22_ti2v_5b  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_dict(wan22_ti2v_5b.get_config().model)
  model = WanModel(cfg)
  abstract = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 1, 4, 4, 48)), jnp.zeros((1, 1)),
                                                 context=jnp.zeros((1, 2, 4096))), jax.random.key(0))
  n = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(nn.unbox(abstract)))
  d, f, layers = 3072, 14336, 30
  per_block = (2 * (4 * (d * d + d) + 2 * d)  # self- and cross-attention (q, k, v, out, q/k norms)
               + (d * f + f) + (f * d + d)  # FFN
               + 6 * d + 2 * d)  # modulation table, cross-attention LayerNorm
  rest = (4 * 48 * d + d) + (256 * d + d) + (d * d + d) + (d * 6 * d + 6 * d) + (4096 * d + d) + (d * d + d) \
      + 2 * d + (d * 4 * 48 + 4 * 48)
  assert n == layers * per_block + rest
  print(f"Wan2.2-TI2V-5B transformer: {n / 1e9:.3f}B parameters")
  assert 4.9e9 < n < 5.1e9


def test_model_config_rejects_bad_values():
  with pytest.raises(ValueError, match="unknown model config key"):
    ModelConfig.from_dict({"dims": 3})
  with pytest.raises(ValueError, match="not divisible by model.num_heads"):
    ModelConfig(dim=30, num_heads=4)


def test_remat_policies_give_the_same_gradients(setup):
  _, layout, variables, clip, noisy, t, _ = setup
  seq = jnp.concatenate([clip[:, layout.clean_frames], noisy], 1)
  ts = jnp.concatenate([jnp.zeros((2, layout.num_clean)), t * flow.TIMESTEP_SCALE], 1)
  grads = []
  for policy in ("none", "full", "dots_saveable", "dots_and_kernels"):
    m = WanModel(ModelConfig(**{**CFG.__dict__, "remat": policy}))
    loss = lambda v, m=m: jnp.sum(m.apply(v, seq, ts, layout.frames(2))[0] ** 2)
    grads.append(jax.jit(jax.grad(loss))(variables))
  for g in grads[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(grads[0])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # recomputation reorders float sums


def test_per_frame_timesteps_equal_per_token(setup):
  """Timesteps per frame ``[B, S]`` modulate each frame's tokens exactly as the same timesteps given per
  token ``[B, S*N]`` (the per-frame path never materialises the per-token modulation)."""
  model, layout, variables, clip, noisy, t, fwd = setup
  seq = jnp.concatenate([clip[:, layout.clean_frames], noisy], 1)
  ts = jnp.concatenate([jnp.zeros((2, layout.num_clean)), t * flow.TIMESTEP_SCALE], 1)
  n = (HW[0] // CFG.patch_size[1]) * (HW[1] // CFG.patch_size[2])
  per_frame = fwd(variables, seq, ts)
  per_token = fwd(variables, seq, jnp.repeat(ts, n, axis=1))
  np.testing.assert_allclose(per_frame, per_token, rtol=1e-5, atol=1e-5)
  # Per-token timesteps that differ within a frame are honoured (not averaged per frame).
  ts_tok = jnp.repeat(ts, n, axis=1).at[:, -1].set(500.0)
  out = fwd(variables, seq, ts_tok)
  assert not np.allclose(out[:, -1], per_frame[:, -1], atol=1e-4)
  with pytest.raises(ValueError, match="timesteps must have shape"):
    model.apply(variables, seq, ts[:, :-1], layout.frames(2))
