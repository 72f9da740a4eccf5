"""Teacher-forced co-visible proxy: how well a model moves the first view into later frames, without sampling.

On a fixed batch of eval loops, every frame ``j`` strictly between the first and the return frame is
noised to ``x_t = (1 - t) x0 + t eps`` in the training layout (teacher forcing), with the first frame
as the only history (every other clean frame removed from attention and from the recurrent memory,
as when the first chunk after the given frame is generated). One model call predicts the clean
frame, ``x0_hat = x_t - t v_theta(x_t, t | frame 0)`` (flow matching, ``v = eps - x0``), and the proxy
is the PSNR of ``x0_hat`` on frame ``j``'s pixels co-visible with frame 0
(:mod:`jaxwm.evaluation.covisible`), pooled over frames:

  P(t) = 10 log10(255^2 / mean_{j, u in M_j, c} (x0_hat_j(u, c) - x_j(u, c))^2).

At ``t = 1`` the input is pure noise, so only the first view can make ``P`` exceed the mean-colour
level; the same pooled PSNR of frame 0's mean colour (``mean``) and of frame 0 copied (``copy``) come
with it. Logged during training as ``covis_tf_<t>`` next to the memory gain.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.diffusion import flow
from jaxwm.evaluation import covisible
from jaxwm.evaluation.memory_gain import _jitted_apply, model_apply_fn
from jaxwm.models.conditioning import Cameras, Frames
from jaxwm.models.loci import MemoryPlan

NOISE_LEVELS = (0.5, 1.0)


def first_view_only(layout):
  """``(mask, writer)`` of ``layout`` with every clean frame but frame 0 removed: no position attends them (each
  keeps itself) and only frame 0 writes the recurrent memory."""
  mask = np.array(layout.mask)
  drop = np.flatnonzero(~layout.noisy & (layout.frame_pos != 0))
  diag = mask[drop, drop]
  mask[:, drop] = False
  mask[drop, drop] = diag
  writer = np.array(layout.writer) & (~layout.noisy & (layout.frame_pos == 0))
  return mask, writer


class CovisProbe:
  """``CovisProbe(config, model, num_clips)(params) -> {"covis_tf_0.5": P, "covis_tf_1": P}`` (module doc).

  Clips spread over the 35 rotation loops, as the memory gain's (:class:`jaxwm.evaluation.memory_gain.GainProbe`);
  frames whose co-visible share is below :data:`jaxwm.evaluation.covisible.MIN_FRACTION` are left out.
  ``reference()`` gives the same pooled PSNR for the ``mean`` and ``copy`` baselines.
  """

  def __init__(self, config, model, num_clips=8, noise_levels=NOISE_LEVELS):
    from jaxwm.data.procedural import EVAL_LOOPS  # pylint: disable=g-import-not-at-top
    from jaxwm.evaluation.baselines import baseline_video  # pylint: disable=g-import-not-at-top
    from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
    from jaxwm.sampling.clips import eval_clip  # pylint: disable=g-import-not-at-top
    from jaxwm.training.layout import make_layout  # pylint: disable=g-import-not-at-top
    if num_clips < 1:
      raise ValueError(f"num_clips must be >= 1; got {num_clips}")
    d = config.data
    idx = np.linspace(0, len(EVAL_LOOPS) - 1, num_clips).round().astype(int)
    clips = [eval_clip(config, int(i)) for i in idx]
    self.layout = make_layout("teacher_forcing", d.num_frames, config.recipe.chunk_size)
    self.stride = d.latent_stride
    factor = d.render_size // d.image_size
    noisy = np.asarray(self.layout.noisy_frames)
    sel, masks, gts, means, copies = [], [], [], [], []
    for b, c in enumerate(clips):
      src = c["meta"]["source"]
      sl = c["frame_index"]
      cov, _, _ = covisible.covisible_masks(src["depth"][sl], src["c2w"][sl], src["intrinsics"][sl], factor)
      mean, copy = (baseline_video(n, c["frames"][0], len(c["frames"])) for n in ("mean", "copy"))
      for j in range(1, c["return_frame"]):
        if cov[j].mean() >= covisible.MIN_FRACTION and j in noisy:
          sel.append((b, int(np.flatnonzero(noisy == j)[0])))
          masks.append(cov[j])
          gts.append(c["frames"][j])
          means.append(mean[j])
          copies.append(copy[j])
    if not sel:
      raise ValueError("no in-between frame of the probe's loops has co-visible pixels")
    self.sel = np.asarray(sel)
    self.masks, self.gt = np.stack(masks), np.stack(gts)
    self.references = {"mean": covisible.masked_psnr(np.stack(means), self.gt, self.masks),
                       "copy": covisible.masked_psnr(np.stack(copies), self.gt, self.masks)}
    self.latents = vae.encode(jnp.asarray(np.stack([c["frames"] for c in clips])), self.stride)
    self.cameras = Cameras(jnp.asarray(np.stack([c["c2w"] for c in clips])),
                           jnp.asarray(np.stack([c["intrinsics"] for c in clips])))
    self.model, self.noise_levels = model, tuple(noise_levels)
    self._apply = None if model is None else _jitted_apply(model)

  def predictions(self, params, key=None, apply_fn=None):
    """``{t: float64 [N, H, W, 3]}`` in ``[0, 255]``: one-step clean predictions of the probe frames (``apply_fn``:
    ``(seq, timesteps, Frames) -> velocity`` instead of the model's)."""
    from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
    if apply_fn is None:
      apply_fn = model_apply_fn(self.model, params, self._apply)
    lay = self.layout
    b = self.latents.shape[0]
    noisy_frames = np.asarray(lay.noisy_frames)
    clean, x0 = self.latents[:, lay.clean_frames], self.latents[:, noisy_frames]
    eps = jax.random.normal(jax.random.key(0) if key is None else key, x0.shape, x0.dtype)
    mask, writer = first_view_only(lay)
    frames = Frames(pos=jnp.broadcast_to(jnp.asarray(lay.frame_pos, jnp.float32), (b, len(lay.frame_pos))),
                    cameras=self.cameras.frames(jnp.asarray(lay.frame_pos.astype(np.int32))),
                    mask=jnp.asarray(mask)[None], local=jnp.asarray(lay.local)[None],
                    plan=MemoryPlan.make(lay.chunk, writer))
    out = {}
    for t in self.noise_levels:
      tt = jnp.full((b, len(noisy_frames)), t, x0.dtype)
      xt = flow.noise(x0, eps, tt)
      ts = jnp.concatenate([jnp.zeros((b, lay.num_clean)), tt * flow.TIMESTEP_SCALE], axis=1)
      v = apply_fn(jnp.concatenate([clean, xt], axis=1), ts, frames)[:, lay.num_clean:]
      x0_hat = xt - t * v
      x0_hat = x0_hat[self.sel[:, 0], self.sel[:, 1]]  # [N, h, w, C]
      px = np.asarray(vae.decode(x0_hat, self.stride), np.float64)  # [-1, 1]
      out[float(t)] = np.clip((px + 1) * 127.5, 0, 255)
    return out

  def __call__(self, params):
    preds = self.predictions(params)
    return {f"covis_tf_{t:g}": covisible.masked_psnr(p, self.gt, self.masks) for t, p in preds.items()}
