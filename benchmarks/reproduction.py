"""The small reproduction of the papers' comparisons (issue 8): train every arm of configs/repro.py,
evaluate all of them on the same eval clips, write RESULTS.md.

  python benchmarks/reproduction.py                        # everything (hours on a 2-core CPU)
  python benchmarks/reproduction.py --steps 600 --seeds 0,1 --phase train
  python benchmarks/reproduction.py --steps 600 --seeds 0,1 --phase eval   # then report
  python benchmarks/reproduction.py --scale w384 --arms viewrope,gta,rope3d --seeds 0 --steps 3000 \
      --no-stages --sample-steps 4                           # Q1 on the width-384 recipe (its own section)

``all`` trains and evaluates one run after another (a run whose JSON is in ``results/repro/`` is skipped,
so a later session continues where an earlier one stopped; ``runs/`` is scratch). Phases:
``train`` (one `train.py` process per arm and seed, resumable, skipped when done),
``eval`` (loop-closure benchmark of every run, counterfactual selections and top-k sweeps for
``frame_topk``, bounded memories on palindromes for ``viewrope``; JSON per run under
``results/repro/``), ``report`` (RESULTS.md: tables with 95% bootstrap intervals over seeds and
clips, paired differences for the three questions, figures; the "Reading" section of RESULTS.md
is written by hand after a run).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAIN_ARMS = ("rope3d", "gta", "viewrope", "sliding_window", "frame_topk", "loci", "viewrope_df")
STAGES = ("stage1", "stage2", "stage3", "stage4")
LANDMARK = {"recent": 1, "retrieved": 1, "stride": 0.5}
CKPT_EVERY = 1000  # an interrupted arm resumes from its last checkpoint
EVICTED = ("window", {"sink": 0, "window": 2})  # the first view evicted: the memory-less arm of the GIFs
SCALE_TEXT = {  # what the report says each scale's arms share
    "tiny": ("The small reproduction", "The default job's model (`configs/tiny.py`: 4 blocks, width 192, 32x32 "
             "frames, 9 latent frames, chunks of 2, EMA, a quarter palindromic windows)"),
    "w384": ("The reproduction on the width-384 recipe", "The CPU recipe's model (`configs/recipe_cpu.py`: 4 "
             "blocks, width 384, 32x32 frames, 9 latent frames, chunks of 2, 1024 training clips, a quarter "
             "palindromic windows, lr 2e-3 cosine to 0, EMA)")}
MEMORIES = {"full": ("full", {}), "window": ("window", {"window": 4}), "landmark": ("landmark", LANDMARK),
            "landmark_next": ("landmark", dict(LANDMARK, retrieve_by="next"))}


def _markers(scale):
  """The RESULTS.md comments around the report of ``scale``."""
  tag = "reproduction" if scale == "tiny" else f"reproduction_{scale}"
  return f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"


def run_dir(runs, arm, seed):
  return pathlib.Path(runs) / f"{arm}_s{seed}"


def _latest_step(workdir):
  ck = pathlib.Path(workdir) / "checkpoints"
  steps = [int(p.name) for p in ck.iterdir() if p.is_dir() and p.name.isdigit()] if ck.is_dir() else []
  return max(steps) if steps else None


def _jobs(args, seeds):
  """Every arm on the first seed, ``--seed-arms`` on all seeds."""
  return [(arm, s) for s in seeds for arm in args.arms if s == seeds[0] or arm in args.seed_arms]


def _ordered_jobs(args, seeds):
  """The first seed's arms, then the progressive stages, then the other seeds."""
  jobs = _jobs(args, seeds)
  n_first = sum(1 for _, s in jobs if s == seeds[0])
  return jobs[:n_first] + ([(st, seeds[0]) for st in STAGES] if args.stages else []) + jobs[n_first:]


def _evaluated(arm):
  return not arm.startswith("stage") or arm == STAGES[-1]


def _result_path(args, arm, seed):
  return pathlib.Path(args.results) / f"{arm}_s{seed}.json"


