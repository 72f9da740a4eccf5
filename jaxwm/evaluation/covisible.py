"""Co-visible score: does a generated frame move what is still in sight of the first view?

For generated frame ``j`` of a clip with ground-truth depth, a pixel ``u`` is *co-visible* with
the given first frame when the surface point it sees, ``X = K_j^-1 u~ D_j(u)`` lifted by frame
``j``'s depth, lands inside frame 0, in front of its camera, and agrees there with frame 0's
depth (not occluded): the ``valid`` mask of the projective warp
(:func:`jaxwm.geometry.warp.warp_frame`, ViewRope App. B Eqs. 14-16) from frame 0 into frame ``j``.
It is *newly revealed* when it is not co-visible: outside frame 0's view or hidden in it.

Masks are computed at render size and reduced to the frame size by ``factor x factor`` blocks: a
frame pixel is co-visible when all its render pixels are, revealed when none is; mixed pixels
(a co-visibility boundary inside the pixel) belong to neither. Where a block is uniform the
reduction is exact.

On the co-visible pixels ``M_j`` of frame ``j`` the score is

  PSNR_j = 10 log10(255^2 / mean_{u in M_j, c} (x_j(u, c) - y_j(u, c))^2),

capped at :data:`jaxwm.evaluation.baselines.PSNR_CAP`, and the masked SSIM the mean of the SSIM
map (:mod:`jaxwm.evaluation.metrics`' window) over the windows centred on ``M_j``. Three references
are scored on the same pixels: ``warp`` (frame 0 warped by ground-truth depth and poses at render
size, then area-reduced: what seeing perfectly gives), ``copy`` (frame 0 unchanged) and ``mean``
(frame 0's mean colour). Revealed pixels are scored apart (model and ``mean``): a model can only
guess them, and a guess can be the safe mean: their contrast against the ground truth's (``revealed_contrast``,
1 for as varied, 0 for a flat fill) shows whether a model draws something there. A frame with co-visible
pixels below ``min_fraction`` of the frame (e.g. a camera turned away) has no co-visible score: the value is ``None``, never made up.
"""

import numpy as np

from jaxwm.evaluation.baselines import PSNR_CAP, baseline_video
from jaxwm.geometry.warp import warp_frame

MIN_FRACTION = 0.05  # a frame is scored on its co-visible pixels when they cover at least this share
REFERENCES = ("warp", "copy", "mean")


