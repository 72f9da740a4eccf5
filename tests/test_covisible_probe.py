"""The teacher-forced co-visible proxy: its history mask keeps only the first view, and its PSNR is the pooled
masked PSNR of the one-step prediction (an oracle velocity gives the exact frames; a velocity that predicts frame 0
copied gives exactly the copy reference)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.evaluation import covisible, covisible_probe
from jaxwm.training.layout import teacher_forcing_layout


def test_first_view_only_mask():
  lay = teacher_forcing_layout(9, 2)
  mask, writer = covisible_probe.first_view_only(lay)
  pos0 = int(np.flatnonzero(~lay.noisy & (lay.frame_pos == 0))[0])
  others = ~lay.noisy & (lay.frame_pos != 0)
  for q in np.flatnonzero(lay.noisy):
    keys = np.flatnonzero(mask[q])
    assert mask[q, pos0] and not mask[q, others].any()
    assert set(keys) == {pos0} | set(np.flatnonzero(lay.noisy & (lay.chunk == lay.chunk[q])))
  assert all(mask[i, i] for i in range(len(mask)))  # no empty row
  assert writer.tolist() == [i == pos0 for i in range(len(writer))]


class _Oracle:
  """Stands in for the model: returns the velocity that makes ``x0_hat`` equal ``target`` latents."""

  def __init__(self, probe, target):
    self.probe, self.target = probe, target

  def __call__(self, seq, ts, frames):
    n = self.probe.layout.num_clean
    t = ts[:, n:, None, None, None] / 1000.0
    v = (seq[:, n:] - self.target) / t
    return jnp.concatenate([jnp.zeros_like(seq[:, :n]), v], axis=1)


@pytest.fixture(scope="module")
def probe():
  from tests.conftest import tiny_config  # pylint: disable=g-import-not-at-top
  return covisible_probe.CovisProbe(tiny_config(), model=None, num_clips=3)


def test_oracle_velocity_scores_exact_and_copy_scores_the_copy_reference(probe):
  lay = probe.layout
  x0 = probe.latents[:, np.asarray(lay.noisy_frames)]
  exact = probe.predictions(None, apply_fn=_Oracle(probe, x0))
  assert all(np.abs(p - probe.gt).max() < 0.51 for p in exact.values())
  copy = jnp.broadcast_to(probe.latents[:, :1], x0.shape)
  scores = {t: covisible.masked_psnr(np.rint(p), probe.gt, probe.masks)
            for t, p in probe.predictions(None, apply_fn=_Oracle(probe, copy)).items()}
  for v in scores.values():
    assert v == pytest.approx(probe.references["copy"], abs=1e-6)
  assert probe.references["copy"] < 30 and probe.references["mean"] < 30