def _train_one(args, arm, seed):
  wd = run_dir(args.runs, arm, seed)
  stage = arm.startswith("stage")
  steps = max(1, int(args.steps * 0.25)) if stage else args.steps
  if (_latest_step(wd) or 0) >= steps:
    print(f"[train] {arm} seed {seed}: done ({wd})", flush=True)
    return
  scale = "" if args.scale == "tiny" else f",{args.scale}"
  cmd = [sys.executable, "train.py", f"--config=configs/repro.py:{arm}{scale}", f"--config.seed={seed}",
         f"--config.train.num_steps={steps}", f"--config.train.ckpt_every={min(steps, CKPT_EVERY)}",
         f"--workdir={wd}"]
  if stage and arm != "stage1":
    cmd.append(f"--config.train.init_from={run_dir(args.runs, f'stage{int(arm[-1]) - 1}', seed)}")
  run_logged(cmd, wd, f"{arm} seed {seed}")


def run_logged(cmd, wd, label):
  """Runs the `train.py` command ``cmd`` for workdir ``wd``, its output appended to ``<wd>.log``; prints the time."""
  print(f"[train] {' '.join(cmd[1:])}", flush=True)
  t0 = time.time()
  wd.parent.mkdir(parents=True, exist_ok=True)
  with open(wd.parent / f"{wd.name}.log", "a") as log:
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
  print(f"[train] {label}: {time.time() - t0:.0f} s", flush=True)


def train(args, seeds):
  for arm, seed in _ordered_jobs(args, seeds):
    _train_one(args, arm, seed)


def train_and_evaluate(args, seeds):
  """Each run trained, then evaluated at once: its JSON under ``results/`` is what outlives the session
  (``runs/`` is scratch), and a run whose JSON exists is skipped, training included."""
  jobs = _ordered_jobs(args, seeds)
  for i, (arm, seed) in enumerate(jobs):
    # A stage is done when the last stage's result exists.
    final = STAGES[-1] if arm.startswith("stage") else arm
    if _result_path(args, final, seed).exists():
      print(f"[run {i + 1}/{len(jobs)}] {arm} seed {seed}: done", flush=True)
      continue
    print(f"[run {i + 1}/{len(jobs)}] {arm} seed {seed}", flush=True)
    _train_one(args, arm, seed)
    if _evaluated(arm):
      _eval_one(args, arm, seed)


def evaluate(args, seeds):
  jobs = _jobs(args, seeds) + ([(STAGES[-1], seeds[0])] if args.stages else [])
  for arm, seed in jobs:
    _eval_one(args, arm, seed)


def _eval_one(args, arm, seed):
  from jaxwm.evaluation import loop_closure as lc  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  path = _result_path(args, arm, seed)
  path.parent.mkdir(parents=True, exist_ok=True)
  if path.exists():
    print(f"[eval] {arm} seed {seed}: done ({path})", flush=True)
    return
  if _latest_step(run_dir(args.runs, arm, seed)) is None:
    print(f"[eval] {arm} seed {seed}: not trained yet, skipped", flush=True)
    return
  t0 = time.time()
  config, model, variables, step = load_model(run_dir(args.runs, arm, seed))
  common = dict(seed=0, steps=args.sample_steps, num_frames=9, frame_stride=2)
  settings = {"loops": lc.evaluate(config, model, variables, clips=args.clips, probe=True, **common)}
  if arm == "frame_topk":
    att = model.cfg.attention
    for sel, k in [("random", att.top_k), ("exclude_selected", att.top_k)] + [("topk", k) for k in args.top_k]:
      if sel == "topk" and k == att.top_k:
        continue
      m = WanModel(dataclasses.replace(model.cfg, attention=dataclasses.replace(att, selection=sel, top_k=k)))
      settings[f"loops {sel} top_k={k}"] = lc.evaluate(config, m, variables, clips=args.clips, **common)
  if arm == "viewrope":
    settings["loops evicted"] = lc.evaluate(config, model, variables, clips=args.clips, memory=EVICTED[0],
                                            memory_kwargs=EVICTED[1], gain=False, **common)
    for name, (mem, kw) in MEMORIES.items():
      settings[f"palindrome {name}"] = lc.evaluate(config, model, variables, clips=args.palindromes,
                                                   family="palindrome", memory=mem, memory_kwargs=kw, **common)
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps({"arm": arm, "seed": seed, "step": int(step), "settings": settings}))
  os.replace(tmp, path)
  print(f"[eval] {arm} seed {seed}: {time.time() - t0:.0f} s", flush=True)


