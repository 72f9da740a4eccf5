"""``jaxwm-parity`` on random small checkpoints written in the release layouts: it passes on the real conversions
(both layouts, float32 and bfloat16, sharded with an index JSON, .pth files) and fails, naming the tensors, on a
deliberately wrong one (a transposed kernel, a dropped norm)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from jaxwm.cli.parity import main  # noqa: E402
from jaxwm.convert import wan as wan_convert  # noqa: E402
from jaxwm.convert.umt5 import original_wan_t5_key  # noqa: E402

LAYERS = 2


def _nontrivial(m):
  torch.manual_seed(0)
  with torch.no_grad():  # norm scales start at 1, biases at 0: make every parameter matter
    for p in m.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return m


def _original_transformer_keys(n):
  """The authors' key names of a ``n``-layer WanModel."""
  keys = ["patch_embedding.weight", "patch_embedding.bias", "head.head.weight", "head.head.bias", "head.modulation"]
  keys += [f"{m}.{i}.{p}" for m, idx in [("text_embedding", (0, 2)), ("time_embedding", (0, 2)),
                                          ("time_projection", (1,))] for i in idx for p in ("weight", "bias")]
  for b in range(n):
    keys += [f"blocks.{b}.{k}" for k in ["modulation", "norm3.weight", "norm3.bias", "ffn.0.weight", "ffn.0.bias",
                                         "ffn.2.weight", "ffn.2.bias"]]
    keys += [f"blocks.{b}.{a}.{p}.{w}" for a in ("self_attn", "cross_attn") for p in "qkvo" for w in ("weight", "bias")]
    keys += [f"blocks.{b}.{a}.{n_}.weight" for a in ("self_attn", "cross_attn") for n_ in ("norm_q", "norm_k")]
  return keys


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  """Random small weights in both layouts: diffusers folders (float32) and the authors' (bfloat16 shards with an
  index JSON, .pth files)."""
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("release")
  tm = _nontrivial(diffusers.WanTransformer3DModel(
      patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4, out_channels=4, text_dim=16,
      freq_dim=32, ffn_dim=64, num_layers=LAYERS, rope_max_seq_len=64))
  tm.save_pretrained(root / "diffusers" / "transformer")
  authors = root / "authors"
  authors.mkdir()
  inverse = wan_convert.original_wan_to_diffusers_keys({k: k for k in _original_transformer_keys(LAYERS)})
  sd = {inverse[k]: v.to(torch.bfloat16).contiguous() for k, v in tm.state_dict().items()}
  names = sorted(sd)
  shards = {"diffusion_pytorch_model-00001-of-00002.safetensors": names[::2],
            "diffusion_pytorch_model-00002-of-00002.safetensors": names[1::2]}
  for f, ks in shards.items():
    save_file({k: sd[k] for k in ks}, str(authors / f))
  (authors / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}))
  (authors / "config.json").write_text(json.dumps(
      {"_class_name": "WanModel", "model_type": "ti2v", "dim": 48, "ffn_dim": 64, "freq_dim": 32, "in_dim": 4,
       "out_dim": 4, "num_heads": 2, "num_layers": LAYERS, "text_len": 8, "text_dim": 16, "eps": 1e-6}))

  hf = transformers.UMT5Config(vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=LAYERS, num_heads=4,
                               relative_attention_num_buckets=16, relative_attention_max_distance=20,
                               feed_forward_proj="gated-gelu", dropout_rate=0.0)
  t5 = _nontrivial(transformers.UMT5EncoderModel(hf))
  t5.save_pretrained(root / "diffusers" / "text_encoder")
  original = [f"blocks.{i}.{k}" for i in range(LAYERS) for k in (
      "norm1.weight", *[f"attn.{p}.weight" for p in "qkvo"], "pos_embedding.embedding.weight", "norm2.weight",
      "ffn.gate.0.weight", "ffn.fc1.weight", "ffn.fc2.weight")] + ["token_embedding.weight", "norm.weight"]
  to_original = {original_wan_t5_key(k): k for k in original}
  t5_sd = t5.state_dict()
  torch.save({o: t5_sd[h].to(torch.bfloat16).clone() for h, o in to_original.items()},
             authors / "models_t5_umt5-enc-bf16.pth")
  (root / "t5_config.json").write_text(hf.to_json_string())

  from jaxwm.models.wan_vae import WanVAEConfig  # pylint: disable=g-import-not-at-top
  vae = _nontrivial(diffusers.AutoencoderKLWan(**WanVAEConfig.tiny_wan22().to_diffusers()))
  vae.save_pretrained(root / "diffusers" / "vae")
  return root


