"""ReWorld's training recipe for bounded memory (ReWorld §2.2-2.3; docs/design.md §5).

- Chunk drop: per step, keys of the sink chunk plus ``keep`` random other past chunks stay
  visible; the rest of the history is masked. Queries are never dropped (every frame keeps
  its loss and its own chunk). One keep-set per step, shared by the whole batch (and so by
  every data shard).
- Mixed per-head windows: of ``H`` heads a global set sees the whole causal history, the others
  only keys less than ``window`` frames behind. The global set is the next entry of a fixed
  pool of random partitions at every optimiser step (random head routing); the pool is part of
  the train state, so it survives checkpoints.
"""

import jax
import jax.numpy as jnp
import numpy as np


def routing_pool(seed, num_heads, pool_size=12, global_fraction=0.25):
  """``[pool_size, H]`` bool: each row a random set of ``round(H * global_fraction)`` global heads."""
  rng = np.random.default_rng(seed)
  n_global = max(1, int(round(num_heads * global_fraction)))
  pool = np.zeros((pool_size, num_heads), bool)
  for row in pool:
    row[rng.choice(num_heads, n_global, replace=False)] = True
  return pool


def chunk_drop_mask(key, mask, chunk, keep, history_chunks=None):
  """Frame mask ``[S, Sk]`` with history chunks dropped.

  Args:
    key: PRNG key of the step (the same on every shard).
    mask: ``[S, S]`` layout mask; chunk: ``[S]`` chunk index of every sequence frame (queries and keys).
    keep: past chunks kept besides the sink (chunk 0).
    history_chunks: the chunk ids that are history (default: all); ``keep`` are drawn among them.

  Returns:
    ``mask`` where a key frame stays if its chunk is the query's own, the sink, or in the keep-set.
  """
  chunk_np = np.asarray(chunk)
  n = int(chunk_np.max()) + 1
  cand = np.asarray(sorted(set(np.unique(chunk_np if history_chunks is None else history_chunks).tolist()) - {0}),
                    np.int32)
  kept = jnp.zeros((n,), bool).at[0].set(True)
  if len(cand):
    pick = jax.random.permutation(key, jnp.asarray(cand))[:keep]
    kept = kept.at[pick].set(True)
  chunk = jnp.asarray(chunk_np)
  visible = kept[chunk][None, :] | (chunk[None, :] == chunk[:, None])
  return jnp.asarray(mask) & visible


def head_window_mask(mask, pos_q, pos_k, global_heads, window):
  """``[H, S, Sk]``: ``mask`` for global heads, ``mask & (pos_q - pos_k < window)`` for the others."""
  near = (jnp.asarray(pos_q)[:, None] - jnp.asarray(pos_k)[None, :]) < window
  return jnp.asarray(mask)[None] & (jnp.asarray(global_heads)[:, None, None] | near[None])