def _softmax_blocks(arm):
  """The blocks of ``arm`` with a history softmax (the rows of its attention probe)."""
  from configs import repro  # pylint: disable=g-import-not-at-top
  m = repro.get_config(arm).model
  return [i for i in range(m.num_layers) if not (m.loci.enabled and i in m.loci.blocks)]


def _bootstrap(values, n=2000, rng=None):
  """Mean and 95% percentile interval of ``values [seeds, clips]`` resampling seeds, then clips."""
  v = np.asarray(values, float)
  if not np.isfinite(v).any():  # a metric this run did not record
    return (np.nan, np.nan, np.nan)
  rng = rng or np.random.default_rng(0)
  s, c = v.shape
  means = np.empty(n)
  for b in range(n):
    rows = v[rng.integers(s, size=s)]
    means[b] = np.nanmean(rows[:, rng.integers(c, size=c)])
  return float(np.nanmean(v)), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _fmt(stat):
  m, lo, hi = stat
  return "-" if not np.isfinite(m) else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def _matrix(results, arm, setting, metric, seeds):
  rows = [results[(arm, s)]["settings"][setting] for s in seeds if (arm, s) in results]
  return [[r.get(metric, np.nan) if r.get(metric) is not None else np.nan for r in rs] for rs in rows]


def report(args, seeds):
  from jaxwm.evaluation import loop_closure as lc  # pylint: disable=g-import-not-at-top
  res_dir = pathlib.Path(args.results)
  results = {}
  for p in sorted(res_dir.glob("*.json")):
    d = json.loads(p.read_text())
    for row in d["settings"]["loops"]:
      if "probe_frames" in row and "layers" not in row["probe_frames"]:  # runs evaluated before it was recorded
        row["probe_frames"]["layers"] = _softmax_blocks(d["arm"])
    results[(d["arm"], d["seed"])] = d
  wanted = [(a, s) for a, s in _ordered_jobs(args, seeds) if _evaluated(a)]
  missing = [f"{a} s{s}" for a, s in wanted if (a, s) not in results]
  seeds = [s for s in seeds if any((a, s) in results for a in MAIN_ARMS)]
  title, model = SCALE_TEXT[args.scale]
  flags = "" if args.scale == "tiny" else f" --scale {args.scale} --arms {','.join(args.arms)}"
  lines = [f"# {title}", "",
           "Produced by `benchmarks/reproduction.py` (see its docstring; it rewrites only this section of "
           f"RESULTS.md); every number below comes from the run recorded here. {model} on the procedural scenes; "
           "every arm has the same channels, data, steps and seeds.",
           "",
           f"- Command: `python benchmarks/reproduction.py{flags} --steps {args.steps} --seeds "
           f"{','.join(map(str, seeds))} --seed-arms {','.join(a for a in args.seed_arms if a in args.arms)}"
           f"{'' if args.stages else ' --no-stages'} --clips {args.clips} --palindromes {args.palindromes} "
           f"--sample-steps {args.sample_steps} --top-k {','.join(map(str, args.top_k))}`",
           f"- Seeds: {seeds} (training seed = `config.seed`; sampling noise seeded per clip, identical across arms)",
           f"- Eval: {args.clips} rotate-away-and-back loops (eval split, 5 magnitudes x 7 axis combinations), "
           f"{args.palindromes} palindromes; {args.sample_steps} Euler steps per chunk.",
           "- Intervals: 95% bootstrap over seeds, then clips (2000 resamples); paired differences resample the "
           "same (seed, clip) cells for both arms." + (
               " With one seed they cover the clips only, not the spread between training seeds."
               if len(seeds) == 1 else ""),
           f"- Runs: {len(wanted) - len(missing)} of {len(wanted)} evaluated" + (
               f"; **partial**, not yet run: {', '.join(missing)} (the command above continues where it stopped; "
               "every interval below covers only the runs present)" if missing else ""), ""]
  metrics = ("return_psnr", "return_ssim", "between_psnr", "psnr", "gain_1", "remembers", "covis_mass",
             "covis_chance")
  lines += ["## All arms on the loops (full memory, training selection)", "",
            "`between_psnr`: the frames strictly between the first and the return frame; `gain_1`: memory gain at "
            "t = 1; `remembers`: share of clips whose return frame beats `mean` and whose in-between frames beat "
            "`copy`. The baselines need no model (same clips for every arm).", "",
            "| arm | " + " | ".join(metrics) + " |", "|" + " --- |" * (len(metrics) + 1)]
  arms = [a for a in MAIN_ARMS + ("stage4",) if any((a, s) in results for s in seeds)]
  for arm in arms:
    arm_seeds = [s for s in seeds if (arm, s) in results]
    lines.append(f"| {arm} | " + " | ".join(_fmt(_bootstrap(_matrix(results, arm, "loops", m, arm_seeds)))
                                            for m in metrics) + " |")
  vs = [s for s in seeds if ("viewrope", s) in results]
  if vs and "loops evicted" in results[("viewrope", vs[0])]["settings"]:
    lines.append("| viewrope, first view evicted (last 2 frames) | " + " | ".join(
        _fmt(_bootstrap(_matrix(results, "viewrope", "loops evicted", m, vs))) for m in metrics) + " |")
  if arms:
    first = [s for s in seeds if (arms[0], s) in results]
    base = {"return_psnr": "mean_return_psnr", "return_ssim": "mean_return_ssim", "psnr": "mean_psnr"}
    lines.append("| baseline `mean` | " + " | ".join(
        _fmt(_bootstrap(_matrix(results, arms[0], "loops", base[m], first))) if m in base else "-"
        for m in metrics) + " |")
    lines.append("| baseline `copy` | (exact) | (exact) | " + _fmt(_bootstrap(
        _matrix(results, arms[0], "loops", "copy_between_psnr", first))) + " |" + " - |" * (len(metrics) - 3))

  def paired(a, b, setting_a, setting_b, metric):
    common = [s for s in seeds if (a, s) in results and (b, s) in results]
    if not common:
      return (np.nan, np.nan, np.nan)
    x = np.asarray(_matrix(results, a, setting_a, metric, common))
    y = np.asarray(_matrix(results, b, setting_b, metric, common))
    return _bootstrap(x - y)

  lines += ["", "## Q1: does ViewRope lower the loop-closure error against rope3d and gta?", "",
            "Loop-closure error = the generated return frame against the given first frame; higher PSNR/SSIM is a "
            "lower error. Paired differences (ViewRope minus the other); an interval above 0 favours ViewRope.", "",
            "| comparison | return_psnr diff | return_ssim diff |", "| --- | --- | --- |"]
  for other in ("rope3d", "gta"):
    lines.append(f"| viewrope - {other} | {_fmt(paired('viewrope', other, 'loops', 'loops', 'return_psnr'))} | "
                 f"{_fmt(paired('viewrope', other, 'loops', 'loops', 'return_ssim'))} |")
  lines += ["", "Per magnitude (return_ssim, mean over seeds and the 7 axis combinations):", "",
            "| arm | " + " | ".join(f"{m:g} deg" for m in (30, 45, 75, 90, 180)) + " |", "|" + " --- |" * 6]
  for arm in arms:
    arm_seeds = [s for s in seeds if (arm, s) in results]
    rows = [r for s in arm_seeds for r in results[(arm, s)]["settings"]["loops"]]
    stats = [lc.mean_ci(r.get("return_ssim") for r in rows if r["magnitude"] == mag) for mag in (30, 45, 75, 90, 180)]
    lines.append(f"| {arm} | " + " | ".join(f"{m:.3f}" for m, _ in stats) + " |")
  figs = lc.figures(str(args.results), {
      arm: [r for s in seeds if (arm, s) in results for r in results[(arm, s)]["settings"]["loops"]] for arm in arms},
                    "loops")
  lines += ["", "Figures (all seeds and clips; attention maps: layers down, key frames of the teacher-forced probe "
            "across, history only, first clip of the first seed; selection maps: red = selected):", ""]
  lines += [f"![{pathlib.Path(f).stem}]({pathlib.Path(f).relative_to(ROOT)})" for f in figs]

  rows = []
  for a, b in (("frame_topk", "sliding_window"), ("frame_topk", "viewrope"), ("sliding_window", "viewrope"),
               ("loci", "viewrope"), ("loci", "viewrope_df"), ("viewrope_df", "viewrope"), ("stage4", "frame_topk")):
    if any((a, s) in results for s in seeds) and any((b, s) in results for s in seeds):
      rows.append(f"| {a} - {b} | " + " | ".join(_fmt(paired(a, b, "loops", "loops", m))
                                                 for m in ("return_psnr", "return_ssim", "psnr")) + " |")
  if rows:  # sections whose arms did not run are left out
    lines += ["", "## Sparsity, recurrent memory and the progressive recipe", "",
              "Paired differences (first arm minus second) on the loops; an interval above 0 favours the first arm. "
              "`sliding_window` and `frame_topk` attend 3 history frames; `viewrope` is the dense arm; `loci - "
              "viewrope_df` isolates the recurrent memory (same diffusion-forcing layout), `viewrope_df - viewrope` "
              "the layout.", "",
              "| comparison | return_psnr diff | return_ssim diff | psnr diff (all frames) |",
              "| --- | --- | --- | --- |"] + rows

  fs = [s for s in seeds if ("frame_topk", s) in results]
  if fs:
    lines += ["", "## Q2: does excluding the selected frames hurt more than random selection? (frame_topk arm)", "",
              "Same model, selection changed at inference only. Paired differences against the trained top-k "
              "selection (negative = worse than top-k).", "",
              "| setting | return_psnr | return_ssim | diff return_ssim vs topk |", "| --- | --- | --- | --- |"]
    for setting in results[("frame_topk", fs[0])]["settings"]:
      if not setting.startswith("loops"):
        continue
      label = "topk (as trained)" if setting == "loops" else setting[len("loops "):]
      lines.append(f"| {label} | {_fmt(_bootstrap(_matrix(results, 'frame_topk', setting, 'return_psnr', fs)))} | "
                   f"{_fmt(_bootstrap(_matrix(results, 'frame_topk', setting, 'return_ssim', fs)))} | "
                   f"{_fmt(paired('frame_topk', 'frame_topk', setting, 'loops', 'return_ssim'))} |")
    ex = [k for k in results[("frame_topk", fs[0])]["settings"] if "exclude_selected" in k]
    rnd = [k for k in results[("frame_topk", fs[0])]["settings"] if "random" in k]
    if ex and rnd:
      lines += ["", f"exclude_selected minus random (return_ssim): "
                    f"{_fmt(paired('frame_topk', 'frame_topk', ex[0], rnd[0], 'return_ssim'))}; "
                    f"(return_psnr): {_fmt(paired('frame_topk', 'frame_topk', ex[0], rnd[0], 'return_psnr'))}"]

  lines += ["", "## Q3: does the bounded memory keep the return view when the window has evicted it? (viewrope arm)",
            "", "Palindromes, revisit pairs (t, 8 - t) for t in {0, 1} (ReWorld §4.3). Budgets: window = sink + "
            f"{MEMORIES['window'][1]['window']} latest frames; landmark = sink chunk + {LANDMARK['recent']} recent "
            f"chunk + {LANDMARK['retrieved']} retrieved landmark chunk (5 frames when the return chunk is "
            "generated, like the window), retrieved nearest the last generated chunk (ReWorld) or, "
            "`landmark_next`, nearest the chunk about to be generated; full = everything. `needle_resident`: "
            "share of needles t = 1 still in memory when their mirror was generated.",
            "", "| memory | revisit_ssim | needle_ssim (t = 1) | needle_resident | psnr (all frames) |",
            "| --- | --- | --- | --- | --- |"]
  vs = [s for s in seeds if ("viewrope", s) in results]
  for mem in MEMORIES:
    st = f"palindrome {mem}"
    if vs and st in results[("viewrope", vs[0])]["settings"]:
      lines.append(f"| {mem} | " + " | ".join(_fmt(_bootstrap(_matrix(results, "viewrope", st, m, vs)))
                                             for m in ("revisit_ssim", "needle_ssim", "needle_resident", "psnr"))
                   + " |")
  if vs:
    lines += ["", "Paired differences of needle_ssim against the window: " + "; ".join(
        f"{mem} - window "
        f"{_fmt(paired('viewrope', 'viewrope', f'palindrome {mem}', 'palindrome window', 'needle_ssim'))}"
        for mem in MEMORIES if mem != "window")]
  _write_section(ROOT / "RESULTS.md", "\n".join(lines), *_markers(args.scale))
  print("\n".join(lines))


