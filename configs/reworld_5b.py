"""ReWorld's recipe on Wan2.2-TI2V-5B: its 480p stage (docs/recipes.md, "ReWorld").

MRoPE (pose phases on q/k plus zero-initialised SE(3) residuals on v/out) and Plücker action
injection, chunk-causal teacher forcing on windows of 12 chunks of 4 latent frames at 384x640 and
24 fps, mixed per-head windows (6 global heads of 24 routed from a pool of 12 sets, 18 local heads
seeing the last 12 frames), chunk drop (the sink plus 5 random past chunks), palindromes with
probability 0.2 and the UE sources' metric divisor (centimetres -> metres).

Ingest (193 RGB frames at 24 fps = 49 latent frames = the first latent + 12 chunks of 4; ReWorld's
window is 189 frames = 48 latents, which jaxwm's layout, one clean latent then whole chunks, cannot
hold as 12 chunks; docs/recipes.md). Camera files in centimetres and OpenCV axes:

  python -m jaxwm.data.ingest --videos <videos> --cameras <cameras> --captions <captions.jsonl> \\
      --out data/reworld_records --height 384 --width 640 --fps 24 --clip_frames 193 --hop 24 \\
      --vae wan2.2:weights/Wan2.2_VAE.pth \\
      --text_encoder umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder
  # the 720p stage: the same with --height 704 --width 1280 --out data/reworld_records_720p

(``--hop 24``, a new window every second, stands in for ReWorld's random window start in each clip;
the hop itself is a jaxwm choice.)

Train (a v5p-64 pod, one process per host), then the 720p warm start:

  python train.py --config configs/reworld_5b.py --workdir runs/reworld_5b \\
      --config.optim.lr=<not stated> --config.train.num_steps=<not stated>
  python train.py --config configs/reworld_5b.py --workdir runs/reworld_5b_720p \\
      --config.train.init_from=runs/reworld_5b --config.data.data_dir=data/reworld_records_720p \\
      --config.optim.lr=<not stated> --config.train.num_steps=<not stated>

Starts from the released Wan2.2-TI2V-5B transformer: ``--config.train.init_from=weights/Wan2.2-TI2V-5B-Diffusers/transformer`` (backbone
parameters from the file, the additions at their own initialisation; docs/recipes.md).

Sample with the bounded landmark cache (sink + 5 recent chunks + 6 retrieved landmarks, bank of 30;
``--frames`` counts latent frames: 97 = 1 + 24 chunks of 4):

  python sample.py --workdir runs/reworld_5b --image first.png --trajectory cams.txt --prompt "<caption>" \\
      --frames 97 --memory landmark --out reworld.mp4

Four-step distillation into a LoRA of rank 128 (ReWorld §2.4; jaxwm.distill):

  python train.py --config configs/distill.py:reworld_5b --config.distill.teacher=runs/reworld_5b \\
      --config.distill.rank=128 --workdir runs/reworld_5b_distill

Values from the paper (ReWorld):

  Wan2.2-TI2V-5B backbone ................................ §2.2 (Backbone and chunked causal generation)
  chunks of 4 latent frames, 12 chunks per window ........ §2.2; App. A.3 (Window extraction)
  189-frame windows at 24 fps (48 latent frames) ......... §3.4 Sampling; App. A.3
  480p stage at 384 x 640, then 720p at 704 x 1280 ....... §4.1 Implementation
  MRoPE: zero-init pose MLP -> q/k phases, v/out residuals §2.2 Eq. 1
  Plücker ray map of the commanded pose, added to patches  §2.2 (Action injection)
  24 heads: 6 global (full history), 18 local (last 12) .. §2.2 Eq. 2; §4.1
  pool of 12 random six-head global sets, one per step ... §2.2 (Random head routing); §4.1
  chunk drop: sink + 5 random survivors of 12 chunks ..... §2.3 (Chunk-drop training)
  teacher forcing (clean keys of earlier chunks) ......... §2.3 (Chunk-drop training)
  palindrome probability 0.2 (UE sources) ................ §3.4 Sampling; App. A.3
  UE divisor 100 (cm -> m), other sources' divisors ...... §3.3 Eq. 4; App. A.2
  CFG scale 1 at inference ............................... §4.1 (Real-time inference)
  landmark cache B = 12: sink + 5 recent + 6 landmarks ... §2.3 Eq. 3
  landmark bank K = 30, first 2 never evicted ............ §2.3; §4.1
  4-step distillation, LoRA rank 128 ..................... §2.4; §4.1

Per-source divisors (App. A.2), for ``data.scale_divisor`` of a one-source dataset: UE 100, DL3DV
0.1923, RealEstate10K 0.2273 (both for VIPE re-estimated poses), OmniWorld-Game 1.75, Sekai
real-walking 0.0086, Sekai game-walking 0.0107, game roaming 1.

Not stated (jaxwm defaults or choices): optimizer, learning rate, warmup, schedule, batch, steps
(§4.1 refers to "training details of Sec. 2.2", which give none), weight decay, clipping, the EMA's
decay, timestep distribution and shift, text dropout, the MRoPE channels and MLP width, the
multi-step model's sampling steps and shift.
"""

