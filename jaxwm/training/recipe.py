"""The ``recipe`` block: how a training sequence is laid out and noised (docs/design.md §2, §5, §9).

Every key may change on resume (logged), except ``head_windows.enabled`` and, while windows are on,
``head_windows.pool`` (they shape the train state's routing table).
"""

import dataclasses

from jaxwm.diffusion.flow import TIMESTEP_DISTRIBUTIONS
from jaxwm.settings import Block, Bool, Choice, Float, Int, setting
from jaxwm.training.layout import LAYOUTS


@dataclasses.dataclass(frozen=True)
class ChunkDropConfig(Block):
  """ReWorld's chunk drop (§2.3): each noisy chunk keeps the sink and ``keep`` random past chunks.

  Attributes:
    enabled: turn it on.
    keep: past chunks kept besides the sink.
  """
  PREFIX = "recipe.chunk_drop"
  enabled: bool = setting(False, Bool())
  keep: int = setting(5, Int(lo=0))


@dataclasses.dataclass(frozen=True)
class HeadWindowsConfig(Block):
  """ReWorld's head windows (§2.2): a routed ``global_fraction`` of heads sees the whole history, the rest the
  last ``window`` frames; the routing is drawn from a pool of ``pool`` patterns.

  Attributes:
    enabled: turn them on (shapes the train state: refused on resume).
    window: frames the local heads see.
    global_fraction: fraction of heads with the whole history.
    pool: routing patterns drawn per step (refused on resume while enabled).
  """
  PREFIX = "recipe.head_windows"
  enabled: bool = setting(False, Bool(), resume="refused")
  window: int = setting(12, Int(lo=1))
  global_fraction: float = setting(0.25, Float(gt=0, le=1))
  pool: int = setting(12, Int(lo=1))


@dataclasses.dataclass(frozen=True)
class RecipeConfig(Block):
  """The ``recipe`` block.

  Attributes:
    chunk_size: latent frames generated per step of the stream (frame 0 alone, then chunks of this size).
    timestep_distribution: training times (:data:`jaxwm.diffusion.flow.TIMESTEP_DISTRIBUTIONS`); logit-normal:
      +1.0 dB co-visible, +1.0 dB return PSNR over uniform in the same 720 steps (RESULTS.md).
    timestep_shift: the shift applied to training times.
    layout: :data:`jaxwm.training.layout.LAYOUTS`. Diffusion forcing (since 2026-12-02): 9-frame sequences
      instead of teacher forcing's 15, so a WorldRoPE step costs 0.9 s instead of 2.4 (RESULTS.md).
    text_dropout: probability of the empty prompt per clip (classifier-free guidance; LOCI: 0.1).
    chunk_drop: :class:`ChunkDropConfig`.
    head_windows: :class:`HeadWindowsConfig`.
  """
  PREFIX = "recipe"
  chunk_size: int = setting(2, Int(lo=1))
  timestep_distribution: str = setting("logit_normal", Choice(TIMESTEP_DISTRIBUTIONS), absent="uniform")
  timestep_shift: float = setting(1.0, Float(gt=0))
  layout: str = setting("diffusion_forcing", Choice(LAYOUTS), absent="teacher_forcing")
  text_dropout: float = setting(0.0, Float(ge=0, lt=1))
  chunk_drop: ChunkDropConfig = setting(ChunkDropConfig())
  head_windows: HeadWindowsConfig = setting(HeadWindowsConfig())


def recipe_of(recipe):
  """A :class:`RecipeConfig` from a block (a saved config's missing keys read as they meant then)."""
  return recipe if isinstance(recipe, RecipeConfig) else RecipeConfig.from_dict(recipe, legacy=True)
