"""Where a training step spends its time: jaxwm's backbone step (XLA:CPU, op by op from a ``jax.profiler``
trace) against the same step in PyTorch (diffusers' ``WanTransformer3DModel``, ``torch.profiler``), grouped by
what the time is for (attention scores and softmax, projections, FFN, norms and modulation, RoPE, optimiser,
layout copies), in one run.

  python benchmarks/profile_step.py                       # the default config's backbone (configs/tiny.py)
  python benchmarks/profile_step.py --configs tiny,recipe_w384 --steps 5
  python benchmarks/profile_step.py --train-step --attention-impl xla_lse   # jaxwm's real step too

jaxwm: each HLO instruction's events (thunks on every XLA thread) are summed and attributed by the instruction's
``op_name`` metadata (the Flax module path and jax primitive that produced it) in the compiled program, so a fusion
counts where its root came from; the sum over threads can exceed the step's wall time when thunks run in
parallel. torch: self CPU time per aten op, attributed by op name. Shares are of each side's summed op time.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train_step as ts  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def _jax_group(op_name, opcode):
  """The model component (a row of the profile's table) of one HLO instruction, from its ``op_name`` metadata
  (the Flax module path and primitive) and opcode."""
  n = op_name.lower()
  if "adam" in n or "optax" in n or "apply_updates" in n or "scale_by" in n:
    return "optimiser"
  if "worldrope_factors" in n:  # WorldRoPE's view factors (a named scope inside the attention layers)
    return "RoPE / camera"
  if opcode == "custom-call" and re.search(r"attn\d?/", n):  # a C++ attention kernel (cpu_flash)
    return "attention core"
  if re.search(r"attn\d?/(?!to_|norm_)", n) and re.search(r"dot_general|softmax|exp|reduce|max|div|sub|select|"
                                                           r"where|einsum", n):
    return "attention core"
  if re.search(r"/to_(q|k|v|out)", n):
    return "q/k/v/out projections"
  if re.search(r"norm_(q|k)", n):
    return "q/k norms"
  if re.search(r"ffn_|gelu", n):
    return "FFN"
  if re.search(r"norm\d|scale_shift|layernorm", n):
    return "norms + modulation"
  if re.search(r"rope|rotary|camera|viewrope|worldrope|encod", n):
    return "RoPE / camera"
  if re.search(r"time_|text_|condition|embedding", n):
    return "time / text embedding"
  if re.search(r"patch|proj_out|head|unpatch", n):
    return "patch embed / head"
  # the transpose primitive, not "transpose(jvp(...))", the prefix of every backward op (until 2026-12-05 it
  # matched that too, and the backward's residual adds and gates were counted as layout)
  if opcode in ("copy", "transpose", "copy-start", "copy-done") or re.search(r"/transpose(?!\()", n):
    return "layout (copy/transpose)"
  if "square" in n or "mean" in n and "blocks" not in n:
    return "loss"
  if re.search(r"blocks", n):  # residual adds, gates, the scan's slicing
    return "norms + modulation"
  return "other"


def _hlo_index(text):
  """``{instruction name: (opcode, op_name)}`` of a compiled module's text (entry and nested computations)."""
  out = {}
  text = re.sub(r"/\*index=\d+\*/", "", text)  # in long tuple shapes too, where an '=' would end the shape
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^=]*?\b([a-z][a-z0-9\-]*)\((.*)$", text, re.M):
    name, opcode, rest = m.group(1), m.group(2), m.group(3)
    op = re.search(r'op_name="([^"]*)"', rest)
    out[name] = (opcode, op.group(1) if op else "")
  return out


def _fusion_op_names(text):
  """For fusion instructions without metadata: the op_name of the first instruction of the fused computation."""
  calls = dict(re.findall(r"%?([\w.\-]+) = .*?\bfusion\(.*?calls=%?([\w.\-]+)", text))
  comps, cur = {}, None
  for line in text.splitlines():
    h = re.match(r"^%?([\w.\-]+) .*\{$", line.strip()) if not line.startswith(" ") else None
    if h:
      cur = h.group(1)
      continue
    op = re.search(r'op_name="([^"]*)"', line)
    if cur and op and cur not in comps:
      comps[cur] = op.group(1)
  return {f: comps.get(c, "") for f, c in calls.items()}


def profile_jax(fn, args, steps):
  """``(wall s per step, per-group ms per step, top instructions)`` of ``fn(*args)`` (jitted; ``args[0]`` the
  state, replaced by each call's ``out[0]``)."""
  compiled = fn.lower(*args).compile()
  text = compiled.as_text()
  index, fusions = _hlo_index(text), _fusion_op_names(text)
  out = fn(*args)  # a step donates its state: each call gets the last one's (out[0])
  jax.block_until_ready(out)
  args = (out[0],) + tuple(args[1:])
  d = tempfile.mkdtemp(prefix="jaxwm_prof_")
  jax.profiler.start_trace(d)
  t = time.perf_counter()
  for _ in range(steps):
    out = fn(*args)
    jax.block_until_ready(out)
    args = (out[0],) + tuple(args[1:])
  wall = (time.perf_counter() - t) / steps
  jax.profiler.stop_trace()
  path = sorted(glob.glob(f"{d}/**/*.trace.json.gz", recursive=True))[-1]
  with gzip.open(path) as f:
    events = json.load(f)["traceEvents"]
  threads = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  per_op = collections.Counter()
  for e in events:
    if e.get("ph") != "X" or "XLA" not in threads.get((e.get("pid"), e.get("tid")), ""):
      continue
    name = e["name"]
    if name in index:
      per_op[name] += e.get("dur", 0) / 1e3 / steps
  groups = collections.Counter()
  rows = []
  for name, ms in per_op.items():
    opcode, op_name = index[name]
    op_name = op_name or fusions.get(name, "")
    g = _jax_group(op_name, opcode)
    groups[g] += ms
    rows.append((ms, name, opcode, g, op_name))
  return wall, groups, sorted(rows, reverse=True)


def _torch_group(key):
  k = key.lower()
  if "scaled_dot_product" in k or "flash_attention" in k or "softmax" in k or "bmm" in k or "baddbmm" in k:
    return "attention core"
  if k in ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul"):
    return "projections + FFN (matmuls)"
  if "rms_norm" in k or "layer_norm" in k or "native_layer_norm" in k:
    return "norms + modulation"
  if "gelu" in k:
    return "FFN"
  if "adam" in k or "_foreach" in k or "lerp" in k or "addcdiv" in k or "addcmul" in k:
    return "optimiser"
  if "copy" in k or "contiguous" in k or "clone" in k or "permute" in k or "transpose" in k or "cat" in k:
    return "layout (copy/transpose)"
  if "conv" in k:
    return "patch embed / head"
  if k in ("aten::mul", "aten::add", "aten::add_", "aten::mul_", "aten::sub", "aten::div", "aten::pow",
           "aten::rsqrt", "aten::mean", "aten::sum", "aten::neg", "aten::where"):
    return "elementwise (norms, modulation, RoPE, residuals)"
  return "other"


def profile_torch(config, steps, threads):
  from torch.profiler import ProfilerActivity, profile  # pylint: disable=g-import-not-at-top
  step, _ = ts.torch_step(config, threads)
  step()
  t0 = time.perf_counter()
  for _ in range(steps):
    step()
  wall = (time.perf_counter() - t0) / steps
  with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
      step()
  groups, rows = collections.Counter(), []
  for ev in prof.key_averages():
    ms = ev.self_cpu_time_total / 1e3 / steps
    if ms <= 0:
      continue
    g = _torch_group(ev.key)
    groups[g] += ms
    rows.append((ms, ev.key, g))
  return wall, groups, sorted(rows, reverse=True)


def jax_backbone_step(config):
  """The jitted backbone step of :func:`train_step.jaxwm_backbone_step` and its arguments."""
  step, args, _ = ts.jaxwm_backbone_step(config)
  return step, args


def jax_train_step(config):
  """jaxwm's real train step (:func:`train_step.jaxwm_train_step`: camera encoding, layout, AdamW) and its
  arguments."""
  tr, state, batch, key = ts.jaxwm_train_step(config, tempfile.mkdtemp(prefix="jaxwm_prof_run_"))
  return tr.train_step, (state, batch, key)


def _print(title, wall, groups, rows, top, cols):
  total = sum(groups.values())
  print(f"\n{title}: {wall * 1e3:.1f} ms per step (wall); summed op time {total:.1f} ms")
  print("| group | ms / step | share |")
  print("| --- | --- | --- |")
  for g, ms in groups.most_common():
    print(f"| {g} | {ms:.1f} | {ms / total:.1%} |")
  print(f"top {top}: " + " | ".join(cols))
  for r in rows[:top]:
    print("  " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)[:110] for v in r))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="tiny")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--top", type=int, default=15)
  p.add_argument("--torch-threads", type=int, default=os.cpu_count())
  p.add_argument("--no-torch", action="store_true")
  p.add_argument("--train-step", action="store_true", help="also profile jaxwm's real train step")
  p.add_argument("--attention-impl", default="", help="model.attention_impl for jaxwm (default: the config's)")
  args = p.parse_args()
  if args.steps < 1:
    p.error(f"--steps={args.steps}: must be >= 1")
  for name in args.configs.split(","):
    if name not in ts.CONFIGS:
      p.error(f"--configs: {name!r} is not one of {sorted(ts.CONFIGS)}")
  for name in args.configs.split(","):
    config = ts.CONFIGS[name]()
    ts.resolve_batch_size(config, 1)
    if args.attention_impl:
      config.model.attention_impl = args.attention_impl
    b, s, lat, ch = ts._backbone_shapes(config)  # pylint: disable=protected-access
    print(f"== {name}: backbone step, batch {b}, {s} frames of {lat}x{lat}x{ch} latents, width "
          f"{config.model.dim}, {config.model.num_layers} layers, {os.cpu_count()} CPU cores")
    fn, fargs = jax_backbone_step(config)
    _print("jaxwm (XLA:CPU)", *profile_jax(fn, fargs, args.steps), args.top,
           ["ms", "instruction", "opcode", "group", "op_name"])
    if args.train_step:
      fn, fargs = jax_train_step(config)
      _print(f"jaxwm train step ({config.model.camera.encoding}, {config.recipe.layout})",
             *profile_jax(fn, fargs, args.steps), args.top, ["ms", "instruction", "opcode", "group", "op_name"])
    if not args.no_torch:
      _print("torch (diffusers)", *profile_torch(config, args.steps, args.torch_threads), args.top,
             ["ms", "aten op", "group"])


if __name__ == "__main__":
  main()