def _reduce(mask, factor):
  """``[F, H, W]`` bool -> ``(all, any)`` over ``factor x factor`` blocks, ``[F, H/f, W/f]`` each."""
  f, h, w = mask.shape
  m = mask.reshape(f, h // factor, factor, w // factor, factor)
  return m.all(axis=(2, 4)), m.any(axis=(2, 4))


def area_reduce(images, factor):
  """``[F, H, W, C]`` -> float64 ``[F, H/f, W/f, C]`` block means (the data pipeline's area downsampling, before
  rounding)."""
  images = np.asarray(images, np.float64)
  if factor == 1:
    return images
  f, h, w, c = images.shape
  return images.reshape(f, h // factor, factor, w // factor, factor, c).mean(axis=(2, 4))


def covisible_masks(depth, c2w, intrinsics, factor=1, ref=0, depth_rtol=0.02):
  """Co-visible and newly revealed pixels of every frame with frame ``ref``.

  Args:
    depth: ``[F, H, W]`` z-depth at render size; c2w: ``[F, 4, 4]`` (OpenCV); intrinsics: ``[F, 3, 3]`` (render
      pixels).
    factor: render size / frame size (``H`` and ``W`` must divide by it).
    ref: the reference (given) frame.
    depth_rtol: relative depth agreement for the occlusion test.

  Returns:
    ``(covisible, revealed, covisible_full)``: bool ``[F, H/f, W/f]`` twice (disjoint; pixels in neither straddle a
    boundary) and the render-size mask ``[F, H, W]``.
  """
  depth = np.asarray(depth, np.float64)
  c2w, k = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
  f, h, w = depth.shape
  if factor < 1 or h % factor or w % factor:
    raise ValueError(f"factor={factor} must divide the render size {(h, w)}")
  dummy = np.zeros((h, w, 1))
  full = np.stack([warp_frame(dummy, depth[ref], k[ref], c2w[ref], depth[j], k[j], c2w[j], depth_rtol)[1]
                   for j in range(f)])
  full &= np.isfinite(depth)
  cov, anyv = _reduce(full, factor)
  return cov, ~anyv, full


def warp_reference(frames, depth, c2w, intrinsics, factor=1, ref=0, depth_rtol=0.02):
  """Frame ``ref`` warped into every frame by ground-truth depth and poses at render size, area-reduced.

  Args:
    frames: uint8 ``[F, H, W, 3]`` at render size (only frame ``ref`` is read); depth, c2w, intrinsics as in
      :func:`covisible_masks`.

  Returns:
    float64 ``[F, H/f, W/f, 3]`` in ``[0, 255]`` (meaningful on the co-visible pixels).
  """
  src = np.asarray(frames, np.float64)[ref]
  depth = np.asarray(depth, np.float64)
  c2w, k = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
  out = np.stack([warp_frame(src, depth[ref], k[ref], c2w[ref], depth[j], k[j], c2w[j], depth_rtol)[0]
                  for j in range(len(depth))])
  return area_reduce(out, factor)


def masked_psnr(a, b, mask, data_range=255.0):
  """PSNR over the pixels of ``mask [..., H, W]`` (all channels) of ``a, b [..., H, W, C]`` (several frames: pooled),
  capped at ``PSNR_CAP``; ``None`` for an empty mask."""
  mask = np.asarray(mask, bool)
  if not mask.any():
    return None
  d = np.asarray(a, np.float64)[mask] - np.asarray(b, np.float64)[mask]
  mse = float(np.mean(d * d))
  return PSNR_CAP if mse == 0 else float(min(10 * np.log10(data_range**2 / mse), PSNR_CAP))


def masked_contrast(a, b, mask):
  """How much ``a`` varies over the pixels of ``mask [H, W]`` relative to ``b``: ``sqrt(sum_c var_c(a) / sum_c
  var_c(b))``, the variances per channel over the masked pixels of ``a, b [H, W, C]``. 1: as much contrast as
  ``b``; 0: one flat colour (a model that fills what it cannot see with its mean). ``None`` for fewer than 2
  pixels or a flat ``b``."""
  mask = np.asarray(mask, bool)
  if mask.sum() < 2:
    return None
  va = np.asarray(a, np.float64)[mask].var(axis=0).sum()
  vb = np.asarray(b, np.float64)[mask].var(axis=0).sum()
  return None if vb == 0 else float(np.sqrt(va / vb))


def _gaussian(size, sigma):
  x = np.arange(size) - (size - 1) / 2
  g = np.exp(-x * x / (2 * sigma * sigma))
  return g / g.sum()


def _filter_valid(x, g):
  """Separable 'valid' filtering of ``[H, W, C]`` by the 1-D kernel ``g`` along both spatial axes."""
  n = len(g)
  h, w = x.shape[:2]
  y = sum(g[i] * x[i:h - n + 1 + i] for i in range(n))
  return sum(g[i] * y[:, i:w - n + 1 + i] for i in range(n))


def ssim_map(a, b, data_range=255.0, size=11, sigma=1.5, k1=0.01, k2=0.03):
  """float64 SSIM map ``[H - size + 1, W - size + 1, C]`` (Wang et al. 2004; the window of
  :func:`jaxwm.evaluation.metrics.ssim`, whose value is this map's mean)."""
  x, y = np.asarray(a, np.float64) / data_range, np.asarray(b, np.float64) / data_range
  g = _gaussian(size, sigma)
  mx, my = _filter_valid(x, g), _filter_valid(y, g)
  sxx = _filter_valid(x * x, g) - mx * mx
  syy = _filter_valid(y * y, g) - my * my
  sxy = _filter_valid(x * y, g) - mx * my
  c1, c2 = k1**2, k2**2
  return ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))


def masked_ssim(a, b, mask, size=11, **kw):
  """Mean SSIM over the windows centred on ``mask [H, W]`` pixels; ``None`` when no window is."""
  m = np.asarray(mask, bool)
  lo = (size - 1) // 2
  centres = m[lo:m.shape[0] - size + 1 + lo, lo:m.shape[1] - size + 1 + lo]
  if not centres.any():
    return None
  return float(ssim_map(a, b, size=size, **kw)[centres].mean())


