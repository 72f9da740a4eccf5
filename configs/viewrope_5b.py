"""ViewRope's recipe on Wan2.2-TI2V-5B: stage III of its progressive pipeline (docs/recipes.md, "ViewRope").

This config is stage III: ViewRope on the 12 lowest temporal channels, geometry-aware frame-sparse
attention (top-5 history frames), teacher forcing on 61-frame clips at 480x832, continued from the
dense ViewRope model. The other stages are the command-line overrides below, chained by
``train.init_from``.

Ingest (the 61-frame clips; stage IV needs a second folder of 201-frame clips):

  python -m jaxwm.data.ingest --videos <videos> --cameras <cameras> --captions <captions.jsonl> \\
      --out data/viewrope_records --height 480 --width 832 --fps 16 --clip_frames 61 \\
      --vae wan2.2:weights/Wan2.2_VAE.pth \\
      --text_encoder umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder
  python -m jaxwm.data.ingest <the same arguments> --out data/viewrope_records_201 --clip_frames 201

Train, stage by stage (S=runs/viewrope_5b; a v5p-64 pod, one process per host):

  # I   short clips (17 RGB = 5 latent frames), teacher forcing, the backbone's RoPE only
  python train.py --config configs/viewrope_5b.py --workdir $S/stage1 --config.model.camera.encoding=rope3d \\
      --config.model.attention.sparsity=dense --config.data.num_frames=5 --config.train.num_steps=<not stated>
  # II  ViewRope on, short clips
  python train.py --config configs/viewrope_5b.py --workdir $S/stage2 --config.train.init_from=$S/stage1 \\
      --config.model.attention.sparsity=dense --config.data.num_frames=5 --config.train.num_steps=<not stated>
  # II' the dense ViewRope model that stage III continues from: 61-frame clips, 6k steps
  python train.py --config configs/viewrope_5b.py --workdir $S/stage2_61 --config.train.init_from=$S/stage2 \\
      --config.model.attention.sparsity=dense
  # III this config as it is: frame-sparse attention (top-5), 61-frame clips, 6k steps
  python train.py --config configs/viewrope_5b.py --workdir $S/stage3 --config.train.init_from=$S/stage2_61
  # IV  scale the context: 201-frame clips (51 latent frames), 2k steps
  python train.py --config configs/viewrope_5b.py --workdir $S/stage4 --config.train.init_from=$S/stage3 \\
      --config.data.data_dir=data/viewrope_records_201 --config.data.num_frames=51 --config.train.num_steps=2000

Stage I starts from the released transformer: ``--config.train.init_from=weights/Wan2.2-TI2V-5B-Diffusers/transformer``
(backbone parameters from the file; docs/recipes.md).

Sample (``--frames`` counts latent frames: 16 = 61 RGB frames; 41 = the 161-frame evaluation loops):

  python sample.py --workdir $S/stage4 --image first.png --trajectory cams.txt --prompt "<caption>" \\
      --frames 41 --out viewrope.mp4

Values from the paper (ViewRope):

  Wan2.2-TI2V-5B backbone, teacher forcing ........ §4.1 Implementation Details, App. A.1
  480 x 832, 61 frames per clip ................... App. A.1 ("Model and Resolution")
  global batch 64 ................................. App. A.1 ("Optimization")
  AdamW, lr 5e-5, linear warmup 50 iterations ..... App. A.1
  6k steps (dense ViewRope, 61 frames) ............ App. A.1; stage II'
  frame-sparse top-k = 5, 61 frames, 6k steps ..... §4.3 Experiments setup; this config (stage III)
  201 frames, 2k steps ............................ §4.3 Experiments setup; stage IV
  ~17-frame short clips (stages I-II) ............. §3.4
  stage sequence I-IV ............................. §3.4 Progressive Training Pipeline
  ViewRope on channels 32-44 (t_low) .............. §4.4 Table 5, App. A.1 ("Fair Comparison")
  K_s = 10 sampled tokens for relevance ........... §3.3 Eq. 9 (given as "e.g.")
  block = one latent frame, own block always kept . §3.3 Eqs. 10-11
  one frame generated and cached per step ......... App. A Alg. 1 (read as recipe.chunk_size = 1)
  16 fps (evaluation clips) ....................... App. C (the training frame rate is not stated)

Not stated (jaxwm defaults): Adam betas and epsilon, weight decay, gradient clipping, the decay after
warmup, EMA, timestep distribution and shift, text dropout, sampling steps, shift and guidance, the
steps of stages I and II.
"""

