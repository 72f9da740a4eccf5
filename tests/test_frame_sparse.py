"""Frame-sparse attention (ViewRope §3.3, docs/design.md §6): the reference against dense attention, the
selection on hand-built cases and counterfactual modes, the Pallas kernels (interpret mode)
against the reference, and a tiny model that trains and streams with ``frame_topk``."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config, train_steps
from jaxwm import kernels
from jaxwm.diffusion import flow
from jaxwm.evaluation.selection_plot import save_selection_maps, selection_image
from jaxwm.models.conditioning import Cameras
from jaxwm.models.config import AttentionConfig, CameraConfig, ModelConfig
from jaxwm.ops.attention import expand_frame_mask
from jaxwm.models.transformer import WanModel
from jaxwm.ops import frame_sparse as fs
from jaxwm.ops.attention import dot_product_attention
from jaxwm.sampling.streaming import KVCache, StreamingSampler, chunk_forward, commit
from jaxwm.training.layout import chunk_ids, teacher_forcing_layout

N, H, D = 6, 2, 8


def _qkv(key, fq, fk, b=2, dtype=jnp.float32):
  ks = jax.random.split(key, 3)
  return (jax.random.normal(ks[0], (b, fq * N, H, D), dtype), jax.random.normal(ks[1], (b, fk * N, H, D), dtype),
          jax.random.normal(ks[2], (b, fk * N, H, D), dtype))


def _layout_masks(num_frames=9, chunk=2, b=2):
  lay = teacher_forcing_layout(num_frames, chunk)
  mask = jnp.broadcast_to(jnp.asarray(lay.mask), (b,) + lay.mask.shape)
  local = jnp.broadcast_to(jnp.asarray(lay.local), (b,) + lay.local.shape)
  return lay, mask, local, mask & ~fs.indices_to_mask(local, mask.shape[-1])


def test_layout_local_frames_by_hand():
  lay = teacher_forcing_layout(5, 2)  # clean [0, 1, 2], noisy [1, 2, 3, 4]
  np.testing.assert_array_equal(lay.local, [[0, -1], [1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [5, 6]])
  hist = lay.mask & ~np.asarray(fs.indices_to_mask(jnp.asarray(lay.local), 7))
  np.testing.assert_array_equal(np.flatnonzero(hist[5]), [0, 1, 2])  # noisy chunk 2 selects among clean chunks 0, 1
  np.testing.assert_array_equal(np.flatnonzero(hist[1]), [0])


def test_topk_covering_history_equals_dense_chunk_causal():
  lay, mask, local, hist = _layout_masks()
  s = mask.shape[1]
  q, k, v = _qkv(jax.random.key(0), s, s)
  out, sel = fs.frame_sparse_attention(q, k, v, tokens_per_frame=N, history=hist, local_idx=local, top_k=s)
  dense = dot_product_attention(q, k, v, expand_frame_mask(mask, N))
  np.testing.assert_allclose(out, dense, atol=1e-5, rtol=1e-5)
  # Every history frame was selected, and padding fills the rest.
  np.testing.assert_array_equal(fs.indices_to_mask(sel, s), hist)


def test_forced_selection_equals_dense_masked_to_the_set():
  _, mask, local, hist = _layout_masks()
  s = mask.shape[1]
  q, k, v = _qkv(jax.random.key(1), s, s)
  chosen = fs.select_frames(jax.random.normal(jax.random.key(2), hist.shape), hist, 2)  # an arbitrary set
  idx = jnp.concatenate([local, chosen], -1)
  out = fs.gathered_attention(q, k, v, idx, tokens_per_frame=N)
  allowed = fs.indices_to_mask(idx, s)
  dense = dot_product_attention(q, k, v, expand_frame_mask(allowed, N))
  np.testing.assert_allclose(out, dense, atol=1e-5, rtol=1e-5)
  assert int(allowed.sum()) < int(mask.sum())  # the set was a strict subset


def test_selection_finds_the_frame_whose_keys_equal_the_query():
  fk, target = 7, 4
  q, k, _ = _qkv(jax.random.key(3), 1, fk, b=1)
  k = k * 0.1
  k = k.at[:, target * N:(target + 1) * N].set(q[:, :N])  # keys of frame 4 equal the query
  scores = fs.frame_scores(q, k, N, fs.sample_positions(jax.random.key(4), N, 3))
  hist = jnp.ones((1, 1, fk), bool)
  assert int(fs.select_frames(scores, hist, 1)[0, 0, 0]) == target
  # Eq. 9 against a brute-force loop.
  pos = np.asarray(fs.sample_positions(None, N, 4))
  qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)
  brute = [np.mean([qn[0, p, h] @ kn[0, j * N + p, h] for h in range(H) for p in pos]) / D**0.5 for j in range(fk)]
  np.testing.assert_allclose(fs.frame_scores(q, k, N, jnp.asarray(pos))[0, 0], brute, rtol=1e-5)


def test_counterfactual_modes():
  _, _, _, hist = _layout_masks(num_frames=13, chunk=2)
  scores = jax.random.normal(jax.random.key(5), hist.shape)
  top = fs.select_frames(scores, hist, 2)
  for seed in range(5):
    key = jax.random.key(seed)
    rand = fs.select_frames(scores, hist, 2, mode="random", key=key)
    excl = fs.select_frames(scores, hist, 2, mode="exclude_selected", key=key)
    assert bool(jnp.all(jnp.where(rand >= 0, jnp.take_along_axis(hist, jnp.maximum(rand, 0), -1), True)))
    # random returns min(k, |history|) frames, all valid history.
    np.testing.assert_array_equal((rand >= 0).sum(-1), jnp.minimum(hist.sum(-1), 2))
    chosen = fs.indices_to_mask(excl, hist.shape[-1])
    assert not bool(jnp.any(chosen & fs.indices_to_mask(top, hist.shape[-1])))
    assert not bool(jnp.any(chosen & ~hist))
    np.testing.assert_array_equal((excl >= 0).sum(-1), jnp.minimum(jnp.maximum(hist.sum(-1) - 2, 0), 2))
  with pytest.raises(ValueError, match="needs a PRNG key"):
    fs.select_frames(scores, hist, 2, mode="random")


def test_sliding_window_keeps_the_latest_history_frames():
  hist = jnp.asarray([[[True, True, False, True, True, False]]])
  np.testing.assert_array_equal(fs.recent_frames(hist, 2), [[[4, 3]]])
  np.testing.assert_array_equal(fs.recent_frames(hist, 6)[0, 0], [4, 3, 1, 0, -1, -1])


KERNEL_CASES = {  # (tokens per frame, block, dtype)
    "frame_not_multiple_of_block": (6, 4, jnp.float32),
    "frame_multiple_of_block": (8, 4, jnp.float32),
    "bfloat16": (6, 4, jnp.bfloat16),
}


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_gpu"])
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_reference(impl, case):
  from pallas_kernels import frame_sparse_attention as kernels  # pylint: disable=g-import-not-at-top
  n, block, dtype = KERNEL_CASES[case]
  fn = kernels.tpu_attention if impl == "pallas_tpu" else kernels.gpu_attention
  fq, fk = 3, 5
  d = D if impl == "pallas_tpu" else 12  # GPU: head channels zero-padded to a power of two
  ks = jax.random.split(jax.random.key(6), 4)
  q, k, v = (jax.random.normal(kk, (1, f * n, H, d), dtype) for kk, f in zip(ks, (fq, fk, fk)))
  # top_k larger than the history: -1 slots, also before valid ones; frame 2 attends one frame only.
  idx = jnp.asarray([[[0, 2, -1], [4, -1, 1], [-1, -1, 3]]], jnp.int32)
  w = jax.random.normal(ks[3], q.shape)
  ref_f = lambda q, k, v: fs.gathered_attention(q, k, v, idx, tokens_per_frame=n)
  ker_f = lambda q, k, v: fn(q, k, v, idx, tokens_per_frame=n, block_q=block, block_k=block, interpret=True)
  loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) * w)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(ker_f(q, k, v), np.float32), np.asarray(ref_f(q, k, v), np.float32),
                             atol=tol, rtol=tol)
  g_ref = jax.grad(loss(ref_f), argnums=(0, 1, 2))(q, k, v)
  g_ker = jax.grad(loss(ker_f), argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", g_ker, g_ref):
    assert a.dtype == b.dtype, name
    scale = float(jnp.abs(b.astype(jnp.float32)).max())
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol * max(scale, 1.0),
                               rtol=tol, err_msg=f"d{name}")


@pytest.mark.parametrize("impl", kernels.impls("frame_sparse_attention"))
def test_dispatch_matches_reference(impl):
  _, _, local, hist = _layout_masks(num_frames=5)
  s = hist.shape[1]
  q, k, v = _qkv(jax.random.key(2), s, s)
  kw = dict(tokens_per_frame=N, history=hist, local_idx=local, top_k=2)
  out_r, sel_r = fs.frame_sparse_attention(q, k, v, **kw)
  out, sel = kernels.frame_sparse_attention(q, k, v, impl=impl, interpret=True, **kw)
  np.testing.assert_array_equal(sel, sel_r)
  np.testing.assert_allclose(out, out_r, atol=1e-5, rtol=1e-5)


def test_unknown_impl_is_an_error():
  q, k, v = _qkv(jax.random.key(0), 1, 1)
  with pytest.raises(ValueError, match=r"impl must be one of .*got impl='triton'"):
    kernels.gathered_attention(q, k, v, jnp.zeros((2, 1, 1), jnp.int32), tokens_per_frame=N, impl="triton")
  with pytest.raises(ValueError, match="impl must be one of"):
    kernels.frame_sparse_attention(q, k, v, tokens_per_frame=N, history=jnp.zeros((2, 1, 1), bool),
                                   local_idx=jnp.zeros((2, 1, 1), jnp.int32), top_k=1, impl="pallas")


# --- the model -------------------------------------------------------------------------------------------

BASE = ModelConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12, freq_dim=32,
                   camera=CameraConfig(encoding="viewrope"))
FRAMES, CHUNK, HW = 7, 2, (4, 4)


def _cams(rng, f):
  from conftest import random_poses  # pylint: disable=g-import-not-at-top
  c2w = np.stack([random_poses(rng, f, scale=0.5) for _ in range(2)])
  c2w[:, 0] = np.eye(4)
  k = np.broadcast_to(np.array([[16.0, 0, 8], [0, 16, 8], [0, 0, 1]]), (2, f, 3, 3))
  return jnp.asarray(c2w, jnp.float32), jnp.asarray(k, jnp.float32)


@pytest.mark.parametrize("sparsity", ["frame_topk", "sliding_window"])
def test_streaming_equals_training_layout_when_sparse(sparsity):
  cfg = dataclasses.replace(BASE, attention=AttentionConfig(sparsity=sparsity, top_k=1, window=1, num_samples=3))
  model = WanModel(cfg)
  rng = np.random.default_rng(0)
  lay = teacher_forcing_layout(FRAMES, CHUNK)
  s = len(lay.frame_pos)
  c2w, intr = _cams(rng, FRAMES)
  clip = jnp.asarray(rng.normal(size=(2, FRAMES, *HW, 12)), jnp.float32)
  noisy = jnp.asarray(rng.normal(size=(2, len(lay.noisy_frames), *HW, 12)), jnp.float32)
  t = jnp.asarray(rng.uniform(0.1, 0.9, size=(2, len(lay.noisy_frames))), jnp.float32)
  idx = lay.frame_pos.astype(int)
  seq_cams = Cameras(c2w[:, idx], intr[:, idx])
  seq = jnp.concatenate([clip[:, lay.clean_frames], noisy], 1)
  ts = jnp.concatenate([jnp.zeros((2, lay.num_clean)), t * flow.TIMESTEP_SCALE], 1)
  frames_in = lay.frames(2, seq_cams)
  variables = jax.jit(model.init)(jax.random.key(0), seq, ts, frames_in)
  fwd = jax.jit(lambda x: model.apply(variables, x, ts, frames_in))
  train_out, entries = fwd(seq)
  assert entries.selected.shape == (2, 2, s, 1)
  # Sparse attention matters: dense attention over the same history differs.
  dense_model = WanModel(BASE)
  dense = dense_model.apply(variables, seq, ts, frames_in)[0]
  assert float(jnp.abs(dense[:, lay.num_clean:] - train_out[:, lay.num_clean:]).max()) > 1e-4
  # Causality: perturbing the last noisy chunk moves nothing before it.
  moved, _ = fwd(seq.at[:, -CHUNK:].add(1.0))
  np.testing.assert_allclose(moved[:, :-CHUNK], train_out[:, :-CHUNK], atol=1e-5)

  cache = KVCache.empty(cfg, 2, FRAMES, 4)
  commit_j = jax.jit(lambda c, x, p, cams: commit(model, variables, c, x, p, cameras=cams))
  fwd_j = jax.jit(lambda c, x, tt, p, cams: chunk_forward(model, variables, c, x, tt, p, cameras=cams))
  ids = chunk_ids(FRAMES, CHUNK)
  noisy_chunk = lay.chunk[lay.num_clean:]
  for c in range(ids.max() + 1):
    frames = np.flatnonzero(ids == c)
    p = jnp.broadcast_to(jnp.asarray(frames, jnp.float32), (2, len(frames)))
    cams = Cameras(c2w[:, frames], intr[:, frames])
    if c > 0:
      sel = np.flatnonzero(noisy_chunk == c)
      v, own = fwd_j(cache, noisy[:, sel], t[:, sel], p, cams)
      np.testing.assert_allclose(v, train_out[:, lay.num_clean + sel], atol=1e-5, rtol=1e-5)
      # Cache slots are clip frames, as are the clean layout positions: the same frames were selected.
      np.testing.assert_array_equal(own.selected, entries.selected[:, :, lay.num_clean + sel])
    cache = commit_j(cache, clip[:, frames], p, cams)


def test_tiny_model_trains_and_streams_with_frame_topk(tmp_path):
  c = tiny_config()
  c.data.update(num_frames=7, clip_frames=13)
  c.model.attention.update(sparsity="frame_topk", top_k=1, num_samples=4)
  tr, state, losses = train_steps(c, tmp_path)
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  lat = 16 // c.data.latent_stride
  sampler = StreamingSampler(tr.model, {"params": state.params}, batch_size=1, max_frames=7, latent_hw=(lat, lat),
                             channels=48, num_steps=2)
  c2w, intr = _cams(np.random.default_rng(1), 7)
  out = sampler.rollout(jnp.zeros((1, 1, lat, lat, 48)), 7, 2, jax.random.key(0),
                        cameras={"c2w": c2w[:1], "intrinsics": intr[:1]})
  assert out.shape == (1, 7, lat, lat, 48) and bool(jnp.all(jnp.isfinite(out)))
  # Counterfactual selections stream too (they draw keys from the first commit on).
  att = dataclasses.replace(tr.model.cfg.attention, selection="random")
  rand = StreamingSampler(WanModel(dataclasses.replace(tr.model.cfg, attention=att)), {"params": state.params},
                          batch_size=1, max_frames=7, latent_hw=(lat, lat), channels=48, num_steps=2)
  out_r = rand.rollout(jnp.zeros((1, 1, lat, lat, 48)), 7, 2, jax.random.key(0),
                       cameras={"c2w": c2w[:1], "intrinsics": intr[:1]})
  np.testing.assert_array_equal(out_r[:, :3], out[:, :3])  # one history frame for chunk 1: top-1 = random-1
  assert float(np.abs(out_r - out).max()) > 0


def test_selection_maps_are_saved(tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  selected = np.array([[[0, -1], [0, 1], [2, 0]], [[-1, -1], [1, -1], [0, 1]]])
  path = save_selection_maps(tmp_path / "sel.png", selected, 4, local=np.array([[1], [2], [3]]), cell=4)
  img = np.asarray(Image.open(path))[..., :3]
  assert min(img.shape[:2]) >= 600  # a figure a reader can read
  assert (img == [230, 50, 40]).all(-1).any() and (img == [60, 110, 230]).all(-1).any()  # selected, own chunk
  m = selection_image(selected[0], 4, local=np.array([[1], [2], [3]]), cell=4)
  assert m.shape == (12, 16, 3)
  assert tuple(m[0, 0]) == (230, 50, 40) and tuple(m[0, 4]) == (60, 110, 230)  # selected, then own chunk


@pytest.mark.parametrize("bad,match", [
    (dict(sparsity="topk"), "sparsity must be one of"),
    (dict(selection="best"), "selection must be one of"),
    (dict(impl="triton"), "impl must be one of"),
    (dict(top_k=0), "top_k must be >= 1"),
])
def test_attention_config_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    ModelConfig.from_dict({"attention": bad})
  with pytest.raises(ValueError, match="unknown model.attention config key"):
    ModelConfig.from_dict({"attention": {"topk": 3}})
  with pytest.raises(ValueError, match="not supported with model.camera.encoding=.worldrope."):
    ModelConfig(dim=64, num_heads=2, camera=CameraConfig(encoding="worldrope", channels="hw"),
                attention=AttentionConfig(sparsity="frame_topk"))