def _row(line):
  """``(section, tensor)`` of a table line (fixed columns)."""
  return line[2:13].strip(), line[13:47].strip()


def _run(capsys, *argv):
  code = main(list(map(str, argv)))
  out = capsys.readouterr()
  return code, out.out, out.err


def test_transformer_diffusers_layout_passes_and_writes_json(release, capsys, tmp_path):
  code, out, _ = _run(capsys, "transformer", release / "diffusers" / "transformer", "--frames", 2, "--height", 4,
                      "--width", 6, "--text-len", 5, "--json", tmp_path / "r.json")
  assert code == 0, out
  report = json.loads((tmp_path / "r.json").read_text())
  names = {r["name"] for r in report["rows"]}
  assert {"patch_embedding", "blocks.0", "blocks.1", "velocity", "d/d latents", "blocks.1.attn1", "proj_out"} <= names
  assert report["passed"] and max(r["rel"] for r in report["rows"]) < 1e-5
  assert out.splitlines()[-1].startswith("PASS")


def test_transformer_authors_layout_bfloat16_passes(release, capsys):
  code, out, _ = _run(capsys, "transformer", release / "authors", "--dtype", "bfloat16", "--height", 4, "--width", 4)
  assert code == 0, out
  assert "torch bf16 rel" in out


WAN_CODE = __import__("os").environ.get("JAXWM_WAN_CODE")  # a checkout of github.com/Wan-Video/Wan2.2


@pytest.mark.skipif(not WAN_CODE, reason="JAXWM_WAN_CODE: a checkout of the authors' Wan2.2 code (not in this repo)")
@pytest.mark.parametrize("layout", ["authors", "diffusers"])
def test_transformer_against_the_authors_model(release, capsys, tmp_path, monkeypatch, layout):
  """The authors' own WanModel as the reference, on either layout's weights: passes; a broken conversion fails."""
  path = release / "authors" if layout == "authors" else release / "diffusers" / "transformer"
  code, out, _ = _run(capsys, "transformer", path, "--height", 4, "--width", 6, "--text-len", 5, "--batch", 2,
                      "--wan-code", WAN_CODE, "--json", tmp_path / "r.json")
  assert code == 0, out
  report = json.loads((tmp_path / "r.json").read_text())
  assert report["meta"]["reference"].startswith("the authors' WanModel")
  assert {"blocks.1", "velocity", "d/d context", "blocks.0.attn2"} <= {r["name"] for r in report["rows"]}
  assert max(r["rel"] for r in report["rows"]) < 1e-5
  if layout == "authors":  # attn1's query kernel left untransposed: the authors' model disagrees, at blocks.0
    real = wan_convert.parameter_mapping

    def wrong(cfg):
      glob, block = real(cfg)
      return glob, [(p, k, "copy" if p == ("attn1", "to_q", "kernel") else kind) for p, k, kind in block]

    monkeypatch.setattr(wan_convert, "parameter_mapping", wrong)
    code, out, _ = _run(capsys, "transformer", path, "--height", 4, "--width", 6, "--text-len", 5, "--wan-code",
                        WAN_CODE)
    assert code == 1 and any(_row(line) == ("activation", "blocks.0") and line.startswith("!")
                             for line in out.splitlines()), out


def test_wan_code_refusals(release, capsys, tmp_path):
  code, _, err = _run(capsys, "transformer", release / "authors", "--wan-code", tmp_path)
  assert code == 2 and "--wan-code" in err and "wan/modules/model.py" in err
  code, _, err = _run(capsys, "vae", release / "diffusers" / "vae", "--wan-code", tmp_path)
  assert code == 2 and "--wan-code" in err


@pytest.mark.parametrize("broken", ["transposed_kernel", "missing_norm"])
def test_a_wrong_conversion_fails_loudly(release, capsys, monkeypatch, broken):
  real = wan_convert.parameter_mapping

  def wrong(cfg):
    glob, block = real(cfg)
    if broken == "transposed_kernel":  # attn1's query kernel copied without the [out, in] -> [in, out] transpose
      block = [(p, k, "copy" if p == ("attn1", "to_q", "kernel") else kind) for p, k, kind in block]
    return glob, block

  monkeypatch.setattr(wan_convert, "parameter_mapping", wrong)
  if broken == "missing_norm":  # the cross-attention norm's learnt scale lost in conversion (left at 1)
    real_to_jax = wan_convert.diffusers_to_jaxwm

    def drop_norm(sd, cfg, strict=True):
      out = real_to_jax(sd, cfg, strict)
      out["params"]["blocks"]["norm2"]["scale"] = np.ones_like(out["params"]["blocks"]["norm2"]["scale"])
      return out

    monkeypatch.setattr(wan_convert, "diffusers_to_jaxwm", drop_norm)
  code, out, _ = _run(capsys, "transformer", release / "diffusers" / "transformer", "--height", 4, "--width", 4)
  assert code == 1
  failed = [_row(line) for line in out.splitlines() if line.startswith("! ")]
  assert out.splitlines()[-1].startswith("FAIL")
  assert ("activation", "blocks.0") in failed and ("output", "velocity") in failed
  # The first wrong tensor is located: every activation before it agrees.
  assert ("activation", "patch_embedding") not in failed and ("activation", "text_embedder") not in failed
  assert ("gradient", "blocks.0.attn1" if broken == "transposed_kernel" else "blocks.0.norm2") in failed