def _write_section(path, text, begin, end):
  """Replaces the text between ``begin`` and ``end`` in ``path`` (appends the section when it has none)."""
  old = path.read_text() if path.exists() else ""
  block = f"{begin}\n{text}\n{end}"
  if begin in old and end in old:
    new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
  else:
    new = old.rstrip("\n") + ("\n\n" if old else "") + block + "\n"
  path.write_text(new)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--phase", default="all", choices=["all", "train", "eval", "report"])
  p.add_argument("--steps", type=int, default=4000, help="training steps per arm (each stage gets a quarter)")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--scale", default="tiny", choices=SCALE_TEXT, help="the model every arm changes (configs/repro.py)")
  p.add_argument("--arms", default=",".join(MAIN_ARMS), help="the arms to run (progressive stages: --no-stages)")
  p.add_argument("--seed-arms", default=",".join(MAIN_ARMS), help="arms trained on every seed (others: the first)")
  p.add_argument("--no-stages", dest="stages", action="store_false", help="skip the progressive stages I-IV")
  p.add_argument("--clips", type=int, default=35)
  p.add_argument("--palindromes", type=int, default=20)
  p.add_argument("--sample-steps", type=int, default=10)
  p.add_argument("--top-k", default="1,2,5", help="inference top_k sweep for frame_topk")
  p.add_argument("--runs", default=None, help="scratch (default runs/repro, runs/repro_w384 at scale w384)")
  p.add_argument("--results", default=None, help="JSON per run (default results/repro, results/repro_w384)")
  args = p.parse_args(argv)
  args.top_k = [int(k) for k in args.top_k.split(",")]
  args.seed_arms = args.seed_arms.split(",")
  args.arms = args.arms.split(",")
  bad = [a for a in args.arms + args.seed_arms if a not in MAIN_ARMS]
  if bad:
    p.error(f"--arms/--seed-arms: {bad[0]!r} is not one of {MAIN_ARMS}")
  if args.scale != "tiny" and args.stages:
    p.error(f"--scale {args.scale}: the progressive stages exist at scale 'tiny' only; add --no-stages")
  suffix = "" if args.scale == "tiny" else f"_{args.scale}"
  args.runs = args.runs or str(ROOT / "runs" / f"repro{suffix}")
  args.results = args.results or str(ROOT / "results" / f"repro{suffix}")
  seeds = [int(s) for s in args.seeds.split(",")]
  os.chdir(ROOT)
  if args.phase == "all":
    train_and_evaluate(args, seeds)
  if args.phase == "train":
    train(args, seeds)
  if args.phase == "eval":
    evaluate(args, seeds)
  if args.phase in ("all", "report"):
    report(args, seeds)
  return 0


if __name__ == "__main__":
  sys.exit(main())
