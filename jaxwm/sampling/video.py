"""Streaming an RGB video from a first frame, a camera trajectory and (optionally) a prompt, with a video
autoencoder: the first frame encoded alone (Wan2.2's TI2V conditioning: clean, timestep 0), each
generated latent chunk decoded to RGB as soon as it exists (the causal VAE's feature cache: constant
memory), and classifier-free guidance on the text.
"""

import jax.numpy as jnp
import numpy as np

from jaxwm.data.sources import data_of
from jaxwm.encoders import make_autoencoder
from jaxwm.sampling.settings import sample_of
from jaxwm.sampling.streaming import StreamingSampler


def stream_video(model, variables, config, first_frame, cameras, *, key, num_frames, autoencoder=None,
                 context=None, null_context=None, guidance=1.0, num_steps=None, shift=None, memory=None,
                 progress=False, on_frames=None):
  """Generates ``num_frames`` latent frames and decodes them chunk by chunk.

  Args:
    model, variables: the model and ``{"params": ...}``.
    config: its training config (``data.vae``, ``recipe.chunk_size``, ``sample``).
    first_frame: uint8 ``[H, W, 3]``; ``H, W`` multiples of the autoencoder's spatial stride.
    cameras: ``c2w [num_frames, 4, 4]`` (re-anchored on frame 0) and ``intrinsics [num_frames, 3, 3]`` per
      latent frame, in pixels of ``first_frame``.
    key: noise key. num_frames: latent frames, ``1 + k * recipe.chunk_size``.
    autoencoder: an :class:`jaxwm.encoders.Autoencoder` (default: ``config.data.vae``).
    context, null_context: ``[1, L, D]`` text embeddings of the prompt and of the empty prompt (models with
      ``model.cross_attn``); ``guidance``: the classifier-free guidance scale on the text.
    num_steps, shift: Euler steps per chunk and schedule shift (default: ``config.sample``'s).
    memory: a :class:`jaxwm.memory.MemoryPolicy` (default: the full cache).
    on_frames: ``on_frames(uint8 [n, H, W, 3])`` as each chunk is decoded (e.g. to show or write it).

  Returns:
    ``(latents [num_frames, h, w, C], frames uint8 [1 + (num_frames - 1) * temporal_stride, H, W, 3])``.
  """
  ae = autoencoder or make_autoencoder(data_of(config.data).autoencoder)
  chunk = config.recipe.chunk_size
  if (num_frames - 1) % chunk or num_frames < 1 + chunk:
    raise ValueError(f"num_frames={num_frames} must be 1 + k * recipe.chunk_size={chunk} (k >= 1)")
  h, w = first_frame.shape[:2]
  if h % ae.spatial_stride or w % ae.spatial_stride:
    raise ValueError(f"first_frame is {h}x{w}; {ae.name} needs multiples of {ae.spatial_stride}")
  first = ae.encode(jnp.asarray(first_frame)[None, None])  # [1, 1, h, w, C]: the image alone
  lh, lw = h // ae.spatial_stride, w // ae.spatial_stride
  sampler = StreamingSampler(model, variables, batch_size=1, max_frames=num_frames, latent_hw=(lh, lw),
                             channels=ae.channels, num_steps=num_steps or config.sample.num_steps,
                             shift=config.sample.shift if shift is None else shift, guidance=guidance,
                             context=context, null_context=null_context,
                             noise_scale=sample_of(config.sample).noise_scale)
  decoder = ae.decoder(1, lh, lw)
  video = [decoder.step(first)[0]]
  if on_frames is not None:
    on_frames(video[0])

  def decode(_, latents):
    video.append(decoder.step(latents)[0])
    if on_frames is not None:
      on_frames(video[-1])

  cams = {"c2w": jnp.asarray(cameras["c2w"], jnp.float32)[None],
          "intrinsics": jnp.asarray(cameras["intrinsics"], jnp.float32)[None]}
  latents = sampler.rollout(first, num_frames, chunk, key, cams, memory=memory, progress=progress, callback=decode)
  return np.asarray(latents[0]), np.concatenate(video, axis=0)


def text_contexts(text_encoder, prompt):
  """``(context [1, L, D], null_context [1, L, D])`` of ``prompt`` and of the empty prompt."""
  emb, _ = text_encoder.encode([prompt])
  return jnp.asarray(emb), jnp.asarray(text_encoder.null_embedding())[None]


def decode_all(autoencoder, latents):
  """Decodes ``[F, h, w, C]`` latents in one go (a reference for the chunked decoding)."""
  dec = autoencoder.decoder(1, *latents.shape[1:3])
  return dec.step(jnp.asarray(latents)[None])[0]

