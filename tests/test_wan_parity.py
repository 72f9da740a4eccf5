"""Parity of jaxwm's WanModel with diffusers' WanTransformer3DModel (PyTorch, CPU, float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from jaxwm.convert import diffusers_to_jaxwm, jaxwm_to_diffusers, original_wan_to_diffusers_keys  # noqa: E402
from jaxwm.models.config import ModelConfig  # noqa: E402
from jaxwm.models.transformer import WanModel  # noqa: E402

CFG = ModelConfig(dim=48, num_heads=2, num_layers=2, ffn_dim=64, in_channels=4, out_channels=4, patch_size=(1, 2, 2),
                  text_dim=16, freq_dim=32, cross_attn=True, cross_attn_norm=True)
SHAPE = (2, 3, 4, 6)  # B, F, H, W (latent)
# Beyond the project's own configuration: no norm before cross-attention (diffusers: identity), a patch with every
# axis > 1, one timestep per sample.
VARIANTS = {
    "norm_patch122_per_token": (CFG, SHAPE, "token"),
    "no_norm_patch222_per_sample": (ModelConfig(dim=48, num_heads=2, num_layers=2, ffn_dim=64, in_channels=4,
                                                out_channels=4, patch_size=(2, 2, 2), text_dim=16, freq_dim=32,
                                                cross_attn=True, cross_attn_norm=False), (2, 4, 4, 6), "sample"),
}


def _torch_model(cfg=CFG):
  torch.manual_seed(0)
  m = diffusers.WanTransformer3DModel(patch_size=cfg.patch_size, num_attention_heads=cfg.num_heads,
                                      attention_head_dim=cfg.head_dim, in_channels=cfg.in_channels,
                                      out_channels=cfg.out_channels, text_dim=cfg.text_dim, freq_dim=cfg.freq_dim,
                                      ffn_dim=cfg.ffn_dim, num_layers=cfg.num_layers,
                                      cross_attn_norm=cfg.cross_attn_norm,
                                      qk_norm="rms_norm_across_heads", eps=cfg.eps, rope_max_seq_len=64).float()
  with torch.no_grad():  # make every parameter non-trivial (norm scales start at 1, some biases at 0)
    for p in m.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return m


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
  return VARIANTS[request.param]


@pytest.fixture(scope="module")
def models(variant):
  cfg, shape, per = variant
  tm = _torch_model(cfg)
  variables = jax.tree_util.tree_map(jnp.asarray, diffusers_to_jaxwm(tm.state_dict(), cfg))
  rng = np.random.default_rng(0)
  b, f, h, w = shape
  pt, ph, pw = cfg.patch_size
  n_tok = (f // pt) * (h // ph) * (w // pw)
  inputs = {
      "cfg": cfg,
      "x": rng.normal(size=(b, f, h, w, cfg.in_channels)).astype(np.float32),
      "t": rng.uniform(0, 1000, size=(b, n_tok) if per == "token" else (b,)).astype(np.float32),
      "ctx": rng.normal(size=(b, 5, cfg.text_dim)).astype(np.float32),
      "r": rng.normal(size=(b, f, h, w, cfg.out_channels)).astype(np.float32),
  }
  return tm, variables, inputs


def _torch_forward(tm, inp, requires_grad=False):
  x = torch.tensor(inp["x"]).permute(0, 4, 1, 2, 3).contiguous().requires_grad_(requires_grad)
  out = tm(hidden_states=x, timestep=torch.tensor(inp["t"]), encoder_hidden_states=torch.tensor(inp["ctx"]),
           return_dict=False)[0]
  return x, out.permute(0, 2, 3, 4, 1)


def _jax_forward(variables, inp, x=None):
  cfg, t = inp["cfg"], inp["t"]
  x = inp["x"] if x is None else x
  if t.ndim == 1:  # one timestep per sample: jaxwm takes per-frame (or per-token) timesteps
    t = np.repeat(t[:, None], x.shape[1] // cfg.patch_size[0], axis=1)
  out, _ = WanModel(cfg).apply(variables, x, t, context=inp["ctx"])
  return out


def _rel(a, b):
  return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-30))


def test_mapping_covers_every_parameter(models):
  tm, variables, inp = models
  cfg = inp["cfg"]
  t = inp["t"] if inp["t"].ndim == 2 else np.repeat(inp["t"][:, None], inp["x"].shape[1] // cfg.patch_size[0], 1)
  init = jax.eval_shape(WanModel(cfg).init, jax.random.key(0), inp["x"], t, context=inp["ctx"])
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  assert jax.tree_util.tree_structure(nn.unbox(init)) == jax.tree_util.tree_structure(variables)
  shapes = jax.tree_util.tree_map(lambda a: a.shape, nn.unbox(init))
  assert shapes == jax.tree_util.tree_map(lambda a: a.shape, variables)
  back = jaxwm_to_diffusers(variables, cfg)
  sd = tm.state_dict()
  assert set(back) == set(sd)
  for k, v in sd.items():
    np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
  with pytest.raises(KeyError, match="no jaxwm parameter uses"):
    diffusers_to_jaxwm({**sd, "extra.weight": torch.zeros(1)}, cfg)
  with pytest.raises(KeyError, match="lacks"):
    diffusers_to_jaxwm({k: v for k, v in sd.items() if "attn2.norm_k" not in k}, cfg)


def test_forward_parity(models):
  tm, variables, inp = models
  with torch.no_grad():
    _, ref = _torch_forward(tm, inp)
  out = _jax_forward(variables, inp)
  assert out.shape == ref.shape
  assert _rel(out, ref.numpy()) <= 1e-5


def test_gradient_parity(models):
  tm, variables, inp = models
  tm.zero_grad()
  x, out = _torch_forward(tm, inp, requires_grad=True)
  (out * torch.tensor(inp["r"])).sum().backward()
  torch_grads = {k: p.grad.numpy() for k, p in tm.named_parameters()}

  def loss(v, xx):
    return jnp.sum(_jax_forward(v, inp, xx) * inp["r"])

  gv, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, jnp.asarray(inp["x"]))
  assert _rel(gx, x.grad.permute(0, 2, 3, 4, 1).numpy()) <= 1e-4
  mapped = jaxwm_to_diffusers(jax.tree_util.tree_map(np.asarray, gv), inp["cfg"])
  assert set(mapped) == set(torch_grads)
  worst = max((_rel(mapped[k], torch_grads[k]), k) for k in torch_grads)
  assert worst[0] <= 1e-4, worst


ORIGINAL_KEYS = (
    ["patch_embedding.weight", "patch_embedding.bias", "head.head.weight", "head.head.bias", "head.modulation"]
    + [f"{m}.{i}.{p}" for m, idx in [("text_embedding", (0, 2)), ("time_embedding", (0, 2)), ("time_projection", (1,))]
       for i in idx for p in ("weight", "bias")]
    + [f"blocks.{b}.{k}" for b in range(CFG.num_layers) for k in
       ["modulation", "norm3.weight", "norm3.bias", "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias"]
       + [f"{a}.{p}.{w}" for a in ("self_attn", "cross_attn") for p in "qkvo" for w in ("weight", "bias")]
       + [f"{a}.{n}.weight" for a in ("self_attn", "cross_attn") for n in ("norm_q", "norm_k")]])


def test_original_wan_names(models):
  tm, _, inp = models
  if inp["cfg"] is not CFG:
    pytest.skip("original key names: checked on the default variant")
  from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers  # pylint: disable=g-import-not-at-top
  ours = original_wan_to_diffusers_keys({k: k for k in ORIGINAL_KEYS})
  theirs = convert_wan_transformer_to_diffusers({k: k for k in ORIGINAL_KEYS})
  assert {v: k for k, v in ours.items()} == {v: k for k, v in theirs.items()}
  assert set(ours) == set(tm.state_dict())


def test_load_safetensors_into_shards(models, tmp_path):
  """diffusers weights on disk (original Wan names too) load straight into FSDP-sharded arrays."""
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top

  from jaxwm.convert import load_wan_safetensors  # pylint: disable=g-import-not-at-top
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  tm, variables, inp = models
  if inp["cfg"] is not CFG:
    pytest.skip("file naming and sharded loading: checked on the default variant")
  if inp["cfg"] is not CFG:
    pytest.skip("file naming and sharded loading: checked on the default variant")
  sd = {k: v.contiguous() for k, v in tm.state_dict().items()}
  names = list(sd)
  save_file({k: sd[k] for k in names[: len(names) // 2]}, str(tmp_path / "a.safetensors"))
  save_file({k: sd[k] for k in names[len(names) // 2:]}, str(tmp_path / "b.safetensors"))
  mesh = sh.make_mesh(2, 4)
  abstract = jax.eval_shape(WanModel(CFG).init, jax.random.key(0), inp["x"], inp["t"], context=inp["ctx"])
  shardings = sh.param_shardings(abstract, mesh, sh.DEFAULT_RULES)
  loaded = load_wan_safetensors([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], CFG,
                                abstract_params=nn.unbox(abstract), shardings=shardings)
  for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  kernel = loaded["params"]["blocks"]["attn1"]["to_q"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)
  assert len(kernel.addressable_shards) == 8
  # Original Wan key names are detected and renamed.
  inverse = original_wan_to_diffusers_keys({k: k for k in ORIGINAL_KEYS})  # diffusers key -> original key
  save_file({inverse[k]: v for k, v in sd.items()}, str(tmp_path / "orig.safetensors"))
  loaded2 = load_wan_safetensors(tmp_path / "orig.safetensors", CFG)
  for a, b in zip(jax.tree_util.tree_leaves(loaded2), jax.tree_util.tree_leaves(variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fine_tuning_starts_from_wan_weights(models, tmp_path):
  """train.init_from=<diffusers safetensors>: every backbone parameter from the file, the additions (Plücker,
  LOCI memory) at their own initialisation; LOCI's grouped layer stacks split from the file's one stack."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top

  from jaxwm.convert.wan import pretrained_params  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import CameraConfig, LociConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.init import init_params  # pylint: disable=g-import-not-at-top
  tm, variables, inp = models
  if inp["cfg"] is not CFG:
    pytest.skip("checked on the default variant")
  save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, str(tmp_path / "w.safetensors"))
  cfg = dataclasses.replace(CFG, dim=128, num_heads=2, camera=CameraConfig(encoding="viewrope", plucker=True),
                            loci=LociConfig(enabled=True, blocks=(1,), chunk_size=16))
  with pytest.raises(ValueError, match="has shape"):  # a wider model than the file's
    fresh = nn.unbox(init_params(WanModel(cfg), jax.random.key(0), (1, 2, 4, 6, 4), 32))
    pretrained_params(tmp_path / "w.safetensors", cfg, fresh)
  cfg = dataclasses.replace(cfg, dim=CFG.dim, num_heads=CFG.num_heads, camera=CameraConfig(plucker=True))
  fresh = nn.unbox(init_params(WanModel(cfg), jax.random.key(0), (1, 2, 4, 6, 4), 32))
  params, loaded, kept = pretrained_params(tmp_path, cfg, fresh)  # a directory of safetensors
  want = variables["params"]
  assert params["patch_embedding"]["kernel"].shape == want["patch_embedding"]["kernel"].shape
  np.testing.assert_array_equal(params["patch_embedding"]["kernel"], want["patch_embedding"]["kernel"])
  for name, lo, hi in (("blocks_0_1", 0, 1), ("blocks_1_2", 1, 2)):
    np.testing.assert_array_equal(params[name]["attn1"]["to_q"]["kernel"], want["blocks"]["attn1"]["to_q"]["kernel"][lo:hi])
  assert any("plucker" in k for k in kept) and any("memory" in k for k in kept)
  assert not any("memory" in k or "plucker" in k for k in loaded)
  np.testing.assert_array_equal(params["blocks_1_2"]["memory"]["mem_q"]["kernel"],
                                fresh["blocks_1_2"]["memory"]["mem_q"]["kernel"])
