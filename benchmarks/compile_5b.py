"""Per-chip memory and roofline of the Wan2.2-TI2V-5B training step on TPU pods, compiled here for
abstract TPU devices (``jaxwm.training.compile_only``; needs libtpu, no TPU):

  python benchmarks/compile_5b.py --rows "21:v5p:4x4x4:dense,21:v6e:8x8:sparse,21:v5p:4x4x4:loci"

A row ``F:topology:variant`` compiles the training step of an ``F``-latent-frame clip (chunks of 2),
global batch = one clip per chip, FSDP over every chip, full remat, bf16 compute, AdamW state.
Variants: ``dense`` (teacher forcing, about ``2F`` frames in the sequence, XLA attention), ``splash``
(the same with TPU splash attention, ``model.attention_impl="splash"``),
``sparse`` (the same with ViewRope's frame-sparse attention, top-5 history frames, the Pallas TPU
kernel), ``loci`` (LOCI's 15 hybrid blocks of 30 with the Pallas delta rule, diffusion forcing:
``F`` frames in the sequence, softmax blocks dense). Frames are 160x160 space-to-depth latents (stride 4: 40x40x48,
400 tokens per frame; Wan's VAE at 480x832 gives 390) and there is no cross-attention (no text
encoder yet), so memory is the transformer's at the papers' token counts. Prints a markdown table.
"""

import argparse
import os
import re
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import wan22_ti2v_5b  # noqa: E402
from jaxwm.training import compile_only  # noqa: E402


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
    raise ValueError(f"row variant {variant!r}: must be dense, splash, sparse or loci")
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
  p.add_argument("--encoding", default="viewrope")
  a = p.parse_args()
  out = ["| latent frames | topology | variant | encoding | remat | mesh | per-chip HBM (args + temps) | fits | "
         "TFLOP/chip/step | roofline (ms) | compile (s) |", "|" + " --- |" * 11]
  for spec in a.rows.split(","):
    frames, gen, shape, variant = spec.split(":")
    topology = f"{gen}:{shape}"
    c = row_config(int(frames), topology, a.encoding, variant)
    t = time.time()
    lines, fits = compile_only.run(c, topology, "train")
    secs = time.time() - t
    mem = lines[1].split("per device: ", 1)[-1]
    if "total " in mem:
      total = mem.split("total ", 1)[-1].split(" ->", 1)[0]
    else:  # the compiler's refusal: "temporaries (40.61G) exceeds available HBM (31.25G)"
      need = re.findall(r"\(([\d.]+G)\)", mem)
      total = f"temporaries alone {need[0]} > {need[1]}" if len(need) >= 2 else mem
    flops = roof = "-"
    if len(lines) > 2:
      flops = lines[2].split(": ", 1)[1].split(" TFLOP", 1)[0]
      roof = lines[2].split("lower bound ", 1)[1].split(" ms", 1)[0]
    out.append(f"| {frames} | {topology} | {variant} | {a.encoding} | {c.model.remat} | fsdp={c.data.batch_size} | {total} | "
               f"{'yes' if fits else 'no'} | {flops} | {roof} | {secs:.0f} |")
  print("\n".join(out))


if __name__ == "__main__":
  main()
