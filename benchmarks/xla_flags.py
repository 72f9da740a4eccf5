"""XLA:CPU flags on the training step: each setting of ``XLA_FLAGS`` in a fresh process, rounds in turn, against
the unflagged step measured in the same run (``benchmarks/train_step.py``'s backbone step, or with ``--step real``
the real train step: the config's encoding, layout and attention impl).

  python benchmarks/xla_flags.py                       # the default flags, recipe_w192 and tiny, 2 rounds
  python benchmarks/xla_flags.py --configs tiny_p2 --rounds 3 --flags="--xla_cpu_use_onednn=true"
  python benchmarks/xla_flags.py --step real --configs tiny --flags="--xla_cpu_experimental_ynn_fusion_type="

Prints ms per step for every (round, flag, config), then each flag's median over rounds against the unflagged
median. An unknown flag is reported as a failure of its process, not a number.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT_FLAGS = ("--xla_cpu_use_thunk_runtime=false", "--xla_cpu_use_xnnpack=true",
                 "--xla_cpu_enable_concurrency_optimized_scheduler=true", "--xla_cpu_experimental_ynn_fusion_type=",
                 "--xla_cpu_use_fusion_emitters=false")
STEPS = {"recipe_w192": 8, "tiny": 3}

CHILD = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks")); sys.path.insert(0, os.getcwd())
import train_step as T
out = {}
bench = T.bench_jaxwm if sys.argv[2] == "real" else T.bench_jaxwm_backbone
for name, steps in json.loads(sys.argv[1]):
  c = T.CONFIGS[name](); T.resolve_batch_size(c, 1); c.train.workdir = "/tmp/jaxwm_xla_flags"
  out[name] = round(bench(c, steps)[0] * 1e3, 1)
print("RESULT", json.dumps(out))
"""


def measure(flag, configs, step="backbone"):
  """``{config: ms per step}`` of ``step`` (``backbone`` or ``real``) in a fresh process with ``XLA_FLAGS=flag``,
  or the failure's last line."""
  env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(configs), step], env=env, capture_output=True, text=True,
                     cwd=root, timeout=1200, check=False)
  for line in p.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[7:])
  err = p.stderr.strip().splitlines()
  return f"failed: {err[-1][:160] if err else p.returncode}"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--configs", default="recipe_w192,tiny")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--flags", default="|".join(DEFAULT_FLAGS), help="'|'-separated XLA_FLAGS settings")
  p.add_argument("--step", default="backbone", choices=("backbone", "real"), help="which training step")
  a = p.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import train_step  # pylint: disable=g-import-not-at-top
  names = [n for n in a.configs.split(",") if n]
  bad = [n for n in names if n not in train_step.CONFIGS]
  if bad or a.rounds < 1:
    p.error(f"--configs: {bad} not among {sorted(train_step.CONFIGS)}" if bad else f"--rounds={a.rounds}: >= 1")
  configs = [(n, STEPS.get(n, 3)) for n in names]
  flags = list(dict.fromkeys([""] + a.flags.split("|")))  # the unflagged baseline first
  results = {f: [] for f in flags}
  for r in range(a.rounds):
    for f in flags:
      got = measure(f, configs, a.step)
      results[f].append(got)
      print(f"round {r + 1} {f or '(none)'}: {got}", flush=True)
  base = [x for x in results[""] if isinstance(x, dict)]
  print("\nmedian ms per step over rounds (ratio to no flag):")
  for f, xs in results.items():
    ok = [x for x in xs if isinstance(x, dict)]
    if not ok:
      print(f"{f or '(none)'}: {xs[0]}")
      continue
    cells = []
    for n, _ in configs:
      med = statistics.median(x[n] for x in ok)
      ref = statistics.median(x[n] for x in base) if base else float("nan")
      cells.append(f"{n} {med:.1f} ({med / ref:.2f}x)")
    print(f"{f or '(none)'}: " + ", ".join(cells))
  return 0


if __name__ == "__main__":
  sys.exit(main())
