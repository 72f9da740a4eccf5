"""Geometry-aware frame-sparse attention (ViewRope §3.3, Algorithm 1; docs/design.md §6), pure ``jnp``.

Blocks are latent frames of ``N`` tokens. Sequences are frame-major: ``q [B, Fq*N, H, D]``,
``k, v [B, Fk*N, H, D]``.

1. :func:`frame_scores` -- block relevance on ``num_samples`` token positions shared by all
   frames, averaged over heads and positions (Eq. 9).
2. :func:`select_frames` -- per query frame, the ``top_k`` history frames (Eq. 10), or the
   counterfactual ``random`` / ``exclude_selected`` sets (Table 4); ``-1`` pads.
3. :func:`gathered_attention` -- softmax attention of each query frame over the frames in its
   index list only (Eq. 12), by gathering: cost ``O(Fq * M * N^2)``, linear in the frames.
4. :func:`attended_frames` -- steps 1-2 plus the query's own chunk, always attended (Eq. 11).
5. :func:`frame_sparse_attention` -- 4 then 3. The selection is not differentiated
   (``stop_gradient``); the attention is.

References only: the Pallas kernels and the ``impl=`` dispatch live in ``jaxwm.kernels``.
"""

import jax
import jax.numpy as jnp

SELECTION_MODES = ("topk", "random", "exclude_selected")


def sample_positions(key, tokens_per_frame, num_samples):
  """``[K_s]`` token positions shared by all frames: random without replacement when ``key`` is
  given (the paper's sampling), else evenly spaced (deterministic)."""
  k_s = min(num_samples, tokens_per_frame)
  if key is None:
    return jnp.round(jnp.linspace(0, tokens_per_frame - 1, k_s)).astype(jnp.int32)
  return jax.random.permutation(key, tokens_per_frame)[:k_s].astype(jnp.int32)


