"""LOCI hybrid blocks (docs/design.md §7): zero-initialised memory, retention closed forms, history
reaching hybrid blocks only through the memory, streaming == training layout, denoising leaves
the committed state untouched, training in both layouts."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_poses, tiny_config, train_steps
from jaxwm.diffusion import flow
from jaxwm.encodings.gta import TileTensors
from jaxwm.models.conditioning import Cameras
from jaxwm.models.config import CameraConfig, LociConfig, ModelConfig
from jaxwm.models.layer_stacks import join_layers
from jaxwm.models.loci import MemoryPlan
from jaxwm.models.transformer import WanModel
from jaxwm.sampling.streaming import KVCache, chunk_forward, commit, denoise
from jaxwm.training.layout import chunk_ids, diffusion_forcing_layout, teacher_forcing_layout

BASE = ModelConfig(dim=64, num_heads=2, num_layers=3, ffn_dim=64, in_channels=12, out_channels=12, freq_dim=32,
                   camera=CameraConfig(encoding="viewrope"))
FRAMES, CHUNK, HW = 5, 2, (4, 4)


def _cfg(blocks=(1,)):
  return dataclasses.replace(BASE, loci=LociConfig(enabled=True, blocks=blocks, chunk_size=8))


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  c2w = np.stack([random_poses(rng, FRAMES, scale=0.5) for _ in range(2)])
  c2w[:, 0] = np.eye(4)
  intr = np.broadcast_to(np.array([[16.0, 0, 8], [0, 16, 8], [0, 0, 1]]), (2, FRAMES, 3, 3))
  lay = teacher_forcing_layout(FRAMES, CHUNK)
  return {"c2w": jnp.asarray(c2w, jnp.float32), "k": jnp.asarray(intr, jnp.float32), "layout": lay,
          "clip": jnp.asarray(rng.normal(size=(2, FRAMES, *HW, 12)), jnp.float32),
          "noisy": jnp.asarray(rng.normal(size=(2, len(lay.noisy_frames), *HW, 12)), jnp.float32),
          "t": jnp.asarray(rng.uniform(0.1, 0.9, size=(2, len(lay.noisy_frames))), jnp.float32)}


def _frames(lay, d):
  idx = lay.frame_pos.astype(int)
  return lay.frames(2, Cameras(d["c2w"][:, idx], d["k"][:, idx]))


def _apply_fn(model, lay, d):
  return lambda variables, seq, ts: model.apply(variables, seq, ts, _frames(lay, d))


def _seq(d):
  lay = d["layout"]
  seq = jnp.concatenate([d["clip"][:, lay.clean_frames], d["noisy"]], 1)
  ts = jnp.concatenate([jnp.zeros((2, lay.num_clean)), d["t"] * flow.TIMESTEP_SCALE], 1)
  return seq, ts


def _init(model, d):
  seq, ts = _seq(d)
  fn = _apply_fn(model, d["layout"], d)
  return nn.unbox(jax.jit(lambda k: model.init(k, seq, ts, _frames(d["layout"], d)))(jax.random.key(0))), fn


def _with_gate(variables, value=0.3):
  """Every hybrid stack's memory gate set to ``value``."""
  params = dict(variables["params"])
  for name, stack in params.items():
    if isinstance(stack, dict) and "mem_gate" in stack:
      params[name] = {**stack, "mem_gate": jnp.full_like(stack["mem_gate"], value)}
  return {"params": params}


