"""Reading videos (PyAV) into uint8 frames with timestamps; resampling in time; resize + centre
crop with exactly adjusted intrinsics.

Pixel convention (as ``jaxwm.geometry.cameras``): the centre of pixel ``(i, j)`` is at
``(u, v) = (j + 0.5, i + 0.5)``, so resizing a ``W``-wide image to ``W'`` maps ``u -> u W' / W``
exactly (pixel edges to pixel edges; Pillow's resize samples this way) and cropping ``left``
columns maps ``u -> u - left``.
"""

import pathlib

import numpy as np

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v")


def crop_plan(in_hw, out_hw):
  """How ``in_hw`` becomes ``out_hw``: resize to cover ``out_hw`` (aspect kept up to rounding),
  then crop the centre.

  Returns:
    ``(resized_hw, (top, left))``: the integer size after resizing and the crop offset.
  """
  (h, w), (oh, ow) = in_hw, out_hw
  s = max(oh / h, ow / w)
  rh, rw = max(oh, int(round(h * s))), max(ow, int(round(w * s)))
  return (rh, rw), ((rh - oh) // 2, (rw - ow) // 2)


def adjust_intrinsics(intrinsics, in_hw, out_hw):
  """``[..., 3, 3]`` pixel intrinsics of ``in_hw`` frames -> those of :func:`resize_center_crop`'s
  ``out_hw`` frames: row 0 scaled by ``W_r / W``, row 1 by ``H_r / H``, then ``(cx, cy) -= (left, top)``."""
  (rh, rw), (top, left) = crop_plan(in_hw, out_hw)
  k = np.array(intrinsics, dtype=np.float64)
  k[..., 0, :] *= rw / in_hw[1]
  k[..., 1, :] *= rh / in_hw[0]
  k[..., 0, 2] -= left
  k[..., 1, 2] -= top
  return k


def _resize_crop_one(frame, out_hw, plan):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  (rh, rw), (top, left) = plan
  if (rh, rw) != frame.shape[:2]:
    frame = np.asarray(Image.fromarray(frame).resize((rw, rh), Image.Resampling.BICUBIC))
  return frame[top:top + out_hw[0], left:left + out_hw[1]]


def resize_center_crop(frames, intrinsics, out_hw):
  """Resizes ``frames`` (uint8 ``[N, H, W, 3]``) to cover ``out_hw`` and crops the centre.

  Returns:
    ``(frames uint8 [N, *out_hw, 3], intrinsics [N, 3, 3] float64)`` (:func:`adjust_intrinsics`;
    ``intrinsics`` may be None, then None is returned for it).
  """
  frames = np.asarray(frames)
  in_hw = frames.shape[1:3]
  plan = crop_plan(in_hw, out_hw)
  out = np.stack([_resize_crop_one(f, out_hw, plan) for f in frames]) if len(frames) else frames
  return out, None if intrinsics is None else adjust_intrinsics(intrinsics, in_hw, out_hw)


class _NoVideo(Exception):
  pass


def read_video(path, out_hw=None):
  """Decodes every frame of a video with PyAV.

  Args:
    path: the video file.
    out_hw: if given, each frame is resized and centre-cropped to it as it is decoded
      (:func:`resize_center_crop`), so memory holds only output-size frames.

  Returns:
    dict with ``frames`` uint8 ``[N, H, W, 3]`` (RGB), ``timestamps`` float64 ``[N]`` (seconds,
    presentation time; ``index / fps`` where the container has none), ``fps`` (float, the
    stream's average rate) and ``source_hw`` (the decoded size before resizing).

  Raises:
    ValueError: one line, when the file cannot be opened or decoded or has no video frames.
  """
  import av  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(path)
  frames, times = [], []
  try:
    with av.open(str(path)) as container:
      if not container.streams.video:
        raise _NoVideo("no video stream")
      stream = container.streams.video[0]
      rate = stream.average_rate or stream.guessed_rate
      fps = float(rate) if rate else 0.0
      plan = source_hw = None
      for frame in container.decode(stream):
        x = frame.to_ndarray(format="rgb24")
        if plan is None:
          source_hw = x.shape[:2]
          plan = crop_plan(source_hw, out_hw) if out_hw is not None else None
        frames.append(x if out_hw is None else _resize_crop_one(x, out_hw, plan))
        times.append(np.nan if frame.time is None else float(frame.time))
  except _NoVideo as e:
    raise ValueError(str(e)) from None
  except Exception as e:  # pylint: disable=broad-except  # av.error.* and decoder failures
    raise ValueError(f"unreadable video ({type(e).__name__}: {' '.join(str(e).split())})") from None
  if not frames:
    raise ValueError("video has no frames")
  t = np.asarray(times, np.float64)
  if not np.isfinite(t).all() or (len(t) > 1 and np.any(np.diff(t) <= 0)):
    if fps <= 0:
      raise ValueError("video has neither timestamps nor a frame rate")
    t = np.arange(len(frames)) / fps
  if fps <= 0:
    fps = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else 1.0
  return {"frames": np.stack(frames), "timestamps": t, "fps": fps, "source_hw": tuple(int(s) for s in source_hw)}


def resample_indices(timestamps, fps=None, stride=None):
  """Which frames to keep: every ``stride``-th, or the frame nearest each tick of a ``fps`` clock.

  Args:
    timestamps: ``[N]`` seconds, increasing.
    fps: target frame rate; ticks at ``t_0 + k / fps`` up to the last frame. Must not exceed
      the video's rate (that would repeat frames).
    stride: keep frames ``0, stride, 2 stride, ...``. Give exactly one of ``fps`` and ``stride``.

  Returns:
    int64 ``[M]`` increasing indices into the frames.
  """
  t = np.asarray(timestamps, np.float64)
  if (fps is None) == (stride is None):
    raise ValueError(f"give exactly one of fps and stride; got fps={fps}, stride={stride}")
  if stride is not None:
    if int(stride) != stride or stride < 1:
      raise ValueError(f"stride must be an integer >= 1; got {stride}")
    return np.arange(0, len(t), int(stride), dtype=np.int64)
  if not fps > 0:
    raise ValueError(f"fps must be > 0; got {fps}")
  if len(t) == 1:
    return np.zeros(1, np.int64)
  src_fps = (len(t) - 1) / (t[-1] - t[0])
  if fps > src_fps * 1.001:
    raise ValueError(f"target fps {fps:g} is above the video's {src_fps:.4g} (frames would repeat)")
  ticks = t[0] + np.arange(int(np.floor((t[-1] - t[0]) * fps + 1e-6)) + 1) / fps
  right = np.clip(np.searchsorted(t, ticks), 1, len(t) - 1)
  nearest = np.where(ticks - t[right - 1] <= t[right] - ticks, right - 1, right)
  return nearest.astype(np.int64)


def write_mp4(path, frames, fps=10):
  """Writes uint8 ``[N, H, W, 3]`` frames as an H.264 MP4 at exactly ``fps`` (PyAV; even ``H, W``): the
  inverse of :func:`read_video` up to codec loss, e.g. to turn procedural clips into videos to ingest."""
  import av  # pylint: disable=g-import-not-at-top
  with av.open(str(path), "w") as c:
    s = c.add_stream("libx264", rate=fps)
    s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    for f in frames:
      for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
        c.mux(p)
    for p in s.encode():
      c.mux(p)