def test_text_encoder_folder_and_release_pth(release, capsys):
  code, out, _ = _run(capsys, "text", release / "diffusers" / "text_encoder", "--dtype", "bfloat16")
  assert code == 0, out
  code, out, _ = _run(capsys, "text", release / "authors" / "models_t5_umt5-enc-bf16.pth", "--config",
                      release / "t5_config.json", "--text-len", 6)
  assert code == 0, out
  assert {"token_embedding", "block.1", "last_hidden_state", "block.1.attn"} <= {_row(line)[1] for line in out.splitlines()}


def test_vae_folder(release, capsys):
  code, out, _ = _run(capsys, "vae", release / "diffusers" / "vae", "--frames", 5, "--height", 32, "--width", 32)
  assert code == 0, out
  assert "decoder.up_blocks.0" in out and "d/d video" in out


def test_refusals_are_one_line_before_loading(release, capsys, tmp_path):
  cases = [(("vae", tmp_path / "none"), "no such file or folder"),
           (("text", release / "diffusers" / "text_encoder", "--frames", 3), "applies to transformer and vae only"),
           (("vae", release / "diffusers" / "vae", "--frames", 4), "frames must be 1 + 4k"),
           (("transformer", release / "diffusers" / "vae"), "neither a diffusers WanTransformer3DModel config"),
           (("transformer", tmp_path), "no config.json"),
           (("unet", tmp_path), "must be one of")]
  for argv, message in cases:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not out


def test_a_transformer_config_json_is_read_in_both_layouts_and_checked(release):
  """Both folders describe the same model; bfloat16 shards load (``safetensors.numpy`` cannot read BF16); a run
  whose model differs from the weights' config.json is refused naming every differing field; what jaxwm cannot
  run is refused by field."""
  from conftest import tiny_config  # pylint: disable=g-import-not-at-top
  from jaxwm.config_checks import check_init_from  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.files import weight_files  # pylint: disable=g-import-not-at-top
  from jaxwm.settings import ConfigError  # pylint: disable=g-import-not-at-top
  cfg_a, kw_a = wan_convert.folder_transformer_config(release / "authors")
  cfg_d, kw_d = wan_convert.folder_transformer_config(release / "diffusers" / "transformer")
  assert cfg_a == cfg_d and cfg_a.dim == 48 and cfg_a.cross_attn
  assert {k: kw_d[k] for k in kw_a} == kw_a
  low = wan_convert.load_wan_safetensors(weight_files(release / "authors"), cfg_a)
  full = wan_convert.load_wan_safetensors(weight_files(release / "diffusers" / "transformer"), cfg_d)
  q_low, q_full = (np.asarray(t["params"]["blocks"]["attn1"]["to_q"]["kernel"]) for t in (low, full))
  assert q_low.dtype == np.float32 and np.abs(q_low - q_full).max() <= 2 ** -8 * np.abs(q_full).max()
  run = tiny_config(**{"train.init_from": str(release / "authors")})
  with pytest.raises(ConfigError, match=r"dim: run 64, checkpoint 48; in_channels: run 48, checkpoint 4; .*cross_attn: run False, checkpoint True"):
    check_init_from(run)
  for d, field in [({"dim": 48, "num_heads": 2, "model_type": "i2v"}, "model_type='i2v'"),
                   ({"dim": 48, "num_heads": 2, "window_size": [8, 8]}, "window_size"),
                   ({"num_attention_heads": 2, "attention_head_dim": 24, "image_dim": 1280}, "image_dim=1280"),
                   ({"num_attention_heads": 2, "attention_head_dim": 24, "colour": 1}, "colour=1: not a")]:
    with pytest.raises(ValueError, match=field):
      wan_convert.transformer_config(d)
