"""Memory gain: how much a model's prediction of a revisited frame depends on the view it revisits.

The return frame ``r`` of a loop (its pose equals frame 0's) is denoised teacher-forced, as in
training: clean ground-truth history ``0 .. r-1`` chunk by chunk, the return chunk noised to
``x_t = (1 - t) x0 + t eps`` with a fixed ``eps``. Its velocity error

    E(t) = mean over the return frame's latents of (v_theta(x_t, t | history) - (eps - x0))^2

is measured twice: with frame 0 in the history (``with``) and with frame 0 removed from every
frame's attention and from the recurrent memory (``without``). The memory gain is

    G(t) = E_without(t) / E_with(t),

1 for a model that ignores its history, large for one that copies the matching view. At ``t = 1``
the return frame is pure noise, so only memory can lower ``E_with``. Unlike the return frame's
PSNR after sampling, the ratio moves early in training, before samples are sharp.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.diffusion import flow
from jaxwm.models.conditioning import Cameras, Frames
from jaxwm.models.loci import MemoryPlan

NOISE_LEVELS = (0.5, 0.8, 1.0)


def _without_first_view(layout):
  """``(mask, writer)`` of ``layout`` with clean frame 0 removed: no other sequence position attends
  it and it writes no recurrent memory."""
  mask = np.array(layout.mask)
  pos0 = int(np.flatnonzero(~layout.noisy & (layout.frame_pos == 0))[0])
  keep_self = mask[pos0, pos0]
  mask[:, pos0] = False
  mask[pos0, pos0] = keep_self
  writer = np.array(layout.writer)
  writer[pos0] = False
  return mask, writer


def return_frame_errors(apply_fn, latents, cameras, layout, return_frame, key, noise_levels=NOISE_LEVELS):
  """Teacher-forced velocity error of the return frame with and without the first view.

  Args:
    apply_fn: ``(seq [B, S, h, w, C], timesteps [B, S] (0..1000), Frames) -> velocity [B, S, h, w, C]``.
    latents: ``[B, F, h, w, C]`` clean latents of the clips (``F`` = the layout's frames).
    cameras: :class:`Cameras` ``[B, F]`` or None (camera-free models).
    layout: the training layout (``jaxwm.training.layout``) of ``F`` frames.
    return_frame: clip frame whose pose equals frame 0's (``1 <= r < F``).
    key: noise key (the same ``eps`` for both variants and every ``t``).
    noise_levels: the ``t`` values (flow time: 1 is pure noise).

  Returns:
    dict ``t -> (E_with [B], E_without [B])`` as numpy float64.
  """
  noisy_frames = np.asarray(layout.noisy_frames)
  if not 1 <= return_frame < latents.shape[1] or return_frame not in noisy_frames:
    raise ValueError(f"return_frame must be a noisy frame of the layout (1..{latents.shape[1] - 1}); "
                     f"got {return_frame}")
  b = latents.shape[0]
  n_clean = layout.num_clean
  clean, x0 = latents[:, layout.clean_frames], latents[:, noisy_frames]
  eps = jax.random.normal(key, x0.shape, x0.dtype)
  target = flow.velocity_target(x0, eps)
  at = n_clean + int(np.flatnonzero(noisy_frames == return_frame)[0])
  cams = None if cameras is None else cameras.frames(jnp.asarray(layout.frame_pos.astype(np.int32)))
  pos = jnp.broadcast_to(jnp.asarray(layout.frame_pos, jnp.float32), (b, len(layout.frame_pos)))
  variants = {"with": (np.asarray(layout.mask), np.asarray(layout.writer)), "without": _without_first_view(layout)}
  out = {}
  for t in noise_levels:
    tt = jnp.full((b, len(noisy_frames)), t, latents.dtype)
    seq = jnp.concatenate([clean, flow.noise(x0, eps, tt)], axis=1)
    ts = jnp.concatenate([jnp.zeros((b, n_clean)), tt * flow.TIMESTEP_SCALE], axis=1)
    errs = []
    for name in ("with", "without"):
      mask, writer = variants[name]
      frames = Frames(pos=pos, cameras=cams, mask=jnp.asarray(mask)[None], local=jnp.asarray(layout.local)[None],
                      plan=MemoryPlan.make(layout.chunk, writer))
      v = apply_fn(seq, ts, frames)
      err = jnp.mean(jnp.square(v[:, at] - target[:, at - n_clean]), axis=tuple(range(1, v.ndim - 1)))
      errs.append(np.asarray(err, np.float64))
    out[float(t)] = tuple(errs)
  return out


def memory_gain(errors):
  """``t -> G(t)`` (geometric mean over the batch of ``E_without / E_with``) from :func:`return_frame_errors`."""
  return {t: float(np.exp(np.mean(np.log(np.maximum(w_o, 1e-12)) - np.log(np.maximum(w, 1e-12)))))
          for t, (w, w_o) in errors.items()}


def _jitted_apply(model):
  """``(params, seq, ts, frames) -> velocity``, compiled once per model and shapes (params are an argument)."""
  def apply(params, seq, ts, frames):
    rngs = {"frame_select": jax.random.key(0)}  # random frame selection, when configured: fixed
    return model.apply({"params": params}, seq, ts, frames, rngs=rngs)[0]
  return jax.jit(apply)


def model_apply_fn(model, params, jitted=None):
  """``apply_fn`` for :func:`return_frame_errors` from a :class:`jaxwm.models.transformer.WanModel`;
  ``jitted``: a :func:`_jitted_apply` of ``model`` to reuse (a probe run every k steps compiles once)."""
  fn = jitted or _jitted_apply(model)
  return lambda seq, ts, frames: fn(params, seq, ts, frames)


def clip_cameras(batch):
  """:class:`Cameras` of a batch dict with ``c2w`` and ``intrinsics`` ``[B, F, ...]``."""
  return Cameras(jnp.asarray(batch["c2w"], jnp.float32), jnp.asarray(batch["intrinsics"], jnp.float32))


class GainProbe:
  """The memory gain of a training run on a fixed batch of eval loops (logged as ``gain_<t>``).

  ``GainProbe(config, model, num_clips)(params) -> {"gain_0.5": G, ...}``: clips spread over the 35
  rotation loops (every magnitude and axis combination), their return frame teacher-forced in the
  training layout of ``data.num_frames`` frames.
  """

  def __init__(self, config, model, num_clips=8, noise_levels=NOISE_LEVELS):
    from jaxwm.data.procedural import EVAL_LOOPS  # pylint: disable=g-import-not-at-top
    from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
    from jaxwm.sampling.clips import eval_clip  # pylint: disable=g-import-not-at-top
    from jaxwm.training.layout import make_layout  # pylint: disable=g-import-not-at-top
    if num_clips < 1:
      raise ValueError(f"num_clips must be >= 1; got {num_clips}")
    idx = np.linspace(0, len(EVAL_LOOPS) - 1, num_clips).round().astype(int)
    clips = [eval_clip(config, int(i)) for i in idx]
    rets = {c["return_frame"] for c in clips}
    if len(rets) != 1 or min(rets) < 1:
      raise ValueError(f"eval loops of data.num_frames={config.data.num_frames} have return frames {sorted(rets)}; "
                       "the memory gain needs one return frame >= 1")
    self.return_frame = rets.pop()
    self.latents = vae.encode(jnp.asarray(np.stack([c["frames"] for c in clips])), config.data.latent_stride)
    self.cameras = Cameras(jnp.asarray(np.stack([c["c2w"] for c in clips])),
                           jnp.asarray(np.stack([c["intrinsics"] for c in clips])))
    self.layout = make_layout("teacher_forcing", config.data.num_frames, config.recipe.chunk_size)
    self.model, self.noise_levels = model, tuple(noise_levels)
    self._apply = _jitted_apply(model)

  def __call__(self, params):
    errs = return_frame_errors(model_apply_fn(self.model, params, self._apply), self.latents, self.cameras, self.layout,
                               self.return_frame, jax.random.key(0), self.noise_levels)
    return {f"gain_{t:g}": g for t, g in memory_gain(errs).items()}
