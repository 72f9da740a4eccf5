"""The ``sample`` block: the Euler schedule of sampling (training's samples, ``sample.py``, the benchmarks)."""

import dataclasses

from jaxwm.settings import Block, Float, Int, setting


@dataclasses.dataclass(frozen=True)
class SampleConfig(Block):
  """The ``sample`` block (a resume may change any key).

  Attributes:
    num_steps: Euler steps per chunk. 4: 0.2 dB below 10 at the return pose, 0.2-0.3 dB above on the frames in
      between (RESULTS.md).
    shift: the schedule's shift (``jaxwm.diffusion.flow.sampling_schedule``).
    guidance: classifier-free guidance scale (text models; 1: none).
    noise_scale: each chunk's starting noise is ``noise_scale * N(0, I)`` (1: the flow's prior). A distilled
      student sets it to the scale it was trained with (``distill.noise_scale``).
  """
  PREFIX = "sample"
  num_steps: int = setting(4, Int(lo=1), resume="free")
  shift: float = setting(3.0, Float(gt=0), resume="free")
  guidance: float = setting(1.0, Float(), resume="free")
  noise_scale: float = setting(1.0, Float(gt=0), resume="free")


def sample_of(block):
  """A :class:`SampleConfig` from a ``sample`` block (a saved config's missing keys read as they meant then)."""
  return block if isinstance(block, SampleConfig) else SampleConfig.from_dict(block, legacy=True)
