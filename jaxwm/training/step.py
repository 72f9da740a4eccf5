"""Train state, initialisation and the teacher-forcing flow-matching train step."""

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwm import text as text_lib
from jaxwm.diffusion import flow
from jaxwm.models import vae
from jaxwm.models.init import init_params
from jaxwm.models.conditioning import Cameras
from jaxwm.training import augment
from jaxwm.training.recipe import recipe_of
from jaxwm.training.optim import ema_update


@flax.struct.dataclass
class TrainState:
  """``step`` (int32 scalar), ``params``, ``opt_state``, ``ema`` (a copy of params, or ``{}`` when off),
  ``routing``: the head-routing pool ``[P, H]`` bool (``{}`` when per-head windows are off)."""
  step: jax.Array
  params: Any
  opt_state: Any
  ema: Any
  routing: Any = None


def latent_shape(config, num_clean_plus_noisy):
  """``[1, S, h, w, C]`` of the model input in the training layout."""
  from jaxwm.data.sources import latent_geometry  # pylint: disable=g-import-not-at-top
  return (1, num_clean_plus_noisy, *latent_geometry(config.data))


def make_init_fn(model, tx, shape, ema_decay, image_size, routing=None):
  """``key -> TrainState`` with boxed (logically partitioned) params; unbox after ``eval_shape``/``jit``.
  ``routing``: the head-routing pool (``jaxwm.training.augment.routing_pool``) or None."""

  def init(key):
    params = init_params(model, key, shape, image_size)
    unboxed = nn.unbox(params)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(unboxed),
                      ema=jax.tree_util.tree_map(jnp.copy, params) if ema_decay > 0 else {},
                      routing={} if routing is None else jnp.asarray(routing))

  return init


def make_loss_fn(model, layout, recipe, latent_stride, null_text=None):
  """Flow-matching loss in a training layout (teacher forcing or diffusion forcing; docs/design.md §2, §9).

  ``loss(params, batch, key)`` with ``batch["frames"]`` uint8 ``[B, F, H, W, 3]`` (space-to-depth latents)
  or ``batch["latents"]`` ``[B, F, h, w, C]`` (ingested VAE latents), ``c2w`` and ``intrinsics`` per frame,
  and with ``model.cross_attn`` ``batch["text_emb"] [B, L, D]``: clean history and noisy chunks in one
  sequence (each frame with its own camera); frame 0, the given image, stays clean at timestep 0 (Wan2.2's
  TI2V conditioning); one timestep per noisy chunk; MSE of the velocity on the noisy half.
  ``null_text``: the empty prompt's ``[L, D]`` embedding for ``recipe.text_dropout``.
  """
  seq_frames = jnp.asarray(layout.frame_pos.astype(np.int32))
  clean_idx = jnp.asarray(layout.clean_frames)
  noisy_idx = jnp.asarray(layout.noisy_frames)
  n_clean = layout.num_clean
  noisy_chunk = jnp.asarray(layout.chunk[n_clean:] - 1)
  n_chunks = int(layout.chunk.max())
  mask = jnp.asarray(layout.mask)[None]
  recipe = recipe_of(recipe)
  drop, windows = recipe.chunk_drop, recipe.head_windows

  def step_mask(key, step, routing):
    """The layout mask with this step's chunk drop and per-head windows (ReWorld §2.2-2.3); None (the layout's
    static mask) without either."""
    if not (drop.enabled or windows.enabled):
      return None
    m = mask[0]
    if drop.enabled:
      m = augment.chunk_drop_mask(jax.random.fold_in(key, 2), m, layout.chunk, drop.keep, layout.chunk[layout.writer])
    if windows.enabled:
      heads = routing[step % routing.shape[0]]
      m = augment.head_window_mask(m, layout.frame_pos, layout.frame_pos, heads, windows.window)
    return m[None]

  text_dropout = recipe.text_dropout
  if model.cfg.cross_attn and text_dropout > 0 and null_text is None:
    raise ValueError(f"recipe.text_dropout={text_dropout} needs the empty prompt's embedding (null_text.npy of an "
                     "ingested dataset)")

  def loss_fn(params, batch, key, step=0, routing=None):
    lat = batch["latents"].astype(jnp.float32) if "latents" in batch else vae.encode(batch["frames"], latent_stride)
    context = None
    if model.cfg.cross_attn:
      if "text_emb" not in batch:
        raise ValueError("model.cross_attn needs text embeddings: train on records ingested with --text_encoder "
                         "(data.source='records')")
      context = batch["text_emb"].astype(jnp.float32)
      if text_dropout > 0:  # LOCI §4: 0.1; trains the unconditional branch of classifier-free guidance
        context = text_lib.drop_text(jax.random.fold_in(key, 3), context, text_dropout, null_text)
    b = lat.shape[0]
    clean, x0 = lat[:, clean_idx], lat[:, noisy_idx]
    k_t, k_eps = jax.random.split(key)
    k_sel = jax.random.fold_in(key, 1)
    t = flow.sample_train_timesteps(k_t, (b, n_chunks), recipe.timestep_distribution, recipe.timestep_shift)
    t = t[:, noisy_chunk]
    eps = jax.random.normal(k_eps, x0.shape, x0.dtype)
    seq = jnp.concatenate([clean, flow.noise(x0, eps, t)], axis=1)
    ts = jnp.concatenate([jnp.zeros((b, n_clean)), t * flow.TIMESTEP_SCALE], axis=1)
    frames = layout.frames(b, Cameras(batch["c2w"], batch["intrinsics"]).frames(seq_frames),
                           mask=step_mask(key, step, routing))
    v, _ = model.apply({"params": params}, seq, ts, frames, context=context, rngs={"frame_select": k_sel})
    return jnp.mean(jnp.square(v[:, n_clean:] - flow.velocity_target(x0, eps)))

  return loss_fn


def make_train_step(loss_fn, tx, schedule, ema_decay):
  """``(state, batch, base_key) -> (state, metrics)``; noise keys are ``fold_in(base_key, step)``."""

  def train_step(state, batch, base_key):
    key = jax.random.fold_in(base_key, state.step)
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch, key, state.step, state.routing)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema = ema_update(state.ema, params, ema_decay) if ema_decay > 0 else state.ema
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "param_norm": optax.tree.norm(params),
               "lr": schedule(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=ema), metrics

  return train_step
