"""Parameter initialisation of a :class:`jaxwm.models.transformer.WanModel` from shapes alone.

Used by training (the real init, sharded by ``jit``) and by loading (``jax.eval_shape`` gives the
abstract tree that a checkpoint is restored into), so both agree on the parameter tree.
"""

import jax.numpy as jnp
import numpy as np

from jaxwm.models.conditioning import Cameras, Frames
from jaxwm.models.loci import MemoryPlan


def init_frames(latent_shape, image_size):
  """:class:`Frames` for shape-only initialisation: identity poses, a centred pinhole of
  ``image_size`` pixels, dense masks, each frame its own chunk."""
  b, s = latent_shape[:2]
  return Frames.sequence(b, s, cameras=Cameras.identity(b, s, float(image_size), image_size / 2),
                         mask=jnp.ones((b, s, s), bool), local=jnp.arange(s, dtype=jnp.int32)[None, :, None],
                         plan=MemoryPlan.make(np.arange(s), np.ones(s, bool)))


def init_params(model, key, latent_shape, image_size):
  """Boxed (logically partitioned) parameters of ``model`` for inputs ``latent_shape = [B, S, h, w, C]``.

  Parameters do not depend on ``S``, ``h``, ``w`` beyond the patch grid being whole, so any small
  shape of the right channel count gives the same tree.
  """
  context = jnp.zeros((latent_shape[0], 1, model.cfg.text_dim)) if model.cfg.cross_attn else None
  variables = model.init(key, jnp.zeros(latent_shape, jnp.float32), jnp.zeros(latent_shape[:2], jnp.float32),
                         init_frames(latent_shape, image_size), context=context)
  return variables["params"]
