"""LOCI's recipe on Wan2.2-TI2V-5B (docs/recipes.md, "LOCI").

LOCI's hybrid layout: 15 of the 30 blocks trade history softmax for a gated delta-rule memory read
before each chunk writes (PRoPE-conditioned, translations / 6 m), trained with chunk-wise diffusion
forcing on 81-latent windows (one conditioning frame + 16 chunks of 5) at 512x768, text dropout 0.1.

Ingest (321 RGB frames = 81 latent frames, every 2nd frame of 24-fps recordings):

  python -m jaxwm.data.ingest --videos <videos> --cameras <cameras> --captions <captions.jsonl> \\
      --out data/loci_records --height 512 --width 768 --stride 2 --clip_frames 321 \\
      --vae wan2.2:weights/Wan2.2_VAE.pth \\
      --text_encoder umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder

Train (a v5p-64 pod, one process per host). Measured (BENCHMARKS.md): the compiled step of one 81-latent window
per chip does not fit a v5p-64 chip (117 G of temporaries > 95.7 G); halve data.num_frames or use a larger pod
until the cause is found:

  python train.py --config configs/loci_5b.py --workdir runs/loci_5b

Starts from the released Wan2.2-TI2V-5B transformer: ``--config.train.init_from=weights/Wan2.2-TI2V-5B-Diffusers/transformer`` (backbone
parameters from the file, the additions at their own initialisation; docs/recipes.md).
LOCI's data switch at update 2,000 (uniform -> UE-weighted mixture, same run) is one data_dir here.

Sample (``--frames`` counts latent frames: 161 = 40 s at 16 fps; ``--memory panorama`` is LOCI's
bounded mode, sink + 20 bank + 8 recent frames + the current chunk):

  python sample.py --workdir runs/loci_5b --image first.png --trajectory cams.txt --prompt "<caption>" \\
      --frames 161 --memory panorama --out loci.mp4

Values from the paper (LOCI; its published text keeps few headings, so the training-recipe
paragraph is cited as §4 and the architecture details as App. A):

  Wan2.2-TI2V-5B: 30 blocks, 24 heads x 128 .............. App. A; §4 training recipe
  512 x 768 -> 32 x 48 x 48 latents, 384 tokens/frame .... App. A
  chunks of 5 latent frames after a clean first latent ... §3
  81 = 1 + 16 x 5 latent frames per training window ...... App. A; §4
  321 RGB frames, stride 2 from 24-fps recordings ........ §4
  hybrid blocks [2,4,6,7,8,9,11,13,14,16,23,24,25,27,28] . App. A
  alpha_min 0.2, initial retention 0.7 ................... App. A (Eq. 10)
  memory PRoPE, first-frame reference, translations / 6 .. §3 (Eq. 9)
  chunk-wise diffusion forcing ........................... §2 (against ARL²'s conversion recipe)
  5,000 updates, global batch 64 ......................... §4 training recipe
  AdamW, backbone learning rate 1e-5 ..................... §4 training recipe
  250-update linear warmup, cosine decay to 0.1 x ........ §4 training recipe
  weight decay 0, gradient clipping 0.3 .................. §4 training recipe
  text dropout 0.1 ....................................... §4 training recipe
  bounded memory: sink + 20 bank + 8 recent + 5 current .. App. A (sparse mode)

Stated but not reproducible in jaxwm: the camera-branch (5e-5) and recurrent-branch (1e-4) learning
rates (one optim.lr here), the UCPE camera-attention branch of every block (``prope`` per token
stands in), committing generated chunks at t = 100 in the bounded mode (jaxwm commits at t = 0).
Not stated (jaxwm defaults): Adam betas and epsilon, EMA, timestep distribution and shift, sampling
steps, shift and guidance, the camera files' scale per source.
"""

from configs import _smoke as smoke, wan22_ti2v_5b

DATA_DIR = "data/loci_records"  # the user's ingested folder (python -m jaxwm.data.ingest above)
VAE = "wan2.2:weights/Wan2.2_VAE.pth"
TEXT_ENCODER = "umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder"
HEIGHT, WIDTH = 512, 768  # LOCI App. A
CLIP_FRAMES = 321  # RGB frames per window (LOCI §4)
LATENT_FRAMES = 81  # = 1 + (321 - 1) / 4 = 1 + 16 x 5 (LOCI App. A, §4)
CHUNK = 5  # latent frames per chunk (LOCI §3)
HYBRID_BLOCKS = (2, 4, 6, 7, 8, 9, 11, 13, 14, 16, 23, 24, 25, 27, 28)  # LOCI App. A, zero-based


