"""Loop-closure benchmark (ViewRope §4, App. C; ReWorld §4.3; LOCI App. B): stream procedural eval
clips from their first frame and trajectory and score what comes back.

  python -m jaxwm.evaluation.loop_closure --checkpoint runs/tiny [--clips 35] [--lpips lpips_alex.npz]
      [--family loops|palindrome|walks] [--split eval|train] [--memory full,window,landmark]
      [--selection topk,random,exclude_selected] [--top-k 1,2,3,5] [--probe] [--figures] [--frames 9] [--steps 4] [--shift 3]
      [--out <path>] [--overwrite]

``loops``: the 35 rotate-away-and-back clips (30/45/75/90/180 degrees about the 7 axis
combinations). Per magnitude and axis: PSNR / SSIM (LPIPS with weights) of all frames against
the ground truth, and the loop-closure error at the return pose (the generated return frame
against the given first frame, ViewRope App. C.5), the in-between frames (``between_*``: strictly
between the first and the return frame), the memory gain ``gain_<t>`` (the return frame's
teacher-forced velocity error without the first view over with it, at noise level ``t``;
:mod:`jaxwm.evaluation.memory_gain`) and two baselines (``mean_*``: the first frame's mean colour;
``copy_*``: the first frame copied; :mod:`jaxwm.evaluation.baselines`). ``remembers``: the share of
clips whose return frame beats ``mean`` and whose in-between frames beat ``copy``. ``return_offset`` (the return
frame's mean colour minus the first frame's, levels of 255) and ``return_psnr_offset_free`` (its PSNR with that
offset removed) tell a global brightness error from layout and detail. ``--probe`` adds the share of the return
frame's history attention on co-visible keys (from ground-truth depth) against its chance level.

``palindrome``: out-and-back free paths; revisit pairs (ReWorld §4.3) are the mirror pairs
``(t, r - t)`` anchored in the first fifth of the clip with a gap of at least half of it. Both
frames are generated (``t = 0`` is the given frame); ``needle_*`` columns keep the pairs whose
needle ``t >= 1`` was generated, with ``needle_resident`` the share of them still in the memory
when the mirror frame was generated.

Comma-separated ``--memory``, ``--selection`` and ``--top-k`` run every combination (selection and
top-k need a frame-sparse model). Writes ``<out>.json`` (per clip, strict JSON), ``<out>.md`` (tables)
and with ``--figures`` ``<out>_*.png`` (metric against magnitude per setting; attention and selection
maps). Without ``--out`` the results go next to the checkpoint, never into the repository:
``<workdir>/loop_closure/<family>_step<k>_<n>`` with the first free ``n``; an existing ``--out`` is
refused unless ``--overwrite``. Every argument is checked before the checkpoint is restored; a
refusal is one line and exit code 2.
"""

import argparse
import collections
import dataclasses
import itertools
import json
import pathlib
import sys

import numpy as np

from jaxwm.settings import Choice, Float, Int
from jaxwm.utils.cli import SEED, CommaList, IsDir, IsFile, Parser, Refusal, refuse, run_dir, write_json, write_text
from jaxwm.utils.cli import run as run_cli

COVIS_COLS = ("covis_psnr", "covis_ssim", "warp_covis_psnr", "copy_covis_psnr", "mean_covis_psnr", "revealed_psnr",
              "mean_revealed_psnr", "revealed_contrast", "covis_fraction", "covis_frames")
LOOP_COLS = ("psnr", "ssim", "lpips", "between_psnr", "return_psnr", "return_ssim", "return_lpips", "return_offset",
             "return_psnr_offset_free", "gain_0.5", "gain_0.8", "gain_1", "remembers", "mean_psnr",
             "mean_return_psnr", "mean_return_ssim", "copy_between_psnr") + COVIS_COLS + ("covis_mass", "covis_chance")
WALK_COLS = ("psnr", "ssim", "lpips", "mean_psnr") + COVIS_COLS
PALINDROME_COLS = ("psnr", "ssim", "lpips", "revisit_psnr", "revisit_ssim", "revisit_lpips", "needle_ssim",
                   "needle_resident")


def mean_ci(xs):
  """``(mean, 95% half-width)`` of a sample (normal approximation)."""
  xs = np.asarray([x for x in xs if x is not None and np.isfinite(x)], float)
  if not xs.size:
    return float("nan"), float("nan")
  return float(xs.mean()), float(1.96 * xs.std(ddof=1) / np.sqrt(xs.size)) if xs.size > 1 else float("nan")


