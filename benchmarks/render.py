"""Renderer speed: frames per second of the procedural ray caster on one core.

  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 taskset -c 0 python benchmarks/render.py

Baseline in the same run: the same rays cast one frame at a time (``chunk_frames=1``), and
the issue's target (a 61-frame 128x128 clip in under 2 s).
"""

import argparse
import os
import time

import numpy as np

from jaxwm.data.procedural import make_clip, make_scene, render
from jaxwm.data.procedural.scene import clear_scene_cache


def _time(fn, repeats):
  fn()
  best = np.inf
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--frames", type=int, default=61)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--scenes", type=int, default=3)
  args = p.parse_args()
  print(f"cpu affinity: {len(os.sched_getaffinity(0))} core(s); frames per clip: {args.frames}")
  print(f"{'size':>9} {'chunk':>6} {'clip s':>8} {'fps':>8} {'scene build s':>14}")
  for size in (64, 128):
    for chunk in (8, 1):
      clip_s, build_s = [], []
      for seed in range(args.scenes):
        clear_scene_cache()
        t = time.perf_counter()
        scene = make_scene(seed)
        build_s.append(time.perf_counter() - t)
        c = make_clip(seed, seed, args.frames, (size, size), "rotate_loop", "yaw+pitch", 90.0)
        clip_s.append(_time(lambda: render(scene, c["c2w"], c["intrinsics"], (size, size), chunk_frames=chunk),
                            args.repeats))
      s = float(np.mean(clip_s))
      print(f"{size:>4}x{size:<4} {chunk:>6} {s:>8.3f} {args.frames / s:>8.1f} {np.mean(build_s):>14.3f}")
  print("target: 61-frame 128x128 clip < 2 s on one core (chunk 8 is the default)")


if __name__ == "__main__":
  main()
