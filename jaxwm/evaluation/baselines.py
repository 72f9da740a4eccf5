"""Trivial baselines every loop-closure score is read against.

- ``mean``: every frame is flat in the first frame's mean colour (what a model that has learned
  only the scene's average would produce).
- ``copy``: the first frame copied to every frame. It wins the return frame by construction (the
  return pose equals frame 0's), so it is compared only on the frames in between, where it is wrong.

A model remembers where its return frame beats ``mean`` and its in-between frames beat ``copy``.
"""

import numpy as np

from jaxwm.evaluation.metrics import psnr, ssim

BASELINES = ("mean", "copy")
PSNR_CAP = 60.0  # dB given to an exact frame, so that means over frames stay finite


def _psnr(a, b):
  return np.minimum(np.asarray(psnr(a, b), np.float64), PSNR_CAP)


def baseline_video(name, first, num_frames):
  """uint8 ``[F, H, W, 3]`` baseline video from the first frame ``first [H, W, 3]`` uint8."""
  first = np.asarray(first)
  if name == "mean":
    colour = np.round(first.reshape(-1, first.shape[-1]).astype(np.float64).mean(0)).astype(np.uint8)
    return np.broadcast_to(colour, (num_frames, *first.shape)).copy()
  if name == "copy":
    return np.broadcast_to(first, (num_frames, *first.shape)).copy()
  raise ValueError(f"baseline must be one of {BASELINES}; got {name!r}")


def frame_scores(video, gt, return_frame):
  """Scores of ``video`` against ``gt`` (uint8 ``[F, H, W, 3]``; frame 0 is given, not scored).

  Returns:
    dict: ``psnr``/``ssim`` over frames ``1..F-1``; ``between_psnr``/``between_ssim`` over the frames
    strictly between 0 and the return frame (when ``return_frame >= 2``); ``return_psnr``/``return_ssim``
    of the return frame against the first frame (when ``return_frame >= 1``). Per-frame PSNR is capped
    at :data:`PSNR_CAP` (an exact frame, e.g. the middle of a 180-degree loop about all three axes,
    whose pose is frame 0's, copied).
  """
  out = {"psnr": float(np.mean(_psnr(video[1:], gt[1:]))), "ssim": float(np.mean(ssim(video[1:], gt[1:])))}
  if return_frame >= 2:
    sl = slice(1, return_frame)
    out["between_psnr"] = float(np.mean(_psnr(video[sl], gt[sl])))
    out["between_ssim"] = float(np.mean(ssim(video[sl], gt[sl])))
  if return_frame >= 1:
    out["return_psnr"] = float(_psnr(video[return_frame], gt[0]))
    out["return_ssim"] = float(ssim(video[return_frame], gt[0]))
  return out


def return_colour(video, gt, return_frame):
  """The return frame's colour offset against the first frame (uint8 ``[F, H, W, 3]``, ``return_frame >= 1``).

  Returns:
    dict: ``return_offset`` (mean RGB of the return frame minus the first frame's, in levels of 255, averaged
    over channels: negative is darker), ``return_offset_rgb`` (per channel) and ``return_psnr_offset_free``
    (PSNR after subtracting the per-channel offset, capped at :data:`PSNR_CAP`): a global brightness or tint
    error told apart from layout and detail.
  """
  ret, first = (np.asarray(x, np.float64) for x in (video[return_frame], gt[0]))
  off = (ret - first).reshape(-1, ret.shape[-1]).mean(0)
  mse = float(np.mean((ret - off - first) ** 2))
  free = PSNR_CAP if mse == 0 else min(10 * np.log10(255.0 ** 2 / mse), PSNR_CAP)
  return {"return_offset": float(off.mean()), "return_offset_rgb": [float(x) for x in off],
          "return_psnr_offset_free": float(free)}


def baseline_scores(gt, return_frame):
  """``{f"{name}_{score}": value}`` of both baselines; ``copy`` keeps only its in-between scores (its return
  frame is trivially perfect, which makes its all-frame PSNR infinite)."""
  out = {}
  for name in BASELINES:
    s = frame_scores(baseline_video(name, gt[0], len(gt)), gt, return_frame)
    if name == "copy":
      s = {k: v for k, v in s.items() if k.startswith("between_")}
    out.update({f"{name}_{k}": v for k, v in s.items()})
  return out


def remembers(row):
  """True where a clip's model scores beat both baselines where each is not trivially right: the return
  frame against ``mean`` and the in-between frames against ``copy`` (None when a score is missing)."""
  keys = ("return_psnr", "mean_return_psnr", "between_psnr", "copy_between_psnr")
  if any(row.get(k) is None for k in keys):
    return None
  return bool(row["return_psnr"] > row["mean_return_psnr"] and row["between_psnr"] > row["copy_between_psnr"])
