"""What the training loader renders, and when: the first batch, the records read ahead, the rooms built.

  python benchmarks/loader.py                 # the default config on the procedural source (rendered on the fly)
  python benchmarks/loader.py --render 16 --image 16 --frames 9 --window 5 --clips 16   # the tests' loader

Three loaders over the same records, each in a fresh state (rooms forgotten), measured in one process:
- ``before``: grain's default read-ahead (500 records on 16 threads) and rooms cached by ``functools.lru_cache``
  alone, so every reader thread that asks for a room not yet built builds it;
- ``one build per room``: the same read-ahead, concurrent callers of ``make_scene`` waiting for one build;
- ``now``: one build per room and ``data.read_ahead`` batches ahead (default 2).
For each: seconds to the first batch, records read and textures built by then, and ``--settle`` seconds later
(what the readers do while a step would compute), and the process CPU seconds spent over both.
"""

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # noqa: E402
from jaxwm.data.procedural import clips as clips_lib  # noqa: E402
from jaxwm.data.procedural import scene as scene_lib  # noqa: E402
from jaxwm.training import data as data_lib  # noqa: E402


def measure(cfg, batch, settle, lock_rooms, read_ahead):
  """``(first batch s, records read then, textures then, records read after settle, textures, CPU s)``."""
  read, built, guard = [0], [0], threading.Lock()
  real_get, real_tex = clips_lib.ProceduralClips.__getitem__, scene_lib.make_texture

  def get(self, i):
    with guard:
      read[0] += 1
    return real_get(self, i)

  def tex(rng, size):
    with guard:
      built[0] += 1
    return real_tex(rng, size)

  scene_lib.clear_scene_cache()
  clips_lib.ProceduralClips.__getitem__, scene_lib.make_texture = get, tex
  unlocked = scene_lib._cached_scene  # pylint: disable=protected-access
  clips_lib.make_scene = scene_lib.make_scene if lock_rooms else unlocked
  cfg.data.read_ahead = read_ahead
  try:
    cpu, t = time.process_time(), time.perf_counter()
    it = iter(data_lib.make_loader(cfg.data, cfg.seed, batch))
    next(it)
    first, r1, b1 = time.perf_counter() - t, read[0], built[0]
    time.sleep(settle)
    result = first, r1, b1, read[0], built[0], time.process_time() - cpu
    it._iterator.close()  # pylint: disable=protected-access  # cancels queued reads; running ones finish
    while any(t.name.startswith("grain-prefetch") for t in threading.enumerate()):
      time.sleep(0.05)  # so that no read of this row lands in the next row's counts or cache
    return result
  finally:
    clips_lib.ProceduralClips.__getitem__, scene_lib.make_texture = real_get, real_tex
    clips_lib.make_scene = scene_lib.make_scene


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=4, help="records per batch (one process)")
  p.add_argument("--render", type=int, default=None, help="data.render_size (default: the config's)")
  p.add_argument("--image", type=int, default=None, help="data.image_size (default: the config's)")
  p.add_argument("--frames", type=int, default=None, help="data.clip_frames (default: the config's)")
  p.add_argument("--window", type=int, default=None, help="data.num_frames (default: the config's)")
  p.add_argument("--clips", type=int, default=None, help="data.num_clips (default: the config's)")
  p.add_argument("--settle", type=float, default=2.0, help="seconds after the first batch")
  p.add_argument("--repeats", type=int, default=2)
  a = p.parse_args()
  for name in ("batch", "repeats"):
    if getattr(a, name) < 1:
      p.error(f"--{name} must be >= 1; got {getattr(a, name)}")
  cfg = tiny.get_config()
  cfg.data.source = "procedural"
  sizes = (("render_size", a.render), ("image_size", a.image), ("clip_frames", a.frames), ("num_frames", a.window),
           ("num_clips", a.clips))
  for key, v in sizes:
    if v is not None:
      cfg.data[key] = v
  grain_default = -(-500 // a.batch)
  rows = {"before": (False, grain_default), "one build per room": (True, grain_default),
          f"now (read_ahead {cfg.data.read_ahead})": (True, cfg.data.read_ahead)}
  print(f"procedural source: {cfg.data.num_clips} clips of {cfg.data.clip_frames} frames at {cfg.data.render_size} px, "
        f"{cfg.data.clips_per_scene} per room; batches of {a.batch}; {a.settle:g} s after the first batch")
  res = {k: [] for k in rows}
  for _ in range(a.repeats):  # interleaved, so drift hits every row alike
    for k, (lock_rooms, ahead) in rows.items():
      res[k].append(measure(cfg, a.batch, a.settle, lock_rooms, ahead))
  print("| loader | first batch (s) | records read by then | textures built by then | records read "
        f"{a.settle:g} s later | textures built | CPU s |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for k, v in res.items():
    m = np.median(np.array(v), axis=0)
    print(f"| {k} | {m[0]:.2f} | {m[1]:.0f} | {m[2]:.0f} | {m[3]:.0f} | {m[4]:.0f} | {m[5]:.2f} |")


if __name__ == "__main__":
  main()
