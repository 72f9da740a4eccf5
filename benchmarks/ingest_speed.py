"""Ingestion across processes: clips per second of one process against the same videos split over N processes
(``--process_index i --process_count N``, all started at once on this machine), in one run.

  python benchmarks/ingest_speed.py                                # 16 procedural videos, wan2.2-tiny:0, 1 vs 2
  python benchmarks/ingest_speed.py --videos 32 --processes 1,2,4 --vae space_to_depth:16
  python benchmarks/ingest_speed.py --videos 48 --pin                 # each process on its own core (hosts)

Each configuration ingests into a fresh folder; the wall time includes each process's start (imports, encoder
build and compilation), which is what a user pays; clips per second per process = clips / processes / wall.
The records of every multi-process run are checked equal to the one-process run's. Unpinned, the processes share
the machine's cores (XLA already uses them all, so on one host this measures the overhead of splitting); with
``--pin`` process i runs on core i alone (``taskset``) and the one-process baseline on core 0 alone: one core stands
for one host, which is how a pod divides the work.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxwm.data.procedural.export import export  # noqa: E402
from jaxwm.data.records import RecordClips  # noqa: E402


def _run(src, out, n, vae, frames, size, pin):
  args = [sys.executable, "-m", "jaxwm.data.ingest", "--videos", f"{src}/videos", "--cameras", f"{src}/cameras",
          "--captions", f"{src}/captions.jsonl", "--out", out, "--height", str(size), "--width", str(size),
          "--clip_frames", str(frames), "--vae", vae, "--no_progress"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  t = time.perf_counter()
  pre = lambda i: ["taskset", "-c", str(i)] if pin else []
  procs = [subprocess.Popen(pre(i) + args + (["--process_index", str(i), "--process_count", str(n)] if n > 1 else []),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
  outs = [p.communicate() for p in procs]
  wall = time.perf_counter() - t
  if any(p.returncode for p in procs):
    raise SystemExit(f"ingest failed: {outs}")
  return wall


def _records(out):
  src = RecordClips(out)
  return {json.loads(src[i]["meta"])["stem"]: src[i] for i in range(len(src))}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--videos", type=int, default=16)
  p.add_argument("--frames", type=int, default=41)
  p.add_argument("--size", type=int, default=64)
  p.add_argument("--processes", default="1,2")
  p.add_argument("--vae", default="wan2.2-tiny:0")
  p.add_argument("--pin", action="store_true", help="process i on core i alone (one core stands for one host)")
  a = p.parse_args()
  try:
    counts = [int(x) for x in a.processes.split(",")]
  except ValueError:
    p.error(f"--processes={a.processes!r}: must be comma-separated integers, e.g. 1,2")
  if not counts or min(counts) < 1:
    p.error(f"--processes={a.processes!r}: each count must be >= 1")
  if a.pin and max(counts) > os.cpu_count():
    p.error(f"--processes={a.processes!r} with --pin: at most {os.cpu_count()} (one core per process)")
  with tempfile.TemporaryDirectory() as d:
    export(f"{d}/src", clips=a.videos, frames=a.frames, size=(a.size, a.size))
    rows, ref = [], None
    for n in counts:
      out = f"{d}/out{n}"
      wall = _run(f"{d}/src", out, n, a.vae, a.frames, a.size, a.pin)
      recs = _records(out)
      if ref is None:
        ref = recs
      else:
        assert recs.keys() == ref.keys()
        for k in ref:
          for f in ref[k]:
            np.testing.assert_array_equal(recs[k][f], ref[k][f])
      rows.append((n, wall, len(recs) / wall, len(recs) / wall / n))
  print(f"{a.videos} videos of {a.frames} frames at {a.size}x{a.size}, --vae {a.vae}, {os.cpu_count()} CPU cores"
        + (", process i pinned to core i" if a.pin else ", cores shared"))
  print("| processes | wall s | clips/s | clips/s per process | speed-up |")
  print("| --- | --- | --- | --- | --- |")
  for n, wall, cps, per in rows:
    print(f"| {n} | {wall:.1f} | {cps:.2f} | {per:.2f} | {rows[0][1] / wall:.2f}x |")


if __name__ == "__main__":
  main()
