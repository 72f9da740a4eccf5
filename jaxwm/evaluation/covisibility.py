"""Token-level co-visibility from ground-truth depth and the attention mass on co-visible history
(LOCI App. B, docs/design.md §10). Measurement only: depth never reaches the model.

Query token ``q`` (a patch of frame ``i``) and key token ``k`` (a patch of frame ``j``) are
co-visible when some surface point seen in ``q``'s patch projects into ``k``'s patch of frame
``j`` in front of the camera and agrees with frame ``j``'s depth there (not occluded). The
within-history mass of ``q`` is

  m_q = sum_{k in V_q} a_qk / sum_{k in H_q} a_qk,

with ``a`` the attention weights averaged over heads (before this normalisation), ``H_q`` the
history keys and ``V_q`` the co-visible ones; ``rho_q = |V_q| / |H_q|`` is the chance level (the
mass a query spreading its attention uniformly over the history would put on ``V_q``).
"""

import numpy as np

from jaxwm.geometry.cameras import pixel_centers


def token_covisibility(depth, c2w, intrinsics, query_frame, grid_hw, *, samples=4, rel_tol=0.05):
  """Which key tokens of every frame see the surface seen by each token of ``query_frame``.

  Args:
    depth: ``[F, H, W]`` z-depth (OpenCV cameras); c2w: ``[F, 4, 4]``; intrinsics: ``[F, 3, 3]`` pixels.
    query_frame: index ``i`` of the query frame.
    grid_hw: ``(gh, gw)`` tokens per frame; ``H`` and ``W`` must divide by them.
    samples: ``samples x samples`` surface points per query token (pixel centres of a sub-grid).
    rel_tol: depth agreement ``|z_proj - depth| <= rel_tol * z_proj`` (occlusion test).

  Returns:
    ``[N, F, N]`` bool, ``N = gh * gw`` (query token, key frame, key token), token order row-major.
  """
  depth = np.asarray(depth, np.float64)
  c2w = np.asarray(c2w, np.float64)
  k = np.asarray(intrinsics, np.float64)
  f, h, w = depth.shape
  gh, gw = grid_hw
  if h % gh or w % gw:
    raise ValueError(f"grid_hw {tuple(grid_hw)} must divide the depth maps' {(h, w)}")
  ph, pw = h // gh, w // gw
  # Sub-grid sample points of every query token: [N, S*S, 2] (u, v) pixel coordinates.
  off = (np.arange(samples) + 0.5) / samples
  su = (np.arange(gw)[:, None] + off[None]) * pw  # [gw, S]
  sv = (np.arange(gh)[:, None] + off[None]) * ph
  uv = np.stack(np.broadcast_arrays(su[None, :, None, :], sv[:, None, :, None]), -1)  # [gh, gw, S, S, 2]
  uv = uv.reshape(gh * gw, samples * samples, 2)
  zq = depth[query_frame][np.minimum(uv[..., 1].astype(int), h - 1), np.minimum(uv[..., 0].astype(int), w - 1)]
  rays = np.concatenate([uv, np.ones(uv.shape[:-1] + (1,))], -1) @ np.linalg.inv(k[query_frame]).T
  pts_cam = rays * zq[..., None]
  pts_w = pts_cam @ c2w[query_frame, :3, :3].T + c2w[query_frame, :3, 3]
  out = np.zeros((gh * gw, f, gh * gw), bool)
  for j in range(f):
    pc = (pts_w - c2w[j, :3, 3]) @ c2w[j, :3, :3]  # R^T (x - t)
    z = pc[..., 2]
    proj = pc @ k[j].T
    with np.errstate(divide="ignore", invalid="ignore"):
      u, v = proj[..., 0] / z, proj[..., 1] / z
    ok = (z > 1e-6) & (u >= 0) & (u < w) & (v >= 0) & (v < h) & np.isfinite(zq)
    ui, vi = np.clip(np.where(ok, u, 0).astype(int), 0, w - 1), np.clip(np.where(ok, v, 0).astype(int), 0, h - 1)
    ok &= np.abs(depth[j][vi, ui] - z) <= rel_tol * np.abs(z)
    tok = (vi // ph) * gw + ui // pw
    qi, si = np.nonzero(ok)
    out[qi, j, tok[qi, si]] = True
  return out


def covisible_mass(attn, covis, history):
  """Within-history co-visible mass per query token.

  Args:
    attn: ``[Nq, Fk, N]`` attention weights of the query tokens over the key tokens of ``Fk`` frames
      (averaged over heads).
    covis: ``[Nq, Fk, N]`` bool co-visibility (:func:`token_covisibility` restricted to the key frames).
    history: ``[Fk]`` bool, the history frames (keys outside the own chunk).

  Returns:
    dict of ``[Nq]`` arrays: ``mass`` (m_q; NaN where the history mass or ``V_q`` is empty),
    ``history_mass`` (h_q), ``chance`` (rho_q).
  """
  attn = np.asarray(attn, np.float64)
  hist = np.broadcast_to(np.asarray(history, bool)[None, :, None], attn.shape)
  v = np.asarray(covis, bool) & hist
  h_mass = np.where(hist, attn, 0).sum((1, 2))
  v_mass = np.where(v, attn, 0).sum((1, 2))
  n_hist = hist.sum((1, 2))
  n_v = v.sum((1, 2))
  valid = (h_mass > 0) & (n_v > 0)
  with np.errstate(divide="ignore", invalid="ignore"):
    return {"mass": np.where(valid, v_mass / h_mass, np.nan), "history_mass": h_mass,
            "chance": np.where(valid, n_v / np.maximum(n_hist, 1), np.nan)}
