"""The ``smoke`` variant of a paper recipe (``configs/viewrope_5b.py:smoke``, ``loci_5b.py:smoke``,
``reworld_5b.py:smoke``): the recipe's own code path (records data with VAE latents and umT5 text, its camera
encoding, sparsity, memory, layout, chunk drop, head windows, FSDP mesh, remat) at a size that trains on a CPU in
minutes, with jaxwm's built-in random tiny encoders standing in for the released weights.

  python -m jaxwm.data.procedural --export data/smoke_videos --clips 4 --frames 41 --size 64
  python -m jaxwm.data.ingest --videos data/smoke_videos/videos --cameras data/smoke_videos/cameras \\
      --captions data/smoke_videos/captions.jsonl --out data/smoke_records --height 64 --width 64 \\
      --clip_frames 41 --vae wan2.2-tiny:0 --text_encoder umt5-tiny:0
  python train.py --config configs/viewrope_5b.py:smoke       # runs/viewrope_5b_smoke, 20 steps
  python sample.py --workdir runs/viewrope_5b_smoke --image first.png --preset yaw45 --prompt "a room"

What is shrunk, nothing else: the model's width, depth and heads (2 layers of 2 heads of 32; LOCI's hybrid
blocks become layer 1), the clip (11 latent frames of 4x4 at 64x64 pixels), the batch (2), the steps (20), and
ReWorld's windows and kept chunks to fit 2 chunks; the Pallas kernels are swapped for the XLA references (a CPU
host). Values a recipe states stay as stated.
"""

VAE, TEXT_ENCODER = "wan2.2-tiny:0", "umt5-tiny:0"  # built-in random encoders (jaxwm.encoders)
DATA_DIR = "data/smoke_records"
LATENT_FRAMES = 11  # 41 RGB frames: the first latent + 10 (LOCI: 2 chunks of 5; ReWorld: 2 chunks of 4 fit)


def shrink(c, name):
  """``c`` (a paper recipe's config) at smoke size, its workdir ``runs/<name>_smoke``."""
  c.model.update(dim=64, num_heads=2, num_layers=2, ffn_dim=64, freq_dim=32, text_dim=64, in_channels=8,
                 out_channels=8, dtype="float32", attention_impl="xla")
  c.model.attention.impl = "xla"
  if c.model.loci.enabled:
    c.model.loci.update(blocks=(1,), impl="xla", chunk_size=16)
  chunk = c.recipe.chunk_size
  c.data.update(data_dir=DATA_DIR, vae=VAE, text_encoder=TEXT_ENCODER, latent_stride=16,
                num_frames=1 + (LATENT_FRAMES - 1) // chunk * chunk, batch_size=2, per_device_batch_size=0)
  if c.recipe.chunk_drop.enabled:
    c.recipe.chunk_drop.keep = 1
  if c.recipe.head_windows.enabled:
    c.recipe.head_windows.update(window=chunk, global_fraction=0.5, pool=2)
  c.optim.warmup_steps = 2
  c.train.update(num_steps=20, ckpt_every=10, log_every=5, workdir=f"runs/{name}_smoke", init_from="")
  c.sample.num_steps = 4
  return c