def table(rows, key, cols):
  """Markdown table of ``cols`` (mean ± 95% interval over rows) grouped by ``rows[i][key]``."""
  groups = collections.defaultdict(list)
  for r in rows:
    groups[r[key]].append(r)
  cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
  lines = [f"| {key} | clips | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 2)]
  for g in sorted(groups, key=lambda v: (isinstance(v, str), v)):
    vals = []
    for c in cols:
      m, e = mean_ci(r.get(c) for r in groups[g])
      vals.append("-" if not np.isfinite(m) else f"{m:.3f} ± {e:.3f}" if np.isfinite(e) else f"{m:.3f}")
    lines.append(f"| {g} | {len(groups[g])} | " + " | ".join(vals) + " |")
  return "\n".join(lines)


def pooled_covis(rows):
  """Frame-pooled co-visible scores of evaluated rows: ``{column: mean over every scored frame}`` plus ``frames`` (with
  a co-visible score) and ``of`` (frames scored at all)."""
  frames = [f for r in rows for f in r.get("covis_per_frame", [])]
  out = {"frames": sum(f["covis_psnr"] is not None for f in frames), "of": len(frames)}
  for k in ("covis_psnr", "covis_ssim", "warp_covis_psnr", "copy_covis_psnr", "mean_covis_psnr", "revealed_psnr",
            "mean_revealed_psnr", "revealed_contrast"):
    vals = [f[k] for f in frames if f.get(k) is not None]
    out[k] = float(np.mean(vals)) if vals else None
  scored = [f["covis_fraction"] for f in frames if f["covis_psnr"] is not None]
  out["covis_fraction"] = float(np.mean(scored)) if scored else None  # of the scored frames' pixels
  return out


def covis_headline(rows):
  """One line: the frame-pooled co-visible PSNR of the model and the references, and the revealed pixels'."""
  p = pooled_covis(rows)
  if not p["frames"]:
    return f"no frame has co-visible pixels (0 of {p['of']} frames); no co-visible score"
  f = lambda v: "-" if v is None else f"{v:.2f}"
  return (f"co-visible PSNR {f(p['covis_psnr'])} dB (SSIM {f(p['covis_ssim'])}) over {p['frames']} of {p['of']} "
          f"frames ({100 * p['covis_fraction']:.0f}% of their pixels); references on the same pixels: warp "
          f"{f(p['warp_covis_psnr'])}, copy {f(p['copy_covis_psnr'])}, mean {f(p['mean_covis_psnr'])} dB; newly "
          f"revealed pixels {f(p['revealed_psnr'])} dB (mean colour {f(p['mean_revealed_psnr'])}), their contrast "
          f"{f(p['revealed_contrast'])} of the ground truth's")


def revisit_pairs(return_frame, max_pairs=5):
  """Mirror pairs ``(t, r - t)`` of a palindrome returning at ``r`` (ReWorld §4.3): ``t`` in the first
  fifth of the ``r + 1`` frames, gap ``r - 2t >= (r + 1) / 2``, at most ``max_pairs``."""
  k = return_frame + 1
  return [(t, return_frame - t) for t in range(k) if t < k / 5 and return_frame - 2 * t >= k / 2][:max_pairs]


def evaluate(config, model, variables, *, clips=35, family="loops", memory="full", memory_kwargs=None,
             lpips_params=None, seed=0, steps=None, shift=None, num_frames=None, frame_stride=None, probe=False,
             gain=True, split="eval", noise_scale=None):
  """Streams ``clips`` eval clips of ``family`` (``loops``, ``palindrome`` or ``walks``); returns one dict per clip.

  ``split="train"`` streams the same trajectories in training rooms (what was memorised, not seen).
  ``num_frames`` / ``frame_stride`` default to the training config's; ``steps`` / ``shift`` / ``noise_scale``
  (Euler steps per chunk, schedule shift, scale of the starting noise) to ``config.sample``'s. ``probe`` (loops only) adds
  the co-visible attention statistics of the return frame (:mod:`jaxwm.evaluation.attention_probe`).
  Every row has the model's scores and both baselines' (:mod:`jaxwm.evaluation.baselines`); ``gain``
  (loops) adds the memory gain ``gain_<t>`` (:mod:`jaxwm.evaluation.memory_gain`). Loops and walks add the
  co-visible score (:mod:`jaxwm.evaluation.covisible`: ``covis_*``, ``<reference>_covis_*``, ``revealed_psnr``,
  and ``covis_per_frame``) of the frames in between (walks: every generated frame).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import attention_probe, baselines, covisible, memory_gain  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import lpips as lp  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation.metrics import psnr, ssim  # pylint: disable=g-import-not-at-top
  from jaxwm.training.layout import make_layout  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling import clips as clips_lib  # pylint: disable=g-import-not-at-top

  if family not in clips_lib.EVAL_FAMILIES:
    raise ValueError(f"family must be one of {clips_lib.EVAL_FAMILIES}; got {family!r}")
  d = config.data
  frames_n, stride, chunk = num_frames or d.num_frames, frame_stride or d.frame_stride, config.recipe.chunk_size
  grid = (d.image_size // d.latent_stride // model.cfg.patch_size[1], d.image_size // d.latent_stride //
          model.cfg.patch_size[2])
  # One sampler, shared by all clips.
  sampler = clips_lib.make_sampler(model, variables, config, frames_n, num_steps=steps, shift=shift,
                                   noise_scale=noise_scale)
  # Memory gain (teacher-forced, training layout): once per clip, independent of the memory policy.
  layout = make_layout("teacher_forcing", frames_n, chunk)
  gain_fn = memory_gain.model_apply_fn(model, variables["params"]) if gain else None
  rows = []
  for i in range(clips):
    w = clips_lib.eval_clip(config, i, num_frames=frames_n, frame_stride=stride, family=family, split=split)
    gt, ret, clip = w["frames"], w["return_frame"], w["meta"]["source"]
    cams = {"c2w": jnp.asarray(w["c2w"])[None], "intrinsics": jnp.asarray(w["intrinsics"])[None]}
    policy = make_policy(memory, max_frames=frames_n, chunk_frames=chunk, image_hw=(d.image_size, d.image_size),
                         **(memory_kwargs or {}))
    attended = {0: [0]}  # chunk -> frames resident while it was generated

    def record(c, _, policy=policy, attended=attended):
      attended[c + 1] = list(policy.resident())

    video = clips_lib.stream_clip(model, variables, config, w, key=jax.random.key(seed + i), memory=policy,
                                  callback=record, sampler=sampler)
    row = {"clip": i, "family": family if family != "walks" else str(clip["family"]), "axes": str(clip["axes"]),
           "magnitude": float(clip["magnitude_deg"]),
           "return_frame": ret, **baselines.frame_scores(video, gt, ret if family == "loops" else -1),
           **baselines.baseline_scores(gt, ret if family == "loops" else -1)}
    if family in ("loops", "walks"):  # co-visible score of the frames in between (walks: every generated frame)
      scored = range(1, ret) if family == "loops" else range(1, frames_n)
      summary, per_frame = covisible.clip_scores(video, gt, clip, w["frame_index"], d.render_size // d.image_size,
                                                 scored)
      row.update(summary, covis_per_frame=per_frame)
    if lpips_params is not None:
      row["lpips"] = float(np.mean(lp.lpips(lpips_params, video[1:], gt[1:])))
    if family == "loops" and ret > 0:
      row["remembers"] = baselines.remembers(row)
      row.update(baselines.return_colour(video, gt, ret))
      if lpips_params is not None:
        row["return_lpips"] = float(lp.lpips(lpips_params, video[ret], gt[0]))
      if gain_fn is not None and ret in layout.noisy_frames:
        lat = vae.encode(jnp.asarray(gt)[None], d.latent_stride)
        errs = memory_gain.return_frame_errors(gain_fn, lat, memory_gain.clip_cameras(cams), layout, ret,
                                               jax.random.key(seed + i))
        row.update({f"gain_{t:g}": g for t, g in memory_gain.memory_gain(errs).items()})
    if family == "palindrome" and ret > 0:
      pairs = []
      for t, m in revisit_pairs(ret):
        chunk_of_m = (m - 1) // chunk + 1
        pr = {"t": t, "mirror": m, "psnr": float(psnr(video[m], video[t])), "ssim": float(ssim(video[m], video[t])),
              "resident": t in attended.get(chunk_of_m - 1, [])}
        if lpips_params is not None:
          pr["lpips"] = float(lp.lpips(lpips_params, video[m], video[t]))
        pairs.append(pr)
      row["pairs"] = pairs
      for c in ("psnr", "ssim", "lpips"):
        if all(c in p for p in pairs) and pairs:
          row[f"revisit_{c}"] = float(np.mean([p[c] for p in pairs]))
      needles = [p for p in pairs if p["t"] >= 1]
      if needles:
        row["needle_ssim"] = float(np.mean([p["ssim"] for p in needles]))
        row["needle_resident"] = float(np.mean([p["resident"] for p in needles]))
    if probe and family == "loops" and ret > 0:
      lat = vae.encode(jnp.asarray(gt)[None], d.latent_stride)
      pr = attention_probe.attention_weights(model, variables, lat, cams, ret, chunk, key=jax.random.key(seed + i))
      sl = slice(0, (frames_n - 1) * stride + 1, stride)
      cov = attention_probe.covisible_share(pr, clip["depth"][sl], clip["c2w"][sl], clip["intrinsics"][sl], ret,
                                            grid)
      row.update(covis_mass=cov["mass"], covis_chance=cov["chance"], history_mass=cov["history_mass"],
                 covis_excluded=cov["excluded"], covis_layers=cov["layers"])
      if i == 0:  # kept for the figures
        row["probe_frames"] = {"key_frames": pr["key_frames"].tolist(), "history": pr["history"].tolist(),
                               "layers": pr["layers"],
                               "mass_per_frame": pr["weights"].sum(axis=(1, 3)).tolist(),
                               "selected": None if pr["selected"] is None else pr["selected"].tolist()}
    rows.append(row)
  return rows




def _outputs(out):
  return [out.with_suffix(".json"), out.with_suffix(".md")]


def _check_args(a):
  """The checks across flags (each flag's own ran when parsing), before any checkpoint is read; returns
  ``(memories, memory_kwargs, selections, top_ks)``."""
  memories = a.memory
  if not memories:
    raise refuse("--memory", "", "must name at least one memory policy")
  try:
    memory_kwargs = json.loads(a.memory_kwargs)
  except json.JSONDecodeError as e:
    raise refuse("--memory-kwargs", a.memory_kwargs, f"not JSON ({e})") from None
  if not isinstance(memory_kwargs, dict) or not all(isinstance(v, dict) for v in memory_kwargs.values()):
    raise refuse("--memory-kwargs", a.memory_kwargs,
                 'must be a JSON object of objects, {"<policy>": {"<argument>": value}}')
  bad = [m for m in memory_kwargs if m not in memories]
  if bad:
    raise refuse("--memory-kwargs", a.memory_kwargs,
                 f"{bad[0]!r} is not among --memory={','.join(memories)} (its arguments would be unused)")
  if a.out is not None:
    out = pathlib.Path(a.out)
    existing = [p for p in _outputs(out) if p.exists()]
    if existing and not a.overwrite:
      raise refuse("--out", a.out, f"{existing[0]} exists; pass --overwrite to replace it or choose another --out")
  return memories, memory_kwargs, a.selection or [None], a.top_k or [None]


def figures(out, results, family):
  """``<out>_<metric>.png`` against magnitude (loops), one line per setting; attention/selection maps."""
  from jaxwm.evaluation import plots  # pylint: disable=g-import-not-at-top
  paths = []
  if family == "loops":
    for metric in ("return_psnr", "return_ssim", "return_lpips", "covis_mass"):
      series = {}
      for name, rows in results.items():
        mags = sorted({r["magnitude"] for r in rows})
        stats = [mean_ci(r.get(metric) for r in rows if r["magnitude"] == m) for m in mags]
        if all(np.isfinite(s[0]) for s in stats):
          series[name] = (mags, [s[0] for s in stats], [s[1] for s in stats])
      if series:
        paths.append(plots.line_plot(f"{out}_{metric}.png", series, xlabel="rotation magnitude (deg)",
                                     ylabel=metric, title="loop closure"))
    for name, rows in results.items():
      pf = next((r["probe_frames"] for r in rows if "probe_frames" in r), None)
      if pf is None:
        continue
      mass = np.asarray(pf["mass_per_frame"])  # [L, Fk]
      mass = np.where(np.asarray(pf["history"])[None], mass, np.nan)
      tag = name.replace(" ", "_").replace("=", "")
      layers = pf.get("layers", range(len(mass)))  # model block of each row (LOCI: softmax blocks only)
      paths.append(plots.heat_map(f"{out}_{tag}_attention.png", mass, row_labels=[f"block {l}" for l in layers],
                                  col_labels=pf["key_frames"], title=f"{name}: return-frame attention on history",
                                  xlabel="history (key) frame", ylabel="block", cbar_label="attention mass / row max",
                                  nan_label="not in history"))
      if pf["selected"] is not None:  # frame-sparse: the return frame's selection per layer (ViewRope Fig. 3)
        from jaxwm.evaluation.selection_plot import save_selection_maps  # pylint: disable=g-import-not-at-top
        sel = np.asarray(pf["selected"])[:, None]
        paths.append(save_selection_maps(f"{out}_{tag}_selection.png", sel, len(pf["key_frames"]),
                                         history=np.asarray(pf["history"])[None], key_labels=pf["key_frames"],
                                         title=f"{name}: return-frame selection", cell=12))
  return paths


def main(argv=None):
  """``python -m jaxwm.evaluation.loop_closure ARGV``; returns the exit code (2: a refused argument)."""
  return run_cli(_main, argv, "loop_closure")


def _main(argv):
  from jaxwm.memory import POLICIES, make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.ops.frame_sparse import SELECTION_MODES  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.clips import EVAL_FAMILIES  # pylint: disable=g-import-not-at-top
  p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True, check=IsDir("a training workdir or checkpoint directory"), help="training workdir or checkpoint directory")
  p.add_argument("--clips", type=int, default=35, check=Int(1), help="eval clips, >= 1")
  p.add_argument("--family", default="loops", check=Choice(EVAL_FAMILIES))
  p.add_argument("--split", default="eval", check=Choice(("eval", "train")),
                 help="eval: rooms never trained on; train: the same trajectories in training rooms (diagnosis)")
  p.add_argument("--lpips", check=IsFile(), help="LPIPS weights (.npz from `python -m jaxwm.evaluation.lpips`)")
  p.add_argument("--memory", default="full", check=CommaList(Choice(tuple(POLICIES))), help=f"comma list of {', '.join(POLICIES)}")
  p.add_argument("--memory-kwargs", default="{}",
                 help='JSON per policy, e.g. \'{"window": {"window": 4}, "landmark": {"recent": 1}}\'')
  p.add_argument("--selection", check=CommaList(Choice(SELECTION_MODES)), help=f"comma list of {', '.join(SELECTION_MODES)} (frame-sparse models)")
  p.add_argument("--top-k", check=CommaList(Int(1), int), help="comma list of ints (frame-sparse models)")
  p.add_argument("--probe", action="store_true", help="co-visible attention share (loops)")
  p.add_argument("--figures", action="store_true")
  p.add_argument("--frames", type=int, check=Int(2, allowed="must be 1 + k * chunk_size with k >= 1"), help="latent frames per clip (default: the training config's)")
  p.add_argument("--steps", type=int, check=Int(1), help="Euler steps per chunk, >= 1 (default: the checkpoint's, or the adapter's)")
  p.add_argument("--shift", type=float, check=Float(gt=0), help="sampling schedule's timestep shift, > 0 (default: the checkpoint's "
                                              "config.sample.shift, or the adapter's)")
  p.add_argument("--noise-scale", type=float, check=Float(gt=0), help="scale of each chunk's starting noise, > 0 "
                 "(default: the checkpoint's config.sample.noise_scale, 1, or the adapter's)")
  p.add_argument("--adapter", check=IsDir("a distillation workdir or its adapter/"), help="a distilled LoRA adapter (distillation workdir or its adapter/), merged into the "
                                   "model; its few-step settings become the defaults")
  p.add_argument("--seed", type=int, default=0, check=SEED)
  p.add_argument("--out", default=None, help="output prefix (default: <workdir>/loop_closure/<family>_step<k>_<n>)")
  p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  a = p.parse_args(argv)
  memories, memory_kwargs, selections, top_ks = _check_args(a)
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  try:
    config, model, variables, step = load_model(a.checkpoint)
  except (FileNotFoundError, ValueError) as e:
    raise Refusal(e) from None
  lora_tag = ""
  if a.adapter is not None:  # merged once; config.sample takes the adapter's steps and shift
    from jaxwm.distill.student import adapter_flag  # pylint: disable=g-import-not-at-top
    variables, lora_tag = adapter_flag(config, variables, a.adapter, "loop_closure")
  if (a.selection or a.top_k) and not model.cfg.attention.sparse:
    raise Refusal("--selection/--top-k need a frame-sparse model (model.attention.sparsity != dense)")
  chunk, d = config.recipe.chunk_size, config.data
  frames_n = a.frames or d.num_frames
  if frames_n < 1 + chunk or (frames_n - 1) % chunk:
    raise refuse("--frames", frames_n, f"must be 1 + k * {chunk} (the checkpoint's recipe.chunk_size) with k >= 1")
  for mem in memories:
    try:
      make_policy(mem, max_frames=frames_n, chunk_frames=chunk, image_hw=(d.image_size, d.image_size),
                  **memory_kwargs.get(mem, {}))
    except (TypeError, ValueError) as e:
      raise refuse("--memory-kwargs", a.memory_kwargs, f"for {mem!r}: {e}") from None
  if a.out is None:
    base = run_dir(a.checkpoint) / "loop_closure" / f"{a.family}_step{step}{lora_tag}"
    n = 0
    while any(q.exists() for q in _outputs(pathlib.Path(f"{base}_{n}"))):
      n += 1
    out = pathlib.Path(f"{base}_{n}")
    print(f"loop_closure: writing to {out}.json/.md (default --out: next to the checkpoint)")
  else:
    out = pathlib.Path(a.out)
  lpips_params = None
  if a.lpips:
    from jaxwm.evaluation.lpips import load_params  # pylint: disable=g-import-not-at-top
    try:
      lpips_params = load_params(a.lpips)
    except (OSError, ValueError, KeyError) as e:
      raise refuse("--lpips", a.lpips, f"not LPIPS weights ({e})") from None
  else:
    print("LPIPS skipped: convert the public weights with `python -m jaxwm.evaluation.lpips --alexnet "
          "alexnet-owt-7be5be79.pth --lin alex.pth --out lpips_alex.npz` and pass --lpips lpips_alex.npz")
  results = {}
  for mem, sel, k in itertools.product(memories, selections, top_ks):
    m = model
    att = model.cfg.attention
    if att.sparse:
      att = dataclasses.replace(att, selection=sel or att.selection, top_k=k or att.top_k)
      m = WanModel(dataclasses.replace(model.cfg, attention=att))
    name = f"memory={mem}" + (f" selection={att.selection} top_k={att.top_k}" if att.sparse else "")
    print(f"evaluating {name} ...", flush=True)
    rows = evaluate(config, m, variables, clips=a.clips, family=a.family, memory=mem,
                    memory_kwargs=memory_kwargs.get(mem), lpips_params=lpips_params, seed=a.seed, steps=a.steps,
                    shift=a.shift, num_frames=a.frames, probe=a.probe, split=a.split, noise_scale=a.noise_scale)
    for r in rows:
      r["setting"] = name
    results[name] = rows
  cols = {"loops": LOOP_COLS, "walks": WALK_COLS}.get(a.family, PALINDROME_COLS)
  all_rows = [r for rows in results.values() for r in rows]
  from jaxwm.sampling.settings import sample_of  # pylint: disable=g-import-not-at-top
  sampling = {"num_steps": int(a.steps or config.sample.num_steps),
              "shift": float(config.sample.shift if a.shift is None else a.shift),
              "noise_scale": float(sample_of(config.sample).noise_scale if a.noise_scale is None else a.noise_scale)}
  md = [f"# Loop closure ({a.family}{', training rooms' if a.split == 'train' else ''}): {a.checkpoint} (step {step})"
        + (f" + adapter {a.adapter}" if a.adapter else ""), "",
        f"Sampling: {sampling['num_steps']} Euler steps per chunk, schedule shift {sampling['shift']:g}"
        + (f", noise scale {sampling['noise_scale']:g}" if sampling["noise_scale"] != 1 else "") + ".", "",
        "Mean ± 95% interval over clips." + (" covis_mass: share of the return frame's history attention on "
                                             "co-visible keys; covis_chance: that share under uniform attention."
                                             if a.probe else ""), "", table(all_rows, "setting", cols)]
  for name, rows in results.items():
    if a.family in ("loops", "walks"):
      md += ["", f"{name}: " + covis_headline(rows)]
  for name, rows in results.items():
    md += ["", f"## {name}", "", table(rows, "magnitude" if a.family == "loops" else "family", cols)]
    if a.family == "loops":
      md += ["", table(rows, "axes", cols)]
  out.parent.mkdir(parents=True, exist_ok=True)
  if a.figures:
    for path in figures(str(out), results, a.family):
      md += ["", f"![{pathlib.Path(path).stem}]({pathlib.Path(path).name})"]
  md = "\n".join(md) + "\n"
  write_json(out.with_suffix(".json"), {"step": int(step), "family": a.family, "split": a.split, "adapter": a.adapter,
                                        "sampling": sampling, "settings": results})
  write_text(out.with_suffix(".md"), md)
  print(md)
  print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