def frame_references(first, warp, num_frames):
  """``{name: float64 [F, H, W, 3]}`` of :data:`REFERENCES` from the given first frame ``first [H, W, 3]`` uint8 and
  the warp reference ``warp [F, H, W, 3]``."""
  refs = {"warp": np.asarray(warp, np.float64)}
  for name in ("copy", "mean"):
    refs[name] = baseline_video(name, first, num_frames).astype(np.float64)
  return refs


def score_frames(video, gt, covisible, revealed, references, frames, min_fraction=MIN_FRACTION):
  """Per-frame co-visible and revealed scores.

  Args:
    video, gt: ``[F, H, W, 3]`` (uint8 or float in ``[0, 255]``): generated and ground truth.
    covisible, revealed: bool ``[F, H, W]`` from :func:`covisible_masks`.
    references: ``{name: [F, H, W, 3]}`` (:func:`frame_references`).
    frames: the frame indices to score (e.g. the in-between frames).
    min_fraction: least co-visible share of a frame for it to get a co-visible score.

  Returns:
    list of dicts, one per frame: ``frame``, ``covis_fraction``, ``revealed_fraction``, ``covis_psnr`` /
    ``covis_ssim`` and ``<ref>_covis_psnr`` / ``<ref>_covis_ssim`` (``None`` below ``min_fraction``),
    ``revealed_psnr``, ``mean_revealed_psnr`` and ``revealed_contrast`` (:func:`masked_contrast` of the model
    against the ground truth; ``None`` without revealed pixels).
  """
  out = []
  for j in frames:
    cov, rev = np.asarray(covisible[j], bool), np.asarray(revealed[j], bool)
    row = {"frame": int(j), "covis_fraction": float(cov.mean()), "revealed_fraction": float(rev.mean())}
    scored = cov.mean() >= min_fraction
    for name, img in (("", video), *((f"{r}_", references[r]) for r in references)):
      row[f"{name}covis_psnr"] = masked_psnr(img[j], gt[j], cov) if scored else None
      row[f"{name}covis_ssim"] = masked_ssim(img[j], gt[j], cov) if scored else None
    row["revealed_psnr"] = masked_psnr(video[j], gt[j], rev)
    row["mean_revealed_psnr"] = masked_psnr(references["mean"][j], gt[j], rev) if "mean" in references else None
    row["revealed_contrast"] = masked_contrast(video[j], gt[j], rev)
    out.append(row)
  return out


def summarize(per_frame):
  """Clip-level means of :func:`score_frames`' rows over the frames that have each score (``None`` when none
  has it; ``covis_fraction`` over the frames with a co-visible score); ``covis_frames``: how many frames have a
  co-visible score."""
  keys = [k for k in (per_frame[0] if per_frame else {}) if k != "frame"]
  out = {}
  for k in keys:
    rows = [r for r in per_frame if k != "covis_fraction" or r["covis_psnr"] is not None]
    vals = [r[k] for r in rows if r[k] is not None]
    out[k] = float(np.mean(vals)) if vals else None
  out["covis_frames"] = sum(r["covis_psnr"] is not None for r in per_frame)
  return out


def clip_scores(video, gt, source, frame_idx, factor, frames, min_fraction=MIN_FRACTION):
  """Co-visible scores of a streamed clip against its rendered source.

  Args:
    video, gt: uint8 ``[F, S, S, 3]`` (generated, ground truth) at frame size.
    source: the rendered clip (``frames``, ``depth``, ``c2w``, ``intrinsics`` at render size).
    frame_idx: ``[F]`` source frame of each window frame.
    factor: render size / frame size.
    frames: window frames to score.

  Returns:
    ``(summary dict, per-frame list)`` (:func:`summarize`, :func:`score_frames`).
  """
  sl = np.asarray(frame_idx)
  depth, c2w, k = source["depth"][sl], source["c2w"][sl], source["intrinsics"][sl]
  cov, rev, _ = covisible_masks(depth, c2w, k, factor)
  warp = warp_reference(source["frames"][sl], depth, c2w, k, factor)
  refs = frame_references(gt[0], warp, len(gt))
  per_frame = score_frames(video, gt, cov, rev, refs, frames, min_fraction)
  return summarize(per_frame), per_frame
