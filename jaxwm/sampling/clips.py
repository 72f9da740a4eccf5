"""One procedural eval clip, streamed from its first frame: the clip and rollout that training's
sample GIFs, ``sample.py``, the loop-closure benchmark and the quickstart notebook share.
"""

import jax.numpy as jnp
import numpy as np

from jaxwm.data.procedural import ProceduralClips
from jaxwm.data.window import ClipWindow
from jaxwm.models import vae
from jaxwm.sampling.settings import sample_of
from jaxwm.sampling.streaming import StreamingSampler

# loops: the 35 rotation loops in turn; palindrome: out-and-back paths; walks: the translation walks in turn
EVAL_FAMILIES = ("loops", "palindrome", "walks")


def eval_clip(config, index, num_frames=None, frame_stride=None, family="loops", split="eval"):
  """Clip ``index`` of the procedural eval split, rendered at ``data.render_size`` and windowed.

  Args:
    config: a training config (its ``data`` block).
    index: the eval clip (``family="loops"``: ``EVAL_LOOPS[index % 35]``; ``"walks"``: ``WALKS[index % 5]``).
    num_frames, frame_stride: window length and stride (default: ``data.num_frames``,
      ``data.frame_stride``); the clip has exactly ``(num_frames - 1) * frame_stride + 1`` frames.
    family: one of :data:`EVAL_FAMILIES`.
    split: ``"eval"`` (scenes never trained on) or ``"train"`` (the same kinds of trajectory in the training split's
      rooms, room ``2 * index``: the first ``data.num_clips / data.clips_per_scene`` indices are rooms a default
      run trained on; a diagnosis of what a model memorised).

  Returns:
    ``dict(frames uint8 [F, S, S, 3], c2w float32 [F, 4, 4] (re-anchored on frame 0),
    intrinsics float32 [F, 3, 3], frame_index int [F], return_frame int, meta)`` with ``S = data.image_size``;
    ``frame_index``: the source frame of each window frame;
    ``return_frame``: the window frame whose pose equals frame 0 (-1 if none); ``meta``: ``index``,
    ``family``, ``axes``, ``magnitude_deg`` and ``source`` (the rendered clip before windowing).
  """
  if family not in EVAL_FAMILIES:
    raise ValueError(f"family must be one of {EVAL_FAMILIES}; got {family!r}")
  d = config.data
  frames_n, stride = num_frames or d.num_frames, frame_stride or d.frame_stride
  src = ProceduralClips(split, num_clips=index + 1, num_frames=(frames_n - 1) * stride + 1,
                        image_hw=(d.render_size, d.render_size), family=family)
  clip = src[index]
  window = ClipWindow(frames_n, stride, d.image_size).random_map(clip, np.random.default_rng(0))
  r = int(clip["return_frame"])
  ret = r // stride if r >= 0 and r % stride == 0 and r // stride < frames_n else -1
  meta = {"index": index, "family": str(clip["family"]), "axes": str(clip["axes"]),
          "magnitude_deg": float(clip["magnitude_deg"]), "source": clip}
  return {**window, "frame_index": np.arange(frames_n) * stride, "return_frame": ret, "meta": meta}


def make_sampler(model, variables, config, num_frames, num_steps=None, shift=None, noise_scale=None):
  """A batch-1 :class:`StreamingSampler` for ``num_frames``-frame rollouts of ``config.data``'s frames
  (``num_steps`` / ``shift`` / ``noise_scale`` default to ``config.sample``'s); reusable across clips of that
  length."""
  d = config.data
  hw = d.image_size // d.latent_stride
  return StreamingSampler(model, variables, batch_size=1, max_frames=num_frames, latent_hw=(hw, hw),
                          channels=3 * d.latent_stride**2, num_steps=num_steps or config.sample.num_steps,
                          shift=config.sample.shift if shift is None else shift,
                          noise_scale=sample_of(config.sample).noise_scale if noise_scale is None else noise_scale)


def stream_clip(model, variables, config, clip, *, key, num_steps=None, shift=None, memory=None, callback=None,
                sampler=None, progress=False):
  """Streams ``clip`` from its first frame along its cameras; returns the generated frames.

  Args:
    model, variables: the model and ``{"params": ...}``.
    config: the training config (``data.latent_stride``, ``recipe.chunk_size``, ``sample``).
    clip: ``frames`` uint8 ``[F or 1, S, S, 3]`` (only frame 0 is used), ``c2w [F, 4, 4]``,
      ``intrinsics [F, 3, 3]``; ``F = 1 + k * recipe.chunk_size``.
    key: noise key (chunk ``c`` uses ``fold_in(key, c)``).
    num_steps, shift: Euler steps per chunk and timestep shift (default: ``config.sample``'s).
    memory: a :class:`jaxwm.memory.MemoryPolicy` (default: the full cache).
    callback: ``callback(chunk_index, latents)`` after every chunk.
    sampler: a sampler from :func:`make_sampler` to reuse (``num_steps`` / ``shift`` are then its own).
    progress: a tqdm bar.

  Returns:
    uint8 ``[F, S, S, 3]`` (frame 0 is the VAE round trip of the given first frame).
  """
  stride = config.data.latent_stride
  f = int(np.shape(clip["c2w"])[0])
  chunk = config.recipe.chunk_size
  if (f - 1) % chunk:
    raise ValueError(f"clip has {f} cameras; streaming needs 1 + k * recipe.chunk_size={chunk}")
  first = vae.encode(jnp.asarray(np.asarray(clip["frames"])[:1])[None], stride)  # [1, 1, h, w, C]
  if sampler is None:
    sampler = make_sampler(model, variables, config, f, num_steps, shift)
  cams = {"c2w": jnp.asarray(clip["c2w"], jnp.float32)[None], "intrinsics": jnp.asarray(clip["intrinsics"],
                                                                                       jnp.float32)[None]}
  out = sampler.rollout(first, f, chunk, key, cams, memory=memory, progress=progress, callback=callback)
  return np.asarray(vae.to_uint8(vae.decode(jnp.asarray(out[0]), stride)))
