"""Streaming generation against a KV cache (docs/design.md §2)."""

from jaxwm.models.cache import KVCache
from jaxwm.models.conditioning import Cameras
from jaxwm.sampling.streaming import StreamingSampler
