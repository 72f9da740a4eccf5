"""The camera-encoding question on the co-visible score (issue 29): train every arm of configs/encodings.py,
score each on the 35 eval loops and the 35 translation walks, write a table with intervals.

  python benchmarks/encodings_covis.py --steps 240 --seeds 0            # trains, evaluates, reports
  python benchmarks/encodings_covis.py --steps 240 --seeds 0,1,2 --arms viewrope,worldrope --phase report

Resumable: a run whose JSON is under ``--results`` is skipped (``runs/`` is scratch); a training cut short resumes
from its last checkpoint (every 300 steps, and at a SIGTERM). Each run: `train.py` with
``configs/encodings.py:<arm>``, ``--config.train.num_steps=<steps>`` (the cosine schedule spans them), then
``jaxwm.evaluation.loop_closure.evaluate`` on loops (full memory) and walks, 4 Euler steps. The report pools
co-visible PSNR over every scored in-between frame; intervals are 95% bootstrap over seeds, then clips (a clip's
value is the mean over its scored frames). A second table gives paired differences between arms (the same seeds
and clips: every arm is scored on the same eval loops and walks), whose intervals decide the ranking.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

import reproduction  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from configs.encodings import ARMS  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

FAMILIES = ("loops", "walks")
# (better?, than) pairs the ranking rests on; each also read the other way when its interval is below 0
PAIRS = (("worldrope", "viewrope"), ("viewrope", "plucker"), ("viewrope", "gta"), ("plucker", "gta"),
         ("gta", "rope3d"), ("prope", "gta"), ("mrope", "gta"), ("plucker", "rope3d"))


def _train(args, arm, seed, wd):
  if (reproduction._latest_step(wd) or 0) >= args.steps:  # pylint: disable=protected-access
    return
  cmd = [sys.executable, "train.py", f"--config=configs/encodings.py:{arm}", f"--config.seed={seed}",
         f"--config.train.num_steps={args.steps}", f"--config.train.ckpt_every={min(args.steps, 300)}",
         f"--config.train.gain_every={args.steps}", f"--workdir={wd}"]
  reproduction.run_logged(cmd, wd, f"{arm} seed {seed}")


def _evaluate(args, arm, seed, wd, path):
  from jaxwm.evaluation import loop_closure as lc  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  config, model, variables, step = load_model(wd)
  out = {}
  for fam in FAMILIES:
    rows = lc.evaluate(config, model, variables, clips=args.clips, family=fam, steps=args.sample_steps, seed=0,
                       num_frames=9, frame_stride=2, gain=False)
    out[fam] = [{k: r.get(k) for k in ("clip", "axes", "magnitude", "return_psnr", "return_ssim", "covis_psnr",
                                       "covis_ssim", "revealed_psnr", "covis_per_frame")} for r in rows]
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps({"arm": arm, "seed": seed, "step": int(step), "steps": args.steps, "families": out}))
  os.replace(tmp, path)
  print(f"[eval] {arm} seed {seed}: {time.time() - t0:.0f} s", flush=True)


def _clip_values(rows, key="covis_psnr"):
  """Per clip: the mean of ``key`` over its scored frames (NaN when none)."""
  vals = []
  for r in rows:
    f = [x[key] for x in r.get("covis_per_frame", []) if x.get(key) is not None]
    vals.append(float(np.mean(f)) if f else np.nan)
  return vals


def _values(rows, key):
  """Per clip: the return frame's value, or the mean of ``key`` over the scored frames."""
  if key == "return_psnr":
    return [r[key] if r[key] is not None else np.nan for r in rows]
  return _clip_values(rows, key)


def _pooled(rows, key="covis_psnr"):
  f = [x[key] for r in rows for x in r.get("covis_per_frame", []) if x.get(key) is not None]
  return float(np.mean(f)) if f else np.nan


def bootstrap(values):
  """Mean and 95% interval of ``values [seeds, clips]``, resampling seeds, then clips (the reproduction's)."""
  return reproduction._bootstrap(values)  # pylint: disable=protected-access