VARIANTS = ("", "smoke")


def get_config(variant=""):
  """The recipe; ``configs/loci_5b.py:smoke``: the same code path at CPU size (``configs/_smoke.py``)."""
  if variant not in VARIANTS:
    raise ValueError(f"configs/loci_5b.py:{variant}: not one of {VARIANTS}")
  c = wan22_ti2v_5b.get_config()  # the 5B shape: 30 blocks of 24 x 128 heads, cross-attention to umT5 text
  c.model.update(dtype="bfloat16", remat="full")  # as the 5B base: bf16 compute, full rematerialisation
  # Camera conditioning of the softmax blocks: LOCI adds a UCPE ray-conditioned camera-attention branch to every
  # block (§3, App. A), which jaxwm does not have; PRoPE per token (the ray's local frame) on the 12 lowest
  # temporal channels is jaxwm's closest stand-in (docs/design.md §7). Parameter-free: the backbone is unchanged.
  c.model.camera.update(encoding="prope", per_token=True, channels="t_low", vae_stride=16,
                        translation_scale=1.0)  # not stated for UCPE; jaxwm default
  c.model.loci.update(
      enabled=True, blocks=HYBRID_BLOCKS,  # 15 hybrid blocks of 30 (App. A)
      alpha_min=0.2, init_retention=0.7,  # retention floor and initial per-chunk retention (App. A, Eq. 10)
      translation_divisor=6.0,  # the memory's PRoPE divides translations by s = 6 (§3, Eq. 9)
      chunk_size=64,  # the delta-rule scan's token block: a kernel setting, not LOCI's chunk
      impl="pallas_tpu")  # jaxwm's TPU delta-rule kernel; pallas_gpu on GPUs, xla on CPU
  c.model.attention_impl = "auto"  # the 15 softmax blocks: splash on TPU, cuDNN on GPU
  # The hybrid blocks' own-chunk softmax: the Pallas gathered-frames kernel (pallas_gpu on GPUs); the XLA
  # reference holds float32 scores of every token over its chunk's 5 x 384 keys (about 3 GB per layer here).
  c.model.attention.update(impl="pallas_tpu")
  c.data.update(
      source="records", data_dir=DATA_DIR, vae=VAE, text_encoder=TEXT_ENCODER, latent_stride=16,
      num_frames=LATENT_FRAMES, frame_stride=1,  # the RGB stride 2 is applied at ingestion (--stride 2)
      batch_size=64, per_device_batch_size=0,  # global batch 64 (§4): one window per chip on a v5p-64
      palindrome_prob=0.0,  # no palindromes in LOCI's data
      scale_divisor=1.0)  # not stated; jaxwm default: camera files in metres (LOCI's 6 m assume metres)
  c.recipe.update(
      chunk_size=CHUNK, layout="diffusion_forcing",  # chunk-wise diffusion forcing (§2), chunks of 5 latents (§3)
      timestep_distribution="uniform", timestep_shift=1.0,  # not stated; jaxwm default
      text_dropout=0.1)  # LOCI §4
  c.optim.update(
      lr=1e-5,  # the backbone's rate (§4); the camera branch's 5e-5 and the memory's 1e-4 need per-group rates
      warmup_steps=250, end_lr_ratio=0.1,  # 250-update linear warmup, cosine decay to 0.1 x (§4)
      weight_decay=0.0, grad_clip=0.3,  # AdamW, zero weight decay, clipping at 0.3 (§4)
      b1=0.9, b2=0.99, eps=1e-8, ema_decay=0.999)  # not stated; jaxwm defaults
  c.mesh.update(data=1, fsdp=-1)  # v5p-64 (64 chips, v5p:4x4x4): parameters and batch FSDP over every chip
  c.train.update(
      num_steps=5000,  # 5,000 updates (§4)
      sample_every=0, gain_every=0,  # off: jaxwm's periodic sample and memory-gain probe render procedural scenes
      workdir="runs/loci_5b", init_from="")
  c.sample.update(num_steps=10, shift=3.0, guidance=1.0)  # not stated; jaxwm defaults
  return smoke.shrink(c, "loci_5b") if variant == "smoke" else c
