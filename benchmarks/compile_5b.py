"""Per-chip memory and roofline of the Wan2.2-TI2V-5B training step on TPU pods, compiled here for
abstract TPU devices (``jaxwm.training.compile_only``; needs libtpu, no TPU):

  python benchmarks/compile_5b.py --rows "21:v5p:4x4x4:dense,21:v6e:8x8:sparse,21:v5p:4x4x4:loci"

A row ``F:topology:variant`` compiles the training step of an ``F``-latent-frame clip,
global batch = one clip per chip, FSDP over every chip, full remat, bf16 compute, AdamW state.
Variants: ``dense`` (teacher forcing in chunks of 2, about ``2F`` frames in the sequence, XLA attention), ``splash``
(the same with TPU splash attention, ``model.attention_impl="splash"``),
``sparse`` (the same with ViewRope's frame-sparse attention, top-5 history frames, the Pallas TPU
kernel), ``loci`` (LOCI's 15 hybrid blocks of 30 with the Pallas delta rule, diffusion forcing:
``F`` frames in the sequence, softmax blocks dense). Frames of these variants are 160x160 space-to-depth
latents (stride 4: 40x40x48, 400 tokens per frame) and there is no cross-attention.

The recipe variants compile a per-paper config (``configs/<variant>.py``) at its real latent geometry
with umT5 cross-attention: the batch is what the records loader gives, ``latents [B, F, h, w, 48]`` of
Wan2.2's VAE (16x spatial) and ``text_emb [B, 512, 4096]``, from a stand-in dataset written to a temporary
folder (the manifest ``python -m jaxwm.data.ingest`` writes for the paper's size and ``F`` latent frames,
one unread shard, a zero empty-prompt embedding; nothing real is read). ``viewrope_5b``: ViewRope's
recipe at 480x832 (30x52x48 latents, 390 tokens per frame; teacher forcing, chunks of 1, ViewRope on
``t_low``), its dense stages' attention (no frame sparsity) with splash; ``loci_5b``: LOCI's recipe at
512x768 (32x48x48, 384 tokens; diffusion forcing, chunks of 5, the 15 hybrid blocks with the Pallas delta
rule, text dropout 0.1), softmax blocks with splash; ``reworld_5b``: ReWorld's recipe at 384x640 (24x40x48,
240 tokens per frame; teacher forcing in chunks of 4, MRoPE and Plücker injection, chunk drop and per-head
windows, so the mask is traced per step: splash's frame-aligned blocks). ``--size HxW`` overrides the recipes'
frame size.

  python benchmarks/compile_5b.py --rows "21:v5p:4x4x4:viewrope_5b,81:v5p:4x4x4:loci_5b"

Prints a markdown table.
"""

import argparse
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import loci_5b, reworld_5b, viewrope_5b, wan22_ti2v_5b  # noqa: E402
from jaxwm import config_checks  # noqa: E402
from jaxwm.training import compile_only  # noqa: E402
from jaxwm.data.sources import latent_geometry  # noqa: E402

RECIPES = {"viewrope_5b": viewrope_5b, "loci_5b": loci_5b, "reworld_5b": reworld_5b}


def recipe_config(frames, topology, variant, tmp, size=None):
  """``configs/<variant>.py`` at ``frames`` latent frames of its paper's frame size (or ``size``, ``(H, W)``),
  one clip per chip, FSDP over every chip, splash attention, over a stand-in dataset in ``tmp``."""
  _, _, chips = compile_only.parse_topology(topology)
  module = RECIPES[variant]
  c = module.get_config()
  h, w = size or (module.HEIGHT, module.WIDTH)
  c.data.num_frames = frames
  c.data.update(data_dir=compile_only.stand_in_dataset(os.path.join(tmp, f"{variant}_{frames}_{h}x{w}"), c.data,
                                                       (h, w), c.model.text_dim, latent_frames=frames),
                batch_size=chips, per_device_batch_size=0)
  c.model.attention_impl = "splash"  # "auto" would pick it on a TPU mesh too; explicit for the table
  if variant == "viewrope_5b":
    c.model.attention.update(sparsity="dense")  # the dense stages (I-II'); stage III's top-5 is not this row
  c.mesh.update(data=1, fsdp=-1)
  config_checks.validate(c, num_devices=chips)
  return c


