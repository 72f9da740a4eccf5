"""A clip window: ``num_frames`` frames at a stride, area-downsampled, cameras re-anchored on the
first frame (a grain transform; used by training's loader, sampling and evaluation)."""

import grain.python as grain
import numpy as np

from jaxwm.geometry.cameras import reanchor
from jaxwm.geometry.formats import opengl_to_opencv


def _area_downsample(frames, factor):
  if factor == 1:
    return frames
  f, h, w, c = frames.shape
  x = frames.reshape(f, h // factor, factor, w // factor, factor, c).astype(np.float32).mean(axis=(2, 4))
  return np.clip(np.rint(x), 0, 255).astype(np.uint8)


class ClipWindow(grain.RandomMapTransform):
  """Random window of ``num_frames`` frames at ``frame_stride``; frames resized to ``image_size``
  by integer area downsampling; cameras re-anchored on the window's first frame.

  Per source (ReWorld §3.3, App. A.2): ``convention`` of the stored poses (``opencv`` or
  ``opengl``, converted to OpenCV) and ``scale_divisor`` (translations divided by it, putting
  every source on one metric scale). With probability ``palindrome_prob`` the window is a
  palindrome: its first ``(num_frames + 1) // 2`` frames, then the same path exactly reversed,
  so the last frame revisits the first (ReWorld §3.4).

  Output: ``frames`` uint8 ``[F, S, S, 3]``, ``c2w`` float32 ``[F, 4, 4]``, ``intrinsics``
  float32 ``[F, 3, 3]`` (pixels of the output size).
  """

  def __init__(self, num_frames, frame_stride, image_size, palindrome_prob=0.0, scale_divisor=1.0,
               convention="opencv"):
    if convention not in ("opencv", "opengl"):
      raise ValueError(f"data.convention must be 'opencv' or 'opengl'; got {convention!r}")
    if scale_divisor <= 0:
      raise ValueError(f"data.scale_divisor must be > 0; got {scale_divisor}")
    if palindrome_prob > 0 and num_frames % 2 == 0:
      raise ValueError(f"palindromes need an odd data.num_frames (a path and its reverse); got {num_frames}")
    self.num_frames, self.frame_stride, self.image_size = num_frames, frame_stride, image_size
    self.palindrome_prob, self.scale_divisor, self.convention = palindrome_prob, scale_divisor, convention

  def window_indices(self, total, rng, start=None):
    """``[num_frames]`` frame indices of a random window of a ``total``-frame clip (a palindrome with
    probability ``palindrome_prob``); ``start``: the first index (default: uniform)."""
    palindrome = self.palindrome_prob > 0 and rng.random() < self.palindrome_prob
    n_path = (self.num_frames + 1) // 2 if palindrome else self.num_frames
    span = (n_path - 1) * self.frame_stride + 1
    if span > total:
      raise ValueError(f"a window of {n_path} frames at stride {self.frame_stride} needs {span} frames; "
                       f"clips have {total}")
    if start is None:
      start = int(rng.integers(0, total - span + 1))
    idx = start + self.frame_stride * np.arange(n_path)
    return np.concatenate([idx, idx[-2::-1]]) if palindrome else idx

  def window_cameras(self, c2w, intrinsics, idx, factor=1):
    """``(c2w float32 [T, 4, 4], intrinsics float32 [T, 3, 3])`` of frames ``idx``: OpenCV axes, re-anchored on
    the first, translations divided by ``scale_divisor``, intrinsics divided by the downsampling ``factor``."""
    k = np.asarray(intrinsics, np.float32)[idx].copy()
    k[:, :2] /= factor
    c2w = np.asarray(c2w, np.float64)[idx]
    if self.convention == "opengl":
      c2w = opengl_to_opencv(c2w)
    c2w = reanchor(c2w)
    c2w[:, :3, 3] /= self.scale_divisor
    return c2w.astype(np.float32), k

  def random_map(self, clip, rng):
    frames = np.asarray(clip["frames"])
    total, h, w = frames.shape[:3]
    if h != w or h % self.image_size:
      raise ValueError(f"clip frames {h}x{w} cannot be area-downsampled to {self.image_size}")
    idx = self.window_indices(total, rng)
    factor = h // self.image_size
    c2w, k = self.window_cameras(clip["c2w"], clip["intrinsics"], idx, factor)
    return {"frames": _area_downsample(frames[idx], factor), "c2w": c2w, "intrinsics": k}
