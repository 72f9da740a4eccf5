"""Loop-closure benchmark (ViewRope §4, App. C): stream the procedural eval loops and score the
return view.

  python -m jaxwm.evaluation.loop_closure --checkpoint runs/tiny [--clips 35] [--lpips lpips_alex.npz]
      [--memory window] [--selection exclude_selected --top-k 2] [--out results/loop_closure]

Every clip of the eval split (rotate away and back by 30/45/75/90/180 degrees about the 7 axis
combinations) is streamed from its first frame and trajectory. Reported per magnitude and per
axis: PSNR / SSIM (and LPIPS with weights) of all frames against the ground truth, and the
loop-closure error at the return pose (the generated return frame against the given first
frame). Frame-sparse models can be run with counterfactual selections (``--selection``,
``--top-k``). Writes ``<out>.json`` (per clip) and ``<out>.md`` (tables).
"""

import argparse
import collections
import dataclasses
import json
import pathlib
import sys

import numpy as np


def _table(rows, key, cols):
  groups = collections.defaultdict(list)
  for r in rows:
    groups[r[key]].append(r)
  lines = [f"| {key} | clips | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 2)]
  for g in sorted(groups, key=str):
    vals = []
    for c in cols:
      xs = [r[c] for r in groups[g] if r.get(c) is not None]
      vals.append(f"{np.mean(xs):.3f} ± {1.96 * np.std(xs) / max(len(xs), 1) ** 0.5:.3f}" if xs else "-")
    lines.append(f"| {g} | {len(groups[g])} | " + " | ".join(vals) + " |")
  return "\n".join(lines)


def evaluate(config, model, variables, *, clips=35, memory="full", lpips_params=None, seed=0, steps=None):
  """Streams the eval loops; returns one dict of metrics per clip."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.data.procedural import ProceduralClips  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import lpips as lp  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation.metrics import psnr, ssim  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling import StreamingSampler  # pylint: disable=g-import-not-at-top
  from jaxwm.training.data import ClipWindow  # pylint: disable=g-import-not-at-top

  d = config.data
  frames_n, chunk = d.num_frames, config.recipe.chunk_size
  src = ProceduralClips("eval", num_clips=clips, num_frames=(frames_n - 1) * d.frame_stride + 1,
                        image_hw=(d.render_size, d.render_size), family="loops")
  sampler = None
  rows = []
  for i in range(clips):
    clip = src[i]
    w = ClipWindow(frames_n, d.frame_stride, d.image_size).random_map(clip, np.random.default_rng(0))
    gt = w["frames"]
    lat0 = vae.encode(jnp.asarray(gt[:1])[None], d.latent_stride)
    if sampler is None:
      sampler = StreamingSampler(model, variables, batch_size=1, max_frames=frames_n, latent_hw=lat0.shape[2:4],
                                 channels=lat0.shape[-1], num_steps=steps or config.sample.num_steps,
                                 shift=config.sample.shift)
    cams = {"c2w": jnp.asarray(w["c2w"])[None], "intrinsics": jnp.asarray(w["intrinsics"])[None]}
    policy = make_policy(memory, max_frames=frames_n, chunk_frames=chunk, image_hw=(d.image_size, d.image_size))
    out = sampler.rollout(lat0, frames_n, chunk, jax.random.key(seed + i), cams, memory=policy)
    video = np.asarray(vae.to_uint8(vae.decode(out[0], d.latent_stride)))
    r = int(clip["return_frame"])
    ret = r // d.frame_stride if r >= 0 and r % d.frame_stride == 0 else -1
    row = {"clip": i, "axes": str(clip["axes"]), "magnitude": float(clip["magnitude_deg"]), "return_frame": ret,
           "psnr": float(np.mean(psnr(video[1:], gt[1:]))), "ssim": float(np.mean(ssim(video[1:], gt[1:])))}
    if ret > 0:
      row["return_psnr"] = float(psnr(video[ret], gt[0]))
      row["return_ssim"] = float(ssim(video[ret], gt[0]))
    if lpips_params is not None:
      row["lpips"] = float(np.mean(lp.lpips(lpips_params, video[1:], gt[1:])))
      if ret > 0:
        row["return_lpips"] = float(lp.lpips(lpips_params, video[ret], gt[0]))
    rows.append(row)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True, help="training workdir or checkpoint directory")
  p.add_argument("--clips", type=int, default=35)
  p.add_argument("--lpips", help="LPIPS weights (.npz from `python -m jaxwm.evaluation.lpips`)")
  p.add_argument("--memory", default="full", choices=["full", "window", "landmark", "panorama"])
  p.add_argument("--selection", choices=["topk", "random", "exclude_selected"], help="frame-sparse models only")
  p.add_argument("--top-k", type=int)
  p.add_argument("--steps", type=int)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="results/loop_closure")
  a = p.parse_args(argv)
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  config, model, variables, step = load_model(a.checkpoint)
  if a.selection or a.top_k:
    att = model.cfg.attention
    if not att.sparse:
      p.error("--selection/--top-k need a frame-sparse model (model.attention.sparsity != dense)")
    att = dataclasses.replace(att, selection=a.selection or att.selection, top_k=a.top_k or att.top_k)
    model = WanModel(dataclasses.replace(model.cfg, attention=att))
  lpips_params = None
  if a.lpips:
    from jaxwm.evaluation.lpips import load_params  # pylint: disable=g-import-not-at-top
    lpips_params = load_params(a.lpips)
  else:
    print("LPIPS skipped: convert the public weights with `python -m jaxwm.evaluation.lpips --alexnet "
          "alexnet-owt-7be5be79.pth --lin alex.pth --out lpips_alex.npz` and pass --lpips lpips_alex.npz")
  rows = evaluate(config, model, variables, clips=a.clips, memory=a.memory, lpips_params=lpips_params, seed=a.seed,
                  steps=a.steps)
  cols = [c for c in ("psnr", "ssim", "lpips", "return_psnr", "return_ssim", "return_lpips") if c in rows[0]]
  md = (f"# Loop closure: {a.checkpoint} (step {step}), memory {a.memory}"
        + (f", selection {model.cfg.attention.selection} top_k {model.cfg.attention.top_k}"
           if model.cfg.attention.sparse else "") + "\n\nMean ± 95% interval over clips.\n\n"
        + _table(rows, "magnitude", cols) + "\n\n" + _table(rows, "axes", cols) + "\n")
  out = pathlib.Path(a.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps({"step": int(step), "rows": rows}, indent=1))
  out.with_suffix(".md").write_text(md)
  print(md)
  print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
