"""The default tiny model on the built-in procedural scenes (trains on a 2-core CPU).

  python train.py --config configs/tiny.py --config.optim.lr=3e-4
"""

import ml_collections

from jaxwm.blocks import BLOCKS
from jaxwm.models.config import default_config_dict
from jaxwm.settings import defaults
from jaxwm.training.sharding import DEFAULT_RULES


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Model: the defaults of jaxwm.models.config (ModelConfig, CameraConfig, AttentionConfig and LociConfig document
  # every option and its valid values), then only the tiny model's overrides.
  # Rendered at 64x64, trained at 32x32; latents by space-to-depth (stride 4): 8x8x48; patch 1: 64 tokens per frame
  # of 4x4 pixels (48 values). Patch 2 (16 tokens of 8x8 pixels, 192 values; the default until 2026-12-02) learns
  # about ten times slower per step and cannot place detail inside a token; patch 1 costs 7.5x per step and still
  # wins in the same 20 minutes (RESULTS.md, "Do the models see?").
  c.model = ml_collections.ConfigDict(default_config_dict())
  c.model.update(dim=192, ffn_dim=384, patch_size=(1, 1, 1))
  # WorldRoPE on every h/w channel (docs/design.md §4): each key's spatial RoPE phase sits where its depth hypotheses
  # land in the query's view, so attention finds what is still in sight. Co-visible PSNR 26.9 dB against ViewRope's
  # 22.2 in the same 720 steps (RESULTS.md, "Do the models see?"); ViewRope was the default until 2026-12-02.
  c.model.camera.encoding = "worldrope"
  c.model.camera.channels = "hw"
  c.model.loci.blocks = (1, 3)  # hybrid blocks when model.loci.enabled (docs/design.md §7)
  # Every other block: the defaults of its dataclass (jaxwm.blocks.BLOCKS: OptimConfig, TrainConfig,
  # RecipeConfig, DataConfig, SampleConfig, MeshConfig document every key, its valid values and whether a resume
  # may change it); the default model is trained with them as they are.
  for prefix, block in BLOCKS.items():
    c[prefix] = ml_collections.ConfigDict(defaults(block))
  c.sharding_rules = [list(r) for r in DEFAULT_RULES]
  return c