def frame_scores(q, k, tokens_per_frame, positions):
  """Eq. 9: ``score[b, i, j] = mean_{h, s in S} q[b, i, s, h] . k[b, j, s, h] / sqrt(D)``.

  Args:
    q: ``[B, Fq*N, H, D]``; k: ``[B, Fk*N, H, D]`` (camera-encoded).
    positions: ``[K_s]`` int token positions within a frame.

  Returns:
    ``[B, Fq, Fk]`` float32.
  """
  n = tokens_per_frame
  b, lq, h, d = q.shape
  qs = q.reshape(b, lq // n, n, h, d)[:, :, positions].astype(jnp.float32)
  ks = k.reshape(b, k.shape[1] // n, n, h, d)[:, :, positions].astype(jnp.float32)
  return jnp.einsum("bishd,bjshd->bij", qs, ks) / (d**0.5 * h * positions.shape[0])


def _top_indices(scores, allowed, top_k):
  """Indices of the ``top_k`` largest ``scores`` among ``allowed`` (-1 where fewer exist)."""
  top_k = min(top_k, scores.shape[-1])
  masked = jnp.where(allowed, scores, -jnp.inf)
  vals, idx = jax.lax.top_k(masked, top_k)
  return jnp.where(jnp.isneginf(vals), -1, idx).astype(jnp.int32)


def indices_to_mask(idx, num_frames):
  """``[..., k]`` frame indices (-1 = none) -> ``[..., num_frames]`` bool."""
  hit = (idx[..., :, None] == jnp.arange(num_frames)) & (idx[..., :, None] >= 0)
  return hit.any(axis=-2)


def select_frames(scores, history, top_k, *, mode="topk", key=None):
  """Eqs. 10 and Table 4: ``top_k`` frames per query frame among ``history``.

  Args:
    scores: ``[B, Fq, Fk]`` relevance (Eq. 9); not differentiated.
    history: ``[B, Fq, Fk]`` bool, the candidate frames (past, valid, outside the own chunk).
    top_k: frames per query frame.
    mode: ``topk`` (the paper's selection), ``random`` (``top_k`` uniformly random history
      frames), ``exclude_selected`` (``top_k`` random frames among the history frames that
      ``topk`` does not select).
    key: PRNG key, required by the random modes.

  Returns:
    ``[B, Fq, min(top_k, Fk)]`` int32 key-frame indices, best first for ``topk``; -1 pads
    where fewer candidates exist.
  """
  if mode not in SELECTION_MODES:
    raise ValueError(f"selection mode must be one of {SELECTION_MODES}; got {mode!r}")
  scores = jax.lax.stop_gradient(scores.astype(jnp.float32))
  if mode == "topk":
    return _top_indices(scores, history, top_k)
  if key is None:
    raise ValueError(f"selection mode {mode!r} needs a PRNG key")
  allowed = history
  if mode == "exclude_selected":
    allowed = history & ~indices_to_mask(_top_indices(scores, history, top_k), scores.shape[-1])
  return _top_indices(jax.random.uniform(key, scores.shape), allowed, top_k)


def recent_frames(history, window):
  """Sliding window: the ``window`` latest frames of ``history`` (key frames are in time order)."""
  order = jnp.broadcast_to(jnp.arange(history.shape[-1], dtype=jnp.float32), history.shape)
  return _top_indices(order, history, window)


def gathered_attention(q, k, v, frame_idx, *, tokens_per_frame, scale=None):
  """Eq. 12: each query frame attends to the tokens of the key frames in its list only.

  Args:
    q: ``[B, Fq*N, H, D]``; k, v: ``[B, Fk*N, H, D]``.
    frame_idx: ``[B, Fq, M]`` int key-frame indices, -1 = unused slot. Slots must be
      distinct and every query frame needs at least one valid slot.
    tokens_per_frame: ``N``.
    scale: logit scale, default ``D ** -0.5``.

  Returns:
    ``[B, Fq*N, H, D]`` in the dtype of ``q`` (softmax in float32).
  """
  n = tokens_per_frame
  b, lq, h, d = q.shape
  fq, fk = lq // n, k.shape[1] // n
  scale = d**-0.5 if scale is None else scale
  qf = q.reshape(b, fq, n, h, d)
  safe = jnp.clip(frame_idx, 0, fk - 1)
  take = jax.vmap(lambda a, i: a[i])  # per batch row: [Fk, N, H, D][Fq, M] -> [Fq, M, N, H, D]
  ks = take(k.reshape(b, fk, n, h, d), safe)
  vs = take(v.reshape(b, fk, n, h, d), safe)
  logits = jnp.einsum("binhd,bimshd->bihnms", qf, ks, preferred_element_type=jnp.float32) * scale
  valid = (frame_idx >= 0)[:, :, None, None, :, None]
  logits = jnp.where(valid, logits, -jnp.inf)
  shape = logits.shape
  probs = jax.nn.softmax(logits.reshape(shape[:4] + (-1,)), axis=-1).reshape(shape)
  out = jnp.einsum("bihnms,bimshd->binhd", probs.astype(v.dtype), vs)
  return out.reshape(b, lq, h, d).astype(q.dtype)


def attended_frames(q, k, *, tokens_per_frame, history, local_idx, top_k, sparsity="frame_topk", num_samples=10,
                    window=None, mode="topk", key=None, select_key=None):
  """Algorithm 1's selection: the key frames each query frame attends (Eqs. 9-11).

  Args: as :func:`frame_sparse_attention`.

  Returns:
    ``(frame_idx [B, Fq, C + S], selected [B, Fq, S])`` int, ``S = top_k`` (or ``window``):
    ``frame_idx`` is ``local_idx`` followed by ``selected`` (the input of Eq. 12); -1 pads.
  """
  if sparsity == "sliding_window":
    selected = recent_frames(history, window)
  elif sparsity == "frame_topk":
    pos = sample_positions(key, tokens_per_frame, num_samples)
    selected = select_frames(frame_scores(q, k, tokens_per_frame, pos), history, top_k, mode=mode, key=select_key)
  else:
    raise ValueError(f"sparsity must be 'frame_topk' or 'sliding_window'; got {sparsity!r}")
  local = jnp.broadcast_to(local_idx, selected.shape[:2] + local_idx.shape[-1:])
  return jnp.concatenate([local, selected], -1), selected


def frame_sparse_attention(q, k, v, *, tokens_per_frame, history, local_idx, top_k, sparsity="frame_topk",
                           num_samples=10, window=None, mode="topk", key=None, select_key=None):
  """Algorithm 1: select history frames (:func:`attended_frames`), then attend to them plus the
  own chunk (:func:`gathered_attention`, Eq. 12).

  Args:
    q: ``[B, Fq*N, H, D]``; k, v: ``[B, Fk*N, H, D]`` (camera-encoded).
    history: ``[B, Fq, Fk]`` bool candidate history frames (never the own chunk).
    local_idx: ``[B, Fq, C]`` int key frames always attended (the own chunk, Eq. 11), -1 pads.
    top_k: history frames per query frame (``frame_topk``).
    sparsity: ``frame_topk`` (Eqs. 9-10) or ``sliding_window`` (the latest ``window`` frames).
    num_samples: ``K_s`` sampled token positions for Eq. 9.
    mode: selection mode (:data:`SELECTION_MODES`).
    key: PRNG key for the sampled positions (None: evenly spaced); select_key: for the random
      modes.

  Returns:
    ``(out [B, Fq*N, H, D], selected [B, Fq, top_k or window])``.
  """
  idx, selected = attended_frames(q, k, tokens_per_frame=tokens_per_frame, history=history, local_idx=local_idx,
                                  top_k=top_k, sparsity=sparsity, num_samples=num_samples, window=window, mode=mode,
                                  key=key, select_key=select_key)
  return gathered_attention(q, k, v, idx, tokens_per_frame=tokens_per_frame), selected
