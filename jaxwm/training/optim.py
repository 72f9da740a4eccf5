"""AdamW with linear warmup, cosine decay, global-norm clipping; optional EMA of parameters."""

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(cfg, num_steps):
  """Warmup from 0 to ``cfg.lr`` over ``cfg.warmup_steps``, cosine to ``cfg.lr * cfg.end_lr_ratio`` at ``num_steps``."""
  decay = max(int(num_steps), int(cfg.warmup_steps) + 1)
  return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, int(cfg.warmup_steps), decay, cfg.lr * cfg.end_lr_ratio)


def _decay_mask(params):
  """Weight decay on matrices only (not biases, norm scales, modulation tables)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def make_optimizer(cfg, num_steps):
  """``optax`` chain: clip by global norm, then AdamW on the schedule."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
      optax.adamw(learning_rate_schedule(cfg, num_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                  weight_decay=cfg.weight_decay, mask=_decay_mask),
  )


def ema_update(ema, params, decay):
  """``ema <- decay * ema + (1 - decay) * params``."""
  return jax.tree_util.tree_map(lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), ema, params)