def test_at_init_a_single_chunk_equals_the_plain_backbone(data):
  hybrid, plain = WanModel(_cfg()), WanModel(BASE)
  # One chunk (frames 1, 2) with no history: the hybrid block's attention is the plain one.
  lay = teacher_forcing_layout(3, 2)
  lay = dataclasses.replace(lay, clean_frames=lay.noisy_frames, frame_pos=lay.frame_pos[-2:], chunk=lay.chunk[-2:],
                            noisy=lay.noisy[-2:], mask=np.ones((2, 2), bool), local=np.array([[0, 1], [0, 1]]),
                            writer=np.ones(2, bool))
  d = {**data, "layout": lay}
  seq, ts = data["noisy"][:, :2], data["t"][:, :2] * flow.TIMESTEP_SCALE
  variables = nn.unbox(jax.jit(lambda k: hybrid.init(k, seq, ts, _frames(lay, d)))(jax.random.key(0)))
  assert sorted(k for k in variables["params"] if k.startswith("blocks")) == ["blocks_0_1", "blocks_1_2", "blocks_2_3"]
  assert "memory" not in variables["params"]["blocks_0_1"]  # plain blocks carry no memory parameters
  plain_vars = {"params": join_layers(variables["params"], hybrid.cfg)}
  out_h, entries = _apply_fn(hybrid, lay, d)(variables, seq, ts)
  out_p, _ = _apply_fn(plain, lay, d)(plain_vars, seq, ts)
  np.testing.assert_allclose(out_h, out_p, atol=1e-6)
  assert entries.mem.shape[0] == 1 and float(jnp.abs(entries.mem).max()) > 0  # the hybrid block did write
  assert entries.keys["k"].shape[0] == 2  # plain blocks keep keys, the hybrid one does not


def test_history_reaches_all_hybrid_blocks_only_through_the_memory(data):
  model = WanModel(_cfg(blocks=(0, 1, 2)))
  variables, fn = _init(model, data)
  fn = jax.jit(fn)
  seq, ts = _seq(data)
  lay = data["layout"]
  moved = seq.at[:, 0].add(1.0)  # the first clean frame: history of every later chunk
  later = lay.num_clean + np.flatnonzero(lay.chunk[lay.num_clean:] >= 2)
  base, _ = fn(variables, seq, ts)
  np.testing.assert_allclose(fn(variables, moved, ts)[0][:, later], base[:, later], atol=1e-6)  # gate = 0
  gated = _with_gate(variables)
  base, _ = fn(gated, seq, ts)
  assert float(jnp.abs(fn(gated, moved, ts)[0][:, later] - base[:, later]).max()) > 1e-4
  # Causality: the last noisy chunk does not move anything before it.
  out, _ = fn(gated, seq.at[:, -CHUNK:].add(1.0), ts)
  np.testing.assert_allclose(out[:, :-CHUNK], base[:, :-CHUNK], atol=1e-5)