from configs import _smoke as smoke, wan22_ti2v_5b

DATA_DIR = "data/viewrope_records"  # the user's ingested folder (python -m jaxwm.data.ingest above)
VAE = "wan2.2:weights/Wan2.2_VAE.pth"
TEXT_ENCODER = "umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder"
HEIGHT, WIDTH = 480, 832  # ViewRope App. A.1
CLIP_FRAMES = 61  # RGB frames per clip, ViewRope App. A.1
LATENT_FRAMES = 1 + (CLIP_FRAMES - 1) // 4  # 16: Wan2.2's causal VAE, the first frame alone then groups of 4
CHUNK = 1  # latent frames per chunk: App. A Alg. 1 generates and caches one frame per camera step
TOP_K = 5  # ViewRope §4.3


VARIANTS = ("", "smoke")


def get_config(variant=""):
  """The recipe; ``configs/viewrope_5b.py:smoke``: the same code path at CPU size (``configs/_smoke.py``)."""
  if variant not in VARIANTS:
    raise ValueError(f"configs/viewrope_5b.py:{variant}: not one of {VARIANTS}")
  c = wan22_ti2v_5b.get_config()  # the 5B shape: 30 blocks of 24 x 128 heads, cross-attention to umT5 text
  c.model.update(dtype="bfloat16", remat="full")  # as the 5B base: bf16 compute, full rematerialisation
  # ViewRope on the 12 lowest temporal RoPE channels [32, 44) (§4.4 Table 5, App. A.1) and frame-sparse attention
  # over the top-5 history frames (§4.3), relevance from K_s = 10 token positions (§3.3 Eq. 9).
  c.model.camera.update(encoding="viewrope", channels="t_low", vae_stride=16)
  c.model.attention.update(sparsity="frame_topk", top_k=TOP_K, num_samples=10,
                           impl="pallas_tpu")  # jaxwm's TPU kernel; pallas_gpu on GPUs, xla on CPU
  c.model.attention_impl = "auto"  # dense attention (stages I-II): splash on TPU, cuDNN on GPU
  c.data.update(
      source="records", data_dir=DATA_DIR, vae=VAE, text_encoder=TEXT_ENCODER, latent_stride=16,
      num_frames=LATENT_FRAMES, frame_stride=1,
      batch_size=64, per_device_batch_size=0,  # global batch 64 (App. A.1): one clip per chip on a v5p-64
      palindrome_prob=0.0,  # no palindromes in ViewRope's data
      scale_divisor=1.0)  # not stated; jaxwm default (ViewRope reads rotations only, no translation)
  c.recipe.update(
      chunk_size=CHUNK, layout="teacher_forcing",  # teacher forcing (§3.3, App. A Alg. 1)
      timestep_distribution="uniform", timestep_shift=1.0,  # not stated; jaxwm default
      text_dropout=0.0)  # not stated; jaxwm default
  c.optim.update(
      lr=5e-5, warmup_steps=50,  # AdamW, lr 5e-5, linear warmup over 50 iterations (App. A.1)
      end_lr_ratio=0.1,  # not stated; jaxwm default (cosine to 0.1 x lr after the warmup)
      weight_decay=0.01, b1=0.9, b2=0.99, eps=1e-8, grad_clip=1.0, ema_decay=0.999)  # not stated; jaxwm defaults
  c.mesh.update(data=1, fsdp=-1)  # v5p-64 (64 chips, v5p:4x4x4): parameters and batch FSDP over every chip
  c.train.update(
      num_steps=6000,  # stage III: 6k steps (§4.3); stage IV: 2000
      sample_every=0, gain_every=0,  # off: jaxwm's periodic sample and memory-gain probe render procedural scenes
      workdir="runs/viewrope_5b/stage3", init_from="")  # stage III starts from stage II' (--config.train.init_from)
  c.sample.update(num_steps=10, shift=3.0, guidance=1.0)  # not stated; jaxwm defaults
  return smoke.shrink(c, "viewrope_5b") if variant == "smoke" else c