def row_config(frames, topology, encoding, variant="dense"):
  _, _, chips = compile_only.parse_topology(topology)
  c = wan22_ti2v_5b.get_config()
  if variant == "splash":
    c.model.attention_impl = "splash"
  elif variant == "sparse":
    c.model.attention.update(sparsity="frame_topk", top_k=5, impl="pallas_tpu")
  elif variant == "loci":
    c.model.loci.update(enabled=True, impl="pallas_tpu")
    c.recipe.layout = "diffusion_forcing"
  elif variant != "dense":
    raise ValueError(f"row variant {variant!r}: must be dense, splash, sparse, loci or one of {tuple(RECIPES)}")
  c.model.camera.update(encoding=encoding, vae_stride=4, channels="t_low")
  c.model.cross_attn = False
  c.data.update(image_size=160, latent_stride=4, num_frames=frames, batch_size=chips, per_device_batch_size=0,
                source="procedural")
  c.recipe.chunk_size = 2
  c.mesh.update(data=1, fsdp=-1)
  return c


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", default="21:v5p:4x4x4:dense,21:v6e:8x8:dense,21:v6e:8x8:sparse")
  p.add_argument("--encoding", default="viewrope", help="camera encoding of the 160x160 variants (the recipes "
                 "keep their paper's)")
  p.add_argument("--size", default="", help="HxW frames of the recipe variants (default: the paper's)")
  a = p.parse_args()
  size = tuple(int(x) for x in a.size.split("x")) if a.size else None
  tmp = tempfile.TemporaryDirectory(prefix="compile_5b_")
  out = ["| latent frames | topology | variant | encoding | latents (tokens/frame) | text | remat | mesh | "
         "per-chip HBM (args + temps) | fits | TFLOP/chip/step | roofline (ms) | compile (s) |", "|" + " --- |" * 13]
  for spec in a.rows.split(","):
    frames, gen, shape, variant = spec.split(":")
    topology = f"{gen}:{shape}"
    if variant in RECIPES:
      c = recipe_config(int(frames), topology, variant, tmp.name, size)
    else:
      c = row_config(int(frames), topology, a.encoding, variant)
    lat_h, lat_w, lat_c = latent_geometry(c.data)
    tokens = (lat_h // c.model.patch_size[1]) * (lat_w // c.model.patch_size[2])
    text = f"{compile_only.TEXT_LEN}x{c.model.text_dim}" if c.model.cross_attn else "-"
    t = time.time()
    lines, fits = compile_only.run(c, topology, "train")
    secs = time.time() - t
    mem = lines[1].split("per device: ", 1)[-1]
    if "RESOURCE_EXHAUSTED" not in mem:
      total = mem.split("total ", 1)[-1].split(" HBM ->", 1)[0]
    else:  # the compiler's refusal: "... required for HLO temporaries (40.61G) exceeds available HBM (31.25G)"
      need = re.findall(r"\(([\d.]+G)\)", mem)
      total = f"temporaries alone {need[0]} > {need[1]}" if len(need) >= 2 else mem
    flops = roof = "-"
    if len(lines) > 2:
      flops = lines[2].split(": ", 1)[1].split(" TFLOP", 1)[0]
      roof = lines[2].split("lower bound ", 1)[1].split(" ms", 1)[0]
    out.append(f"| {frames} | {topology} | {variant} | {c.model.camera.encoding} | {lat_h}x{lat_w}x{lat_c} "
               f"({tokens}) | {text} | {c.model.remat} | fsdp={c.data.batch_size} | {total} | "
               f"{'yes' if fits else 'no'} | {flops} | {roof} | {secs:.0f} |")
    print(out[-1], flush=True)
  tmp.cleanup()
  print("\n".join(out))


if __name__ == "__main__":
  main()
