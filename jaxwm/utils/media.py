"""Writing frames as GIF (Pillow) or MP4 (imageio-ffmpeg) for people to look at."""

import os
import pathlib

import numpy as np


def to_uint8(frames):
  """``[F, H, W, 3]`` uint8, or floats in ``[0, 1]`` -> uint8."""
  frames = np.asarray(frames)
  if frames.dtype == np.uint8:
    return frames
  return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)


def side_by_side(*videos, gap=2):
  """Concatenates ``[F, H, W, 3]`` videos horizontally with a white gap."""
  videos = [to_uint8(v) for v in videos]
  f, h = videos[0].shape[:2]
  sep = np.full((f, h, gap, 3), 255, np.uint8)
  out = [videos[0]]
  for v in videos[1:]:
    out += [sep, v]
  return np.concatenate(out, axis=2)


def write_video(path, frames, fps=10, scale=1):
  """Writes ``[F, H, W, 3]`` frames to ``.gif`` or ``.mp4`` (by extension), atomically.

  Args:
    scale: integer nearest-neighbour upscaling (small frames are hard to see).
  """
  frames = to_uint8(frames)
  if scale > 1:
    frames = frames.repeat(scale, axis=1).repeat(scale, axis=2)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
  if path.suffix.lower() == ".gif":
    from PIL import Image  # pylint: disable=g-import-not-at-top
    images = [Image.fromarray(f) for f in frames]
    images[0].save(tmp, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
  elif path.suffix.lower() == ".mp4":
    import imageio.v2 as imageio  # pylint: disable=g-import-not-at-top
    h, w = frames.shape[1:3]
    pad = ((0, 0), (0, (-h) % 16), (0, (-w) % 16), (0, 0))  # codec-friendly sizes
    imageio.mimwrite(tmp, np.pad(frames, pad), fps=fps, codec="libx264", macro_block_size=16, format="FFMPEG")
  else:
    raise ValueError(f"path must end in .gif or .mp4; got {str(path)!r}")
  os.replace(tmp, path)
  return path
