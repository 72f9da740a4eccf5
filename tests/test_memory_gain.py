"""Memory gain on constructed models: a copier of the matching history view, a history-blind denoiser,
and the real model's plumbing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.diffusion import flow
from jaxwm.evaluation import memory_gain as mg
from jaxwm.training.layout import make_layout


def _loop_latents(key, b=3, f=9, hw=4, c=6):
  lat = jax.random.normal(key, (b, f, hw, hw, c))
  mirror = [0, 1, 2, 3, 4, 3, 2, 1, 0]  # the way back revisits the way out; frame 8 is frame 0
  return lat[:, np.array(mirror)[:f]]


def _copier(layout):
  """Predicts x0 as the attended clean frame whose content id matches; falls back to zeros."""

  def apply_fn(seq, ts, frames):
    t = ts / flow.TIMESTEP_SCALE
    mask = np.asarray(frames.mask[0])
    out = []
    for q in range(seq.shape[1]):
      if not layout.noisy[q]:
        out.append(jnp.zeros_like(seq[:, q]))
        continue
      want = mirror_of[int(layout.frame_pos[q])]
      hits = [k for k in range(layout.num_clean) if mask[q, k] and mirror_of[int(layout.frame_pos[k])] == want]
      x0 = seq[:, hits[0]] if hits else jnp.zeros_like(seq[:, q])
      tq = t[:, q].reshape(-1, 1, 1, 1)
      out.append((seq[:, q] - x0) / tq)
    return jnp.stack(out, axis=1)

  mirror_of = [0, 1, 2, 3, 4, 3, 2, 1, 0]
  return apply_fn


def test_copier_has_large_gain_and_history_blind_model_has_gain_one():
  layout = make_layout("teacher_forcing", 9, 2)
  lat = _loop_latents(jax.random.key(0))
  errs = mg.return_frame_errors(_copier(layout), lat, None, layout, 8, jax.random.key(1))
  gain = mg.memory_gain(errs)
  for t, (w, w_o) in errs.items():
    np.testing.assert_allclose(w, 0.0, atol=1e-9)  # exact copy: velocity error 0
    assert np.all(w_o > 0.1), (t, w_o)
    assert gain[t] > 1e6

  def blind(seq, ts, frames):  # denoiser of x_t alone: no history
    return seq * 0.7 - 0.1 * ts[..., None, None, None] / 1000.0

  gain = mg.memory_gain(mg.return_frame_errors(blind, lat, None, layout, 8, jax.random.key(1)))
  for t, g in gain.items():
    assert g == pytest.approx(1.0, abs=1e-12), t


def test_without_removes_only_the_first_view():
  layout = make_layout("teacher_forcing", 9, 2)
  mask, writer = mg._without_first_view(layout)  # pylint: disable=protected-access
  pos0 = 0
  assert not mask[1:, pos0].any() and mask[pos0, pos0]
  np.testing.assert_array_equal(mask[:, 1:], layout.mask[:, 1:])
  assert not writer[pos0] and np.array_equal(writer[1:], layout.writer[1:])


def test_bad_return_frame_is_refused():
  layout = make_layout("teacher_forcing", 9, 2)
  with pytest.raises(ValueError, match="return_frame"):
    mg.return_frame_errors(lambda *a: a[0], jnp.zeros((1, 9, 2, 2, 3)), None, layout, 0, jax.random.key(0))


@pytest.mark.parametrize("loci", [False, True])
def test_real_model_runs_and_removing_the_view_changes_the_prediction(loci):
  """The real model's plumbing: both variants run (dense and LOCI) and differ only through frame 0."""
  from jaxwm.models.config import ModelConfig, CameraConfig, LociConfig
  from jaxwm.models.init import init_params
  from jaxwm.models.transformer import WanModel
  import flax.linen as nn

  cfg = ModelConfig(dim=128, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12,
                    camera=CameraConfig(encoding="viewrope"),
                    loci=LociConfig(enabled=loci, blocks=(1,), chunk_size=16))
  model = WanModel(cfg)
  layout = make_layout("teacher_forcing", 5, 2)
  params = nn.unbox(init_params(model, jax.random.key(0), (1, 7, 4, 4, 12), 16))
  lat = jax.random.normal(jax.random.key(2), (2, 5, 4, 4, 12))
  c2w = jnp.broadcast_to(jnp.eye(4), (2, 5, 4, 4))
  k = jnp.broadcast_to(jnp.array([[8.0, 0, 8], [0, 8.0, 8], [0, 0, 1]]), (2, 5, 3, 3))
  errs = mg.return_frame_errors(mg.model_apply_fn(model, params), lat, mg.Cameras(c2w, k), layout, 4,
                                jax.random.key(3), noise_levels=(1.0,))
  w, w_o = errs[1.0]
  assert w.shape == (2,) and np.all(np.isfinite(w)) and np.all(np.isfinite(w_o))
  assert not np.allclose(w, w_o)


def test_training_logs_the_gain_every_k_steps_and_at_the_end(tmp_path):
  """``train.gain_every``: the probe's ``gain_<t>`` for every noise level in ``metrics.jsonl`` at multiples of k
  and at the last step, positive and finite, and nowhere else."""
  import json  # pylint: disable=g-import-not-at-top
  from conftest import tiny_config  # pylint: disable=g-import-not-at-top
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  c = tiny_config(**{"train.num_steps": 3, "train.gain_every": 2, "train.ckpt_every": 3})
  from jaxwm.evaluation.hooks import training_hooks  # pylint: disable=g-import-not-at-top
  run(c, tmp_path, mesh=sh.make_mesh(1, 1, jax.devices()[:1]), progress=False, hooks=training_hooks(c))
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  keys = {f"gain_{t:g}" for t in mg.NOISE_LEVELS}
  assert [r["step"] for r in rows if keys <= r.keys()] == [2, 3]
  assert not any(k in rows[0] for k in keys)
  assert all(0 < r[k] < float("inf") for r in rows[1:] for k in keys)
  covis = {"covis_tf_0.5", "covis_tf_1"}  # the co-visible proxy comes with the gain (jaxwm.evaluation.covisible_probe)
  assert [r["step"] for r in rows if covis <= r.keys()] == [2, 3]
  assert all(0 < r[k] < 100 for r in rows[1:] for k in covis)
