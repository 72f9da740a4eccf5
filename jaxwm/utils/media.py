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


def pose_captions(c2w):
  """One caption per frame from ``c2w [F, 4, 4]``: the frame index, the rotation angle from frame 0 (degrees)
  and the distance from frame 0's centre, e.g. ``"frame 3  rot 45deg  move 0.20"``."""
  c2w = np.asarray(c2w, np.float64)
  rel = np.einsum("ji,fjk->fik", c2w[0, :3, :3], c2w[:, :3, :3])
  ang = np.degrees(np.arccos(np.clip((np.trace(rel, axis1=1, axis2=2) - 1) / 2, -1, 1)))
  dist = np.linalg.norm(c2w[:, :3, 3] - c2w[0, :3, 3], axis=-1)
  return [f"frame {i}  rot {a:.0f}deg  move {d:.2f}" for i, (a, d) in enumerate(zip(ang, dist))]


def labelled(videos, captions=None, scale=1, gap=2):
  """Side-by-side panels with a label above each and a caption line per frame below.

  Args:
    videos: ``{label: [F, H, W, 3]}`` (e.g. ``{"ground truth": gt, "generated": video}``), left to right.
    captions: ``F`` strings (e.g. :func:`pose_captions`), or None.
    scale: integer nearest-neighbour upscaling of the frames before the text is drawn.

  Returns:
    uint8 ``[F, H', W', 3]``.
  """
  from PIL import Image, ImageDraw  # pylint: disable=g-import-not-at-top
  panels = [to_uint8(v) for v in videos.values()]
  if scale > 1:
    panels = [p.repeat(scale, axis=1).repeat(scale, axis=2) for p in panels]
  body = side_by_side(*panels, gap=gap)
  f, h, w = body.shape[:3]
  band = 14
  out = np.full((f, h + band * (2 if captions else 1), w, 3), 255, np.uint8)
  out[:, band:band + h] = body
  pw = panels[0].shape[2]
  for i in range(f):
    img = Image.fromarray(out[i])
    draw = ImageDraw.Draw(img)
    for j, label in enumerate(videos):
      draw.text((j * (pw + gap) + 2, 1), str(label), fill=(0, 0, 0))
    if captions:
      draw.text((2, band + h + 1), str(captions[i]), fill=(0, 0, 0))
    out[i] = np.asarray(img)
  return out


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
