"""Weight conversion from PyTorch checkpoints (diffusers and original Wan key names)."""

from jaxwm.convert.wan import (diffusers_to_jaxwm, jaxwm_to_diffusers, load_wan_safetensors,
                               original_wan_to_diffusers_keys, parameter_mapping)
from jaxwm.convert.wan_vae import load_wan_vae_safetensors, original_wan_vae_to_diffusers_keys
