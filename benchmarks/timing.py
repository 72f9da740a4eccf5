"""Timing shared by the benchmarks: the best time of several functions called in turn (this VM's speed drifts by
tens of percent within a minute, so interleaving makes every function see the same drift)."""

import time


def interleaved_best(fns, repeats):
  """``{name: best seconds}`` of ``fns`` (a dict of no-argument callables), after one warm-up call each, calling
  them in turn ``repeats`` times."""
  for fn in fns.values():
    fn()
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t0)
  return {k: min(v) for k, v in times.items()}


def run_times(fn, repeats, warmup=1):
  """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times


def paired(fns, rounds, warmup=1):
  """``{name: {"min", "median", "cpu_median"}}`` seconds of ``fns`` (no-argument callables) called in turn for
  ``rounds`` rounds, the order reversed every other round, after ``warmup`` untimed calls each. ``cpu_median`` is
  the process's CPU time per call (all threads): this VM's wall time drifts, and its CPU time drifts less."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
  items = list(fns.items())
  for r in range(rounds):
    for k, fn in (items if r % 2 == 0 else items[::-1]):
      t0, c0 = time.perf_counter(), time.process_time()
      fn()
      wall[k].append(time.perf_counter() - t0)
      cpu[k].append(time.process_time() - c0)
  return {k: {"min": min(wall[k]), "median": float(np.median(wall[k])), "cpu_median": float(np.median(cpu[k]))}
          for k in fns}
