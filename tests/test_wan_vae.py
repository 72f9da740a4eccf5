"""Parity of jaxwm's WanVAE (Wan2.1 and Wan2.2 structures) with diffusers' AutoencoderKLWan (PyTorch, CPU,
float32): encode/decode, weight conversion both ways, original Wan names, chunked streaming, normalisation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from jaxwm.convert.wan_vae import (diffusers_to_jaxwm, jaxwm_to_diffusers, load_wan_vae_safetensors,  # noqa: E402
                                   original_wan_vae_to_diffusers_keys, parameter_mapping)
from jaxwm.models.wan_vae import StreamState, WanVAE, WanVAEConfig, denormalize, normalize  # noqa: E402
from jaxwm.models.wan_vae_blocks import decoder_plan, encoder_plan  # noqa: E402

VARIANTS = {
    "wan21": WanVAEConfig.tiny_wan21(),
    "wan22": WanVAEConfig.tiny_wan22(),
}
SIZE, FRAMES = 32, 9


def _rel(a, b):
  return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _torch_vae(cfg):
  torch.manual_seed(0)
  m = diffusers.AutoencoderKLWan(**cfg.to_diffusers()).float().eval()
  with torch.no_grad():  # make every parameter non-trivial (norm gains start at 1)
    for p in m.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return m


def _cl(t):  # torch [B, C, T, H, W] -> numpy channels-last
  return t.permute(0, 2, 3, 4, 1).numpy()


@pytest.fixture(scope="module", params=list(VARIANTS))
def setup(request):
  cfg = VARIANTS[request.param]
  tm = _torch_vae(cfg)
  video = np.random.default_rng(0).uniform(-1, 1, (1, FRAMES, SIZE, SIZE, 3)).astype(np.float32)
  with torch.no_grad():
    post = tm.encode(torch.tensor(video).permute(0, 4, 1, 2, 3)).latent_dist
    decoded = tm.decode(post.mean).sample
  ref = {"mean": _cl(post.mean), "logvar": _cl(post.logvar), "decoded": _cl(decoded)}
  variables = jax.tree_util.tree_map(jnp.asarray, diffusers_to_jaxwm(tm.state_dict(), cfg))
  return cfg, tm, variables, video, ref


def _jit(vae, method):
  return jax.jit(functools.partial(vae.apply, method=method))


def test_encode_decode_match_diffusers(setup):
  cfg, _, variables, video, ref = setup
  vae = WanVAE(cfg)
  mean, logvar = _jit(vae, WanVAE.encode)(variables, video)
  s = cfg.scale_factor_spatial
  assert mean.shape == (1, 1 + (FRAMES - 1) // 4, SIZE // s, SIZE // s, cfg.z_dim) == logvar.shape
  assert _rel(mean, ref["mean"]) < 1e-4 and _rel(logvar, ref["logvar"]) < 1e-4
  decoded = _jit(vae, WanVAE.decode)(variables, ref["mean"])
  assert decoded.shape == video.shape
  assert _rel(decoded, ref["decoded"]) < 1e-4
  assert (np.abs(ref["decoded"]) < 1).mean() > 0.3  # not a comparison of clipped values only


def test_conversion_covers_every_parameter_both_ways(setup):
  cfg, tm, variables, _, _ = setup
  sd = {k: v.numpy() for k, v in tm.state_dict().items()}
  table = parameter_mapping(cfg)
  assert len({key for _, key, _ in table}) == len(table) and {key for _, key, _ in table} == set(sd)
  abstract = jax.eval_shape(WanVAE(cfg).init, jax.random.key(0), jnp.zeros((1, 1, SIZE, SIZE, 3)))
  paths = {tuple(k.key for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract["params"])[0]}
  assert {path for path, _, _ in table} == paths
  assert jax.tree_util.tree_map(lambda a: a.shape, abstract) == jax.tree_util.tree_map(lambda a: a.shape, variables)
  back = jaxwm_to_diffusers(variables, cfg)
  assert set(back) == set(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
  with pytest.raises(KeyError, match="no Wan VAE parameter uses"):
    diffusers_to_jaxwm({**sd, "extra.weight": np.zeros(1)}, cfg)
  with pytest.raises(KeyError, match="lacks 1 key"):
    diffusers_to_jaxwm({k: v for k, v in sd.items() if k != "decoder.conv_out.bias"}, cfg)


def test_chunked_decoding_equals_whole_clip(setup):
  cfg, _, variables, _, ref = setup
  vae = WanVAE(cfg)
  whole = _jit(vae, WanVAE.decode)(variables, ref["mean"])
  step = _jit(vae, WanVAE.decode_step)
  h, w = ref["mean"].shape[2:4]
  for chunks in ((1, 2), (2, 1)):
    state = vae.decode_init(1, h, w)
    shapes = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), state.layers)
    outs, start = [], 0
    for n in chunks:
      state, rgb = step(variables, state, ref["mean"][:, start:start + n])
      assert isinstance(state, StreamState) and state.started
      assert jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), state.layers) == shapes  # constant memory
      outs.append(rgb)
      start += n
    assert [o.shape[1] for o in outs] == [4 * chunks[0] - 3, 4 * chunks[1]]
    np.testing.assert_allclose(np.concatenate(outs, 1), whole, atol=1e-5 * float(np.abs(whole).max()))


def test_chunked_encoding_equals_whole_clip(setup):
  cfg, _, variables, video, ref = setup
  vae = WanVAE(cfg)
  step = _jit(vae, WanVAE.encode_step)
  state, means = vae.encode_init(1, SIZE, SIZE), []
  for a, b in ((0, 1), (1, 5), (5, 9)):
    state, (m, _) = step(variables, state, video[:, a:b])
    means.append(m)
  assert _rel(np.concatenate(means, 1), ref["mean"]) < 1e-4
  with pytest.raises(ValueError, match="1 \\+ 4k frames"):
    vae.apply(variables, vae.encode_init(1, SIZE, SIZE), video[:, :2], method=WanVAE.encode_step)


def test_normalisation_round_trip(setup):
  cfg, _, _, _, ref = setup
  z = ref["mean"]
  mean, std = np.asarray(cfg.latents_mean), np.asarray(cfg.latents_std)
  np.testing.assert_allclose(normalize(z, cfg), (z - mean) / std, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(denormalize(normalize(z, cfg), cfg), z, rtol=1e-5, atol=1e-5)
  vae = WanVAE(cfg)
  np.testing.assert_allclose(vae.denormalize(vae.normalize(z)), z, rtol=1e-5, atol=1e-5)


def _original_keys(cfg):
  """The parameter names of the original Wan VAE modules (``wan/modules/vae.py``, ``vae2_2.py``) for ``cfg``."""

  def res(prefix, cin, cout):
    out = [f"{prefix}.residual.0.gamma", f"{prefix}.residual.3.gamma"]
    out += [f"{prefix}.residual.{i}.{p}" for i in (2, 6) for p in ("weight", "bias")]
    return out + ([f"{prefix}.shortcut.{p}" for p in ("weight", "bias")] if cin != cout else [])

  def resample(prefix, mode):
    return [f"{prefix}.{m}.{p}" for m in ("resample.1",) + (("time_conv",) if mode.endswith("3d") else ())
            for p in ("weight", "bias")]

  def middle(prefix):
    attn = [f"{prefix}.1.norm.gamma"] + [f"{prefix}.1.{m}.{p}" for m in ("to_qkv", "proj") for p in ("weight", "bias")]
    return res(f"{prefix}.0", 1, 1) + attn + res(f"{prefix}.2", 1, 1)

  keys = [f"{m}.{p}" for m in ("conv1", "conv2", "encoder.conv1", "decoder.conv1", "encoder.head.2", "decoder.head.2")
          for p in ("weight", "bias")]
  keys += ["encoder.head.0.gamma", "decoder.head.0.gamma", *middle("encoder.middle"), *middle("decoder.middle")]
  flat = 0
  for i, s in enumerate(encoder_plan(cfg)):
    if cfg.is_residual:
      cin = s.in_dim
      for j in range(s.num_res):
        keys += res(f"encoder.downsamples.{i}.downsamples.{j}", cin, s.out_dim)
        cin = s.out_dim
      keys += resample(f"encoder.downsamples.{i}.downsamples.{s.num_res}", s.mode) if s.mode else []
    else:
      keys += res(f"encoder.downsamples.{i}", s.in_dim, s.out_dim) if s.kind == "res" else []
      keys += resample(f"encoder.downsamples.{i}", s.mode) if s.kind == "resample" else []
  for i, s in enumerate(decoder_plan(cfg)):
    cin = s.in_dim
    for j in range(s.num_res):
      keys += res(f"decoder.upsamples.{i}.upsamples.{j}" if cfg.is_residual else f"decoder.upsamples.{flat}", cin,
                  s.out_dim)
      cin, flat = s.out_dim, flat + 1
    if s.mode:
      keys += resample(f"decoder.upsamples.{i}.upsamples.{s.num_res}" if cfg.is_residual else
                       f"decoder.upsamples.{flat}", s.mode)
      flat += 1
  return keys


def test_original_wan_names_and_loading(setup, tmp_path):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  cfg, tm, variables, _, _ = setup
  sd = {k: v.numpy() for k, v in tm.state_dict().items()}
  renamed = original_wan_vae_to_diffusers_keys({k: k for k in _original_keys(cfg)}, cfg)
  assert len(renamed) == len(_original_keys(cfg)) and set(renamed) == set(sd)
  save_file({orig: sd[new] for new, orig in renamed.items()}, str(tmp_path / "original.safetensors"))
  save_file(sd, str(tmp_path / "diffusers.safetensors"))
  abstract = jax.eval_shape(lambda: variables)
  shardings = jax.tree_util.tree_map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), abstract)
  for name in ("original", "diffusers"):
    loaded = load_wan_vae_safetensors(tmp_path / f"{name}.safetensors", cfg, abstract, shardings)
    assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, loaded, variables)))


def test_a_diffusers_folder_of_any_size_loads_by_name(setup, tmp_path):
  """``wan2.x:<folder>`` (``--vae``, ``data.vae``) reads the folder's config.json: a size other than the release's
  loads and encodes as diffusers does; the wrong version's name is refused in one line."""
  from jaxwm.encoders import autoencoder_strides, make_autoencoder  # pylint: disable=g-import-not-at-top
  cfg, tm, _, video, ref = setup
  tm.save_pretrained(tmp_path / "vae")
  kind, other = ("wan2.2", "wan2.1") if cfg.patch_size else ("wan2.1", "wan2.2")
  name = f"{kind}:{tmp_path / 'vae'}"
  assert autoencoder_strides(name) == (cfg.scale_factor_spatial, cfg.scale_factor_temporal)
  ae = make_autoencoder(name)
  assert (ae.spatial_stride, ae.temporal_stride, ae.channels) == (cfg.scale_factor_spatial, cfg.scale_factor_temporal,
                                                                  cfg.z_dim)
  want = np.asarray(normalize(jnp.asarray(ref["mean"]), cfg))
  got = np.asarray(ae.encode(jnp.asarray(video)))
  assert _rel(got, want) < 1e-4
  with pytest.raises(ValueError, match=f"describes a {kind} VAE.*name it {kind}:"):
    make_autoencoder(f"{other}:{tmp_path / 'vae'}")


def test_bad_config_raises_one_line_value_errors():
  with pytest.raises(ValueError, match="temperal_downsample=.*needs len\\(dim_mult\\) - 1 = 3"):
    WanVAEConfig(temperal_downsample=(True,))
  with pytest.raises(ValueError, match="latents_mean has 16 entries: needs z_dim = 4"):
    WanVAEConfig(z_dim=4)
  with pytest.raises(ValueError, match="scale_factor_spatial=8: .* compresses space by 16"):
    WanVAEConfig.wan22().__class__(**{**WanVAEConfig.wan22().__dict__, "scale_factor_spatial": 8})
  with pytest.raises(ValueError, match="attn_scales=\\(0.5,\\): only \\(\\) is supported"):
    WanVAEConfig(attn_scales=(0.5,))
  with pytest.raises(ValueError, match="unknown key"):
    WanVAEConfig.from_diffusers({"_class_name": "AutoencoderKLWan", "base_dim": 96, "bogus": 1})
  assert WanVAEConfig.from_diffusers({**WanVAEConfig.wan22().to_diffusers(), "_diffusers_version": "0.35",
                                      "clip_output": False}) == WanVAEConfig.wan22()