from configs import _smoke as smoke, wan22_ti2v_5b

DATA_DIR = "data/reworld_records"  # the user's ingested folder (python -m jaxwm.data.ingest above)
VAE = "wan2.2:weights/Wan2.2_VAE.pth"
TEXT_ENCODER = "umt5:weights/Wan2.2-TI2V-5B-Diffusers/tokenizer,weights/Wan2.2-TI2V-5B-Diffusers/text_encoder"
HEIGHT, WIDTH = 384, 640  # the 480p stage (ReWorld §4.1); the 720p stage: 704 x 1280
CHUNK = 4  # latent frames per chunk (ReWorld §2.2)
NUM_CHUNKS = 12  # chunks per training window (ReWorld §2.2, App. A.3)
LATENT_FRAMES = 1 + NUM_CHUNKS * CHUNK  # 49: a clean first latent + 12 chunks (ReWorld: 48 = 12 x 4, the first inside)
CLIP_FRAMES = 1 + (LATENT_FRAMES - 1) * 4  # 193 RGB frames (ReWorld: 189)
UE_SCALE_DIVISOR = 100.0  # UE centimetres -> metres, the metric anchor (ReWorld §3.3 Eq. 4, App. A.2)


VARIANTS = ("", "smoke")


def get_config(variant=""):
  """The recipe; ``configs/reworld_5b.py:smoke``: the same code path at CPU size (``configs/_smoke.py``)."""
  if variant not in VARIANTS:
    raise ValueError(f"configs/reworld_5b.py:{variant}: not one of {VARIANTS}")
  c = wan22_ti2v_5b.get_config()  # the 5B shape: 30 blocks of 24 x 128 heads, cross-attention to umT5 text
  c.model.update(dtype="bfloat16", remat="full")  # as the 5B base: bf16 compute, full rematerialisation
  # MRoPE (§2.2 Eq. 1) + Plücker action injection (§2.2), both zero-initialised: the model starts as the backbone.
  c.model.camera.update(
      encoding="mrope", plucker=True, vae_stride=16,
      channels="t_low", mrope_hidden=64,  # not stated; jaxwm defaults
      translation_scale=1.0)  # jaxwm default: MRoPE reads metric translations (ReWorld divides by each window's
  # largest radius, App. A.3, which depends on future frames; docs/design.md §1)
  c.model.attention_impl = "auto"  # dense attention with per-head masks: splash on TPU, cuDNN on GPU
  c.data.update(
      source="records", data_dir=DATA_DIR, vae=VAE, text_encoder=TEXT_ENCODER, latent_stride=16,
      num_frames=LATENT_FRAMES, frame_stride=1,  # 24 fps is set at ingestion (--fps 24)
      batch_size=0, per_device_batch_size=1,  # not stated; one window per chip (64 on a v5p-64)
      palindrome_prob=0.2,  # ReWorld §3.4 (on its two UE sources; here on every clip of data_dir)
      scale_divisor=UE_SCALE_DIVISOR)  # the UE sources' divisor; other sources: the docstring's list
  c.recipe.update(
      chunk_size=CHUNK, layout="teacher_forcing",  # clean keys of earlier chunks (§2.3)
      chunk_drop=dict(enabled=True, keep=5),  # the sink chunk + 5 random survivors per step (§2.3)
      head_windows=dict(enabled=True, window=12,  # local heads see the last w = 12 latent frames (§2.2 Eq. 2)
                        global_fraction=0.25,  # 6 global heads of 24 (§2.2)
                        pool=12),  # a pool of 12 random global sets, the next one every step (§2.2)
      timestep_distribution="uniform", timestep_shift=1.0,  # not stated; jaxwm default
      text_dropout=0.0)  # not stated; jaxwm default
  # The optimizer is not stated (§4.1 points to training details that are not in the text): the tiny model's
  # earlier defaults. lr 1e-3 is far above the other papers' 5B fine-tuning rates (ViewRope 5e-5, LOCI 1e-5):
  # pass --config.optim.lr for a real run. ReWorld samples from an EMA of the weights (§4.1; decay not stated).
  c.optim.update(lr=1e-3, warmup_steps=50, end_lr_ratio=0.1, weight_decay=0.01, b1=0.9, b2=0.99, eps=1e-8,
                 grad_clip=1.0, ema_decay=0.999)  # not stated; jaxwm defaults
  c.mesh.update(data=1, fsdp=-1)  # v5p-64 (64 chips, v5p:4x4x4): parameters and batch FSDP over every chip
  c.train.update(
      num_steps=4000,  # not stated; jaxwm default
      sample_every=0, gain_every=0,  # off: jaxwm's periodic sample and memory-gain probe render procedural scenes
      workdir="runs/reworld_5b", init_from="")
  c.sample.update(
      guidance=1.0,  # CFG scale 1 (§4.1, the deployed model)
      num_steps=10, shift=3.0)  # not stated for the multi-step model; jaxwm defaults (the distilled student: 4)
  return smoke.shrink(c, "reworld_5b") if variant == "smoke" else c