def report(args, seeds):
  res = {}
  for arm in args.arms:
    for s in seeds:
      p = pathlib.Path(args.results) / f"{arm}_s{s}.json"
      if p.exists():
        res[(arm, s)] = json.loads(p.read_text())
  lines = [f"Camera encodings on the co-visible score: the default job's model, {args.steps} steps, seeds "
           f"{','.join(map(str, seeds))}; {args.clips} eval loops and {args.clips} walks, full memory, {args.sample_steps} Euler steps. "
           "Co-visible PSNR pooled over scored frames; [95% bootstrap interval over seeds, then clips].",
           "", "| encoding | seeds | loops co-visible | loops revealed | loops return | walks co-visible | walks revealed |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  fmt = lambda m: "-" if not np.isfinite(m[0]) else f"{m[0]:.2f} [{m[1]:.2f}, {m[2]:.2f}]"
  summary = {}
  for arm in args.arms:
    got = [s for s in seeds if (arm, s) in res]
    if not got:
      continue
    fam = {f: [res[(arm, s)]["families"][f] for s in got] for f in FAMILIES}
    pooled = {f: float(np.mean([_pooled(r) for r in fam[f]])) for f in FAMILIES}
    cells = []
    for f, key in (("loops", "covis_psnr"), ("loops", "revealed_psnr"), ("loops", "return_psnr"),
                   ("walks", "covis_psnr"), ("walks", "revealed_psnr")):
      if key == "return_psnr":
        mat = [[r[key] if r[key] is not None else np.nan for r in rows] for rows in fam[f]]
      else:
        mat = [_clip_values(rows, key) for rows in fam[f]]
      ci = bootstrap(mat)
      if key == "covis_psnr":  # the pooled value (every scored frame counts once) with the clip-level interval
        ci = (pooled[f],) + ci[1:]
      cells.append(fmt(ci))
    summary[arm] = pooled
    lines.append(f"| {arm} | {len(got)} | " + " | ".join(cells) + " |")
  lines += ["", "Paired differences (first arm minus second; per clip, the same seeds; [95% bootstrap over seeds, "
            "then clips]):", "", "| arms | loops co-visible | loops return | walks co-visible |", "| --- | --- | --- | --- |"]
  for a, b in PAIRS:
    common = [s for s in seeds if (a, s) in res and (b, s) in res]
    if not common or a not in args.arms or b not in args.arms:
      continue
    cells = []
    for f, key in (("loops", "covis_psnr"), ("loops", "return_psnr"), ("walks", "covis_psnr")):
      cells.append(fmt(bootstrap([np.subtract(_values(res[(a, s)]["families"][f], key),
                                              _values(res[(b, s)]["families"][f], key)) for s in common])))
    lines.append(f"| {a} - {b} ({len(common)} seeds) | " + " | ".join(cells) + " |")
  text = "\n".join(lines) + "\n"
  out = pathlib.Path(args.results) / "encodings.md"
  out.write_text(text)
  (pathlib.Path(args.results) / "encodings_summary.json").write_text(json.dumps(summary, indent=1))
  print(text)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--arms", default=",".join(ARMS))
  ap.add_argument("--seeds", default="0")
  ap.add_argument("--steps", type=int, default=240)
  ap.add_argument("--clips", type=int, default=35)
  ap.add_argument("--sample-steps", type=int, default=4)
  ap.add_argument("--runs", default="runs/enc")
  ap.add_argument("--results", default="results/encodings")
  ap.add_argument("--phase", default="all", choices=("all", "report"))
  args = ap.parse_args(argv)
  args.arms = [a for a in args.arms.split(",") if a]
  bad = [a for a in args.arms if a not in ARMS]
  if bad:
    ap.error(f"--arms: {bad} not in {ARMS}")
  try:
    seeds = [int(s) for s in args.seeds.split(",") if s]
  except ValueError:
    ap.error(f"--seeds={args.seeds!r}: must be comma-separated integers")
  if not seeds:
    ap.error(f"--seeds={args.seeds!r}: needs at least one seed")
  if args.steps < 1:
    ap.error(f"--steps={args.steps}: must be >= 1")
  pathlib.Path(args.results).mkdir(parents=True, exist_ok=True)
  if args.phase == "all":
    for s in seeds:
      for arm in args.arms:
        path = pathlib.Path(args.results) / f"{arm}_s{s}.json"
        if path.exists():
          print(f"[run] {arm} seed {s}: done", flush=True)
          continue
        wd = pathlib.Path(args.runs) / f"{arm}_s{s}_{args.steps}"
        _train(args, arm, s, wd)
        _evaluate(args, arm, s, wd, path)
  report(args, seeds)


if __name__ == "__main__":
  main()
