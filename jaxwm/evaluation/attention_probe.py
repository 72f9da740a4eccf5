"""Attention on co-visible history (LOCI App. B): replay a ground-truth clip teacher-forced, noise
the chunk of one query frame to ``t = 0.5`` and read every layer's head-averaged attention weights
of that frame's tokens over the history keys.
"""

import numpy as np

from jaxwm.evaluation.covisibility import covisible_mass, token_covisibility


def attention_weights(model, variables, latents, cameras, query_frame, chunk_size, *, t=0.5, key=None):
  """Per-layer attention of ``query_frame``'s tokens in the teacher-forcing layout.

  Args:
    model, variables: a :class:`jaxwm.models.transformer.WanModel` and its variables.
    latents: ``[1, F, h, w, C]`` clean latents of the clip; cameras: ``{"c2w" [1, F, 4, 4], "intrinsics"}``.
    query_frame: the probed frame (``>= 1``); its chunk is noised to ``t``, the history is clean.
    chunk_size: the recipe's chunk size.
    t: flow time of the probed chunk (0 clean, 1 noise).
    key: PRNG key for the noise and random frame selections.

  Returns:
    dict: ``weights [L, N, Fk, N]`` over the softmax layers (LOCI hybrid layers have no history
    softmax) (query token, key sequence frame, key token), ``layers [L]`` (the model block of each
    row of ``weights``), ``key_frames [Fk]``
    (clip frame of each key position), ``history [Fk]`` bool, ``selected`` (``[L, k]`` history
    frames of frame-sparse models, else None).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.diffusion import flow  # pylint: disable=g-import-not-at-top
  from jaxwm.models.conditioning import Cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.training.layout import teacher_forcing_layout  # pylint: disable=g-import-not-at-top

  key = jax.random.key(0) if key is None else key
  f = latents.shape[1]
  lay = teacher_forcing_layout(f, chunk_size)
  seq_frames = np.concatenate([lay.clean_frames, lay.noisy_frames])
  hits = np.flatnonzero(lay.noisy & (seq_frames == query_frame))
  if query_frame < 1 or query_frame >= f or not hits.size:
    raise ValueError(f"query_frame must be in [1, {f}); got {query_frame}")
  p = int(hits[0])
  lat = jnp.asarray(latents)
  eps = jax.random.normal(key, lat.shape, lat.dtype)
  noisy = flow.noise(lat, eps, jnp.float32(t))
  seq = jnp.concatenate([lat[:, lay.clean_frames], noisy[:, lay.noisy_frames]], axis=1)
  ts = jnp.where(jnp.asarray(lay.noisy), t * flow.TIMESTEP_SCALE, 0.0)[None]
  cams = Cameras.of(cameras).frames(seq_frames)
  (_, entries), state = model.apply(variables, seq, ts, lay.frames(1, cams), mutable=["intermediates"],
                                    rngs={"frame_select": jax.random.fold_in(key, 1)})
  groups = state["intermediates"]  # one entry per stack of softmax layers, in layer order
  leaves = [(_layer_start(name), leaf) for name in sorted(groups, key=_layer_start)
            for path, leaf in jax.tree_util.tree_leaves_with_path(groups[name])
            if "attn_weights" in jax.tree_util.keystr(path)]
  w = jnp.concatenate([leaf for _, leaf in leaves])
  layers = [start + j for start, leaf in leaves for j in range(leaf.shape[0])]
  n = w.shape[-1] // len(seq_frames)
  w = np.asarray(w[:, 0, p * n:(p + 1) * n]).reshape(w.shape[0], n, len(seq_frames), n)
  local = lay.local[p][lay.local[p] >= 0]
  history = lay.mask[p].copy()
  history[local] = False
  sel = entries.selected
  return {"weights": w, "key_frames": seq_frames, "history": history, "layers": layers,
          "selected": None if sel is None else np.asarray(sel[:, 0, p])}


def _layer_start(name):
  """``blocks`` -> 0, ``blocks_<start>_<end>`` -> start (the order of the layer stacks)."""
  parts = name.split("_")
  return int(parts[1]) if len(parts) == 3 else 0


def covisible_share(probe, depth, c2w, intrinsics, query_frame, grid_hw):
  """LOCI App. B statistics of one probe (:func:`attention_weights`).

  ``depth [F, H, W]``, ``c2w``, ``intrinsics`` are the clip's ground truth at the latent frames.

  Returns:
    dict: ``mass`` (mean m_q over valid queries and historical-softmax layers), ``chance`` (mean
    rho_q), ``history_mass`` (mean h_q), ``excluded`` (queries with zero history mass or no
    co-visible key), ``layers`` (per-layer mean m_q, NaN for layers without history softmax).
  """
  cov = token_covisibility(depth, c2w, intrinsics, query_frame, grid_hw)[:, probe["key_frames"]]
  per_layer, ms, rs, hs, excluded = [], [], [], [], 0
  for w in probe["weights"]:
    r = covisible_mass(w, cov, probe["history"])
    ok = np.isfinite(r["mass"])
    excluded += int((~ok).sum())
    per_layer.append(float(np.mean(r["mass"][ok])) if ok.any() else float("nan"))
    ms.append(r["mass"][ok])
    rs.append(r["chance"][ok])
    hs.append(r["history_mass"])
  ms, rs = np.concatenate(ms), np.concatenate(rs)
  return {"mass": float(ms.mean()) if ms.size else float("nan"),
          "chance": float(rs.mean()) if rs.size else float("nan"),
          "history_mass": float(np.concatenate(hs).mean()), "excluded": excluded, "layers": per_layer}
