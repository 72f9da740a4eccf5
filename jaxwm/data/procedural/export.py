"""Procedural clips written as a user's own footage: MP4 videos, one RealEstate10K camera file per video and a
captions file, the inputs of ``python -m jaxwm.data.ingest`` (a stand-in for real videos when trying the
fine-tuning path, e.g. a paper recipe's ``smoke`` variant).

  python -m jaxwm.data.procedural --export data/smoke_videos --clips 4 --frames 41 --size 64

writes ``<dir>/videos/clip<i>.mp4`` (10 fps), ``<dir>/cameras/clip<i>.txt`` and ``<dir>/captions.jsonl``
(``{"stem": ..., "caption": ...}`` per line, from the scene's colours and the camera's motion).
"""

import json
import pathlib

import numpy as np

from jaxwm.data.procedural.clips import make_clip

FAMILIES = ("rotate_loop", "forward", "sideways", "orbit")  # a mix of turns and translations


def export(out, clips=4, frames=41, size=(64, 64), fps=10, seed=0):
  """Writes ``clips`` clips of ``frames`` frames at ``size`` (H, W) under ``out``; returns the stems."""
  from jaxwm.data.video import write_mp4  # pylint: disable=g-import-not-at-top
  from jaxwm.geometry.camera_files import write_cameras  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(out)
  (out / "videos").mkdir(parents=True, exist_ok=True)
  (out / "cameras").mkdir(parents=True, exist_ok=True)
  stems, lines = [], []
  for i in range(clips):
    family = FAMILIES[i % len(FAMILIES)]
    clip = make_clip(seed + i, seed + i, num_frames=frames, image_hw=tuple(size), family=family)
    stem = f"clip{i}"
    write_mp4(out / "videos" / f"{stem}.mp4", clip["frames"], fps=fps)
    write_cameras(out / "cameras" / f"{stem}.txt", clip["c2w"].astype(np.float64), clip["intrinsics"], tuple(size))
    lines.append(json.dumps({"stem": stem, "caption": f"a procedural room, camera {family.replace('_', ' ')}"}))
    stems.append(stem)
  (out / "captions.jsonl").write_text("\n".join(lines) + "\n")
  return stems
