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
