"""The config blocks by key: each a :class:`jaxwm.settings.Block` dataclass living next to the code that uses it.
A new block is its dataclass in its owner's module and one line here."""

from jaxwm.data.sources import DataConfig
from jaxwm.sampling.settings import SampleConfig
from jaxwm.training.optim import OptimConfig
from jaxwm.training.recipe import RecipeConfig
from jaxwm.training.runner import TrainConfig
from jaxwm.training.sharding import MeshConfig

BLOCKS = {b.PREFIX: b for b in (OptimConfig, TrainConfig, RecipeConfig, DataConfig, SampleConfig, MeshConfig)}
