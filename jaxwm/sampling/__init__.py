"""Streaming generation against a KV cache (DESIGN §2)."""

from jaxwm.sampling.streaming import KVCache, StreamingSampler