def test_retention_closed_forms():
  from jaxwm.models import loci  # pylint: disable=g-import-not-at-top
  cfg = _cfg()
  mem = loci.RecurrentMemory(cfg, MemoryPlan.make([1, 1], [True, True]))
  b, n, h, d = 1, 3, cfg.num_heads, cfg.head_dim
  y = jax.random.normal(jax.random.key(0), (b, 2 * n, cfg.dim))
  cam = TileTensors(jnp.broadcast_to(jnp.eye(4), (b, 2 * n, 4, 4)), jnp.broadcast_to(jnp.eye(4), (b, 2 * n, 4, 4)))
  rope = jnp.zeros((b, 2 * n, d // 2))
  s0 = jax.random.normal(jax.random.key(1), (b, h, d, d))
  params = nn.unbox(mem.init(jax.random.key(2), y, cam, rope, s0))["params"]
  no_write = jax.tree_util.tree_map(lambda x: x, params)
  no_write["mem_beta"] = {"kernel": jnp.zeros_like(params["mem_beta"]["kernel"]),
                          "bias": jnp.full_like(params["mem_beta"]["bias"], -60.0)}  # beta = 0: decay only
  _, s = mem.apply({"params": no_write}, y, cam, rope, s0)
  np.testing.assert_allclose(s, 0.7 * s0, rtol=1e-5)  # initial retention
  no_write["mem_retention_a"] = jnp.full_like(params["mem_retention_a"], 3.0)
  _, s = mem.apply({"params": no_write}, y, cam, rope, s0)
  np.testing.assert_allclose(s, 0.2 * s0, rtol=1e-5)  # the floor alpha_min
  # Read before write: the readout of the chunk uses s0 only, whatever it writes.
  read_a, _ = mem.apply({"params": params}, y, cam, rope, s0)
  read_b, _ = mem.apply({"params": no_write}, y, cam, rope, s0)
  np.testing.assert_allclose(read_a, read_b, atol=1e-6)


def test_streaming_equals_training_layout_and_denoising_keeps_the_state(data, tmp_path):
  model = WanModel(_cfg())
  variables, fn = _init(model, data)
  variables = _with_gate(variables)
  seq, ts = _seq(data)
  train_out = jax.jit(fn)(variables, seq, ts)[0]
  lay = data["layout"]
  cache = KVCache.empty(model.cfg, 2, FRAMES, 4)
  commit_j = jax.jit(lambda c, x, p, cams: commit(model, variables, c, x, p, cameras=cams))
  fwd_j = jax.jit(lambda c, x, tt, p, cams: chunk_forward(model, variables, c, x, tt, p, cameras=cams)[0])
  ids = chunk_ids(FRAMES, CHUNK)
  noisy_chunk = lay.chunk[lay.num_clean:]
  for c in range(ids.max() + 1):
    frames = np.flatnonzero(ids == c)
    p = jnp.broadcast_to(jnp.asarray(frames, jnp.float32), (2, len(frames)))
    cams = Cameras(data["c2w"][:, frames], data["k"][:, frames])
    if c > 0:
      sel = np.flatnonzero(noisy_chunk == c)
      v = fwd_j(cache, data["noisy"][:, sel], data["t"][:, sel], p, cams)
      np.testing.assert_allclose(v, train_out[:, lay.num_clean + sel], atol=2e-5, rtol=1e-5)
      state = np.asarray(cache.mem)
      denoise(model, variables, cache, data["noisy"][:, sel], p, flow.sampling_schedule(2, 1.0), cameras=cams)
      np.testing.assert_array_equal(cache.mem, state)  # denoising never writes the state
    before = np.asarray(cache.mem)
    cache = commit_j(cache, data["clip"][:, frames], p, cams)
    assert float(np.abs(np.asarray(cache.mem[0]) - before[0]).max()) > 0  # the commit does
  # The recurrent state travels with the rest of the sampler's cache.
  restored = KVCache.load(cache.save(tmp_path / "cache.npz"))
  for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(cache)):
    np.testing.assert_array_equal(a, b)
  assert restored.mem is not None and restored.keys["k"].shape[0] == 2  # keys of the 2 softmax layers only


@pytest.mark.parametrize("layout", ["diffusion_forcing"])  # teacher forcing: the streaming test above
def test_tiny_hybrid_model_trains(layout, tmp_path):
  c = tiny_config()
  c.model.loci.update(enabled=True, blocks=(1,), chunk_size=16)
  c.recipe.layout = layout
  _, state, losses = train_steps(c, tmp_path)
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert float(jnp.abs(state.params["blocks_1_2"]["mem_gate"]).max()) > 0  # the gate learns


def test_diffusion_forcing_layout_by_hand():
  lay = diffusion_forcing_layout(5, 2)
  np.testing.assert_array_equal(lay.chunk, [0, 1, 1, 2, 2])
  np.testing.assert_array_equal(lay.mask.astype(int), [[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0],
                                                       [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(lay.local, [[0, -1], [1, 2], [1, 2], [3, 4], [3, 4]])
  assert lay.writer.all() and list(lay.noisy_frames) == [1, 2, 3, 4]


def test_loci_config_errors():
  with pytest.raises(ValueError, match="model.loci.blocks"):
    dataclasses.replace(BASE, loci=LociConfig(enabled=True, blocks=(5,)))
  with pytest.raises(ValueError, match="alpha_min"):
    LociConfig(alpha_min=1.5)
  with pytest.raises(ValueError, match="unknown model.loci config key"):
    ModelConfig.from_dict({"loci": {"enable": True}})


def test_attention_probe_names_the_softmax_blocks(data):
  """The co-visibility probe reads the history softmax of blocks 0 and 2 only; it says which they are."""
  from jaxwm.evaluation.attention_probe import attention_weights  # pylint: disable=g-import-not-at-top
  model = WanModel(_cfg(blocks=(1,)))
  variables, _ = _init(model, data)
  cams = {"c2w": data["c2w"][:1], "intrinsics": data["k"][:1]}
  pr = attention_weights(model, variables, data["clip"][:1], cams, FRAMES - 1, CHUNK)
  assert pr["layers"] == [0, 2] and pr["weights"].shape[0] == 2
  np.testing.assert_allclose(pr["weights"].sum(axis=(2, 3)), 1.0, rtol=1e-5)
