"""jaxwm's backbone step against diffusers' in PyTorch, each alone in its own process, in alternated rounds: the
ratio issue 34 asks for (>= 1: jaxwm at least as fast), measured so that this VM's drift hits both sides alike.

  python benchmarks/versus_torch.py                                   # the five CPU configs, 5 rounds
  python benchmarks/versus_torch.py --configs tiny,small --rounds 7 --steps 5

Per config and round: ``train_step.py --backbone-only`` (jaxwm's backbone step, ``train_step.jaxwm_backbone_step``:
rope3d, dense attention, 1-token context, AdamW; huge pages on, as ``train.py`` runs) and ``train_step.py
--torch-only`` (diffusers' ``WanTransformer3DModel`` at the same shapes; torch's defaults, every core) as two fresh
processes, their order swapped every other round; each reports its mean step over ``--steps`` steps after one
warm-up step. Printed: each side's median over the rounds, the median of the rounds' ratios (torch time / jaxwm
time) and their range.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = "tiny,small,tiny_viewrope_tf,recipe_w192,recipe_w384"


def _child(flag, name, steps):
  env = dict(os.environ)
  if flag == "--torch-only":
    env.pop("GLIBC_TUNABLES", None)
    env["JAXWM_HUGEPAGES"] = "0"  # torch's default allocator
  out = subprocess.run([sys.executable, os.path.join(HERE, "train_step.py"), flag, name, "--steps", str(steps)],
                       env=env, capture_output=True, text=True, check=False)
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode or not lines:
    raise SystemExit(f"{flag} {name} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
  return json.loads(lines[-1])["s"]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default=DEFAULT)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=5)
  a = p.parse_args()
  sys.path.insert(0, HERE)
  from train_step import CONFIGS  # pylint: disable=g-import-not-at-top
  names = a.configs.split(",")
  bad = [n for n in names if n not in CONFIGS]
  if bad or a.rounds < 1 or a.steps < 1:
    p.error(f"--configs must be among {sorted(CONFIGS)} (got {bad}); --rounds, --steps >= 1")
  print(f"{os.cpu_count()} CPUs; {a.rounds} alternated rounds of {a.steps} steps per side")
  print("| config | jaxwm backbone ms (median) | torch ms (median) | torch / jaxwm (median of rounds) | range |")
  print("| --- | --- | --- | --- | --- |")
  for name in names:
    jx, tc = [], []
    for r in range(a.rounds):
      sides = ["--backbone-only", "--torch-only"][::1 if r % 2 == 0 else -1]
      got = {flag: _child(flag, name, a.steps) for flag in sides}
      jx.append(got["--backbone-only"])
      tc.append(got["--torch-only"])
      print(f"  {name} round {r + 1}: jaxwm {jx[-1] * 1e3:.1f} ms, torch {tc[-1] * 1e3:.1f} ms", file=sys.stderr,
            flush=True)
    ratios = [t / j for t, j in zip(tc, jx)]
    print(f"| {name} | {statistics.median(jx) * 1e3:.1f} | {statistics.median(tc) * 1e3:.1f} | "
          f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |", flush=True)


if __name__ == "__main__":
  main()
