"""umT5 text encoder: parity with transformers' UMT5EncoderModel, weight conversion, tokenizers and the
text-conditioning utilities (null embedding, text dropout, classifier-free guidance)."""

import dataclasses
import re
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from jaxwm import text as text_lib  # noqa: E402
from jaxwm.convert import umt5 as conv  # noqa: E402
from jaxwm.models.umt5 import UMT5Config, UMT5Encoder, relative_position_bucket  # noqa: E402

# Small bucket range so that length 24 covers exact, logarithmic and clipped buckets.
CFG = UMT5Config.tiny(num_layers=3, relative_attention_num_buckets=16, relative_attention_max_distance=20)
PROMPTS = ["A camera   moves slowly through a quiet forest at dawn.", "turn left", "",
           "snow falls on the roofs of small wooden houses while a drone flies over the city at night"]


def _hf_config(cfg):
  return transformers.UMT5Config(
      vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff, num_layers=cfg.num_layers,
      num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.relative_attention_num_buckets,
      relative_attention_max_distance=cfg.relative_attention_max_distance, dropout_rate=0.0)


@pytest.fixture(scope="module")
def hf_model():
  torch.manual_seed(0)
  return transformers.UMT5EncoderModel(_hf_config(CFG)).eval()


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("spm")
  (d / "spiece.model").write_bytes(text_lib.train_tiny_sentencepiece())
  return d


def _hf_run(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(np.asarray(ids, np.int64)),
                 attention_mask=torch.as_tensor(np.asarray(mask, np.int64))).last_hidden_state.numpy()


def test_config_from_hf_and_bad_values():
  assert UMT5Config.from_hf(_hf_config(CFG)) == CFG
  assert UMT5Config.from_hf(_hf_config(CFG).to_dict()) == CFG
  with pytest.raises(ValueError, match="feed_forward_proj='relu'"):
    UMT5Config.tiny(feed_forward_proj="relu")
  with pytest.raises(ValueError, match="d_model=0"):
    UMT5Config.tiny(d_model=0)


@pytest.mark.parametrize("buckets,distance", [(32, 128), (16, 20), (8, 8)])
def test_relative_position_bucket_matches_reference(buckets, distance):
  from transformers.models.umt5.modeling_umt5 import UMT5Attention  # pylint: disable=g-import-not-at-top
  fake = types.SimpleNamespace(is_decoder=False, relative_attention_num_buckets=buckets,
                               relative_attention_max_distance=distance)
  rel = np.arange(-1100, 1100)
  want = UMT5Attention._relative_position_bucket(fake, torch.as_tensor(rel)).numpy()  # pylint: disable=protected-access
  np.testing.assert_array_equal(relative_position_bucket(rel, buckets, distance), want)


def test_parity_with_padding(hf_model):
  rng = np.random.default_rng(0)
  ids = rng.integers(3, CFG.vocab_size, (2, 24))
  mask = np.zeros((2, 24), np.int32)
  mask[0], mask[1, :9] = 1, 1
  ids[1, 9:] = 0
  want = _hf_run(hf_model, ids, mask)
  params = conv.hf_to_jaxwm(hf_model.state_dict(), CFG)
  got = np.asarray(jax.jit(UMT5Encoder(CFG).apply)(params, jnp.asarray(ids, jnp.int32), jnp.asarray(mask)))
  assert got.shape == (2, 24, CFG.d_model) and got.dtype == np.float32
  np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(got[1, :9], want[1, :9], atol=1e-4, rtol=1e-4)
  # Padding is masked: changing padded tokens leaves the real positions unchanged.
  ids2 = ids.copy()
  ids2[1, 9:] = 7
  got2 = np.asarray(jax.jit(UMT5Encoder(CFG).apply)(params, jnp.asarray(ids2, jnp.int32), jnp.asarray(mask)))
  np.testing.assert_allclose(got2[1, :9], got[1, :9], atol=1e-5)
  # bfloat16 parameters and matmuls stay close to float32.
  bf16 = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
  low = jax.jit(UMT5Encoder(bf16).apply)(jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.bfloat16), params),
                                         jnp.asarray(ids, jnp.int32), jnp.asarray(mask))
  assert low.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(low)[0], want[0], atol=0.1, rtol=0.05)


def test_conversion_covers_every_parameter_both_ways(hf_model):
  sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  params = conv.hf_to_jaxwm(sd, CFG)
  abstract = nn.meta.unbox(jax.eval_shape(UMT5Encoder(CFG).init, jax.random.PRNGKey(0),
                                          jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)))
  shapes = lambda t: jax.tree_util.tree_map(lambda a: tuple(a.shape), t)  # noqa: E731
  assert shapes(params) == shapes(abstract)
  back = conv.jaxwm_to_hf(params, CFG)
  assert set(back) == set(sd)
  for k, v in sd.items():
    np.testing.assert_array_equal(back[k], v, err_msg=k)
  # Either tied embedding name suffices; extra and missing keys are errors.
  only_embed_tokens = {k: v for k, v in sd.items() if k != "shared.weight"}
  np.testing.assert_array_equal(conv.hf_to_jaxwm(only_embed_tokens, CFG)["params"]["token_embedding"]["embedding"],
                                sd["shared.weight"])
  with pytest.raises(KeyError, match="no umT5 encoder parameter uses"):
    conv.hf_to_jaxwm({**sd, "lm_head.weight": sd["shared.weight"]}, CFG)
  with pytest.raises(KeyError, match="lacks 1 key"):
    conv.hf_to_jaxwm({k: v for k, v in sd.items() if k != "encoder.final_layer_norm.weight"}, CFG)


def _at(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def test_xxl_shapes_match_transformers():
  cfg = UMT5Config.xxl()
  with torch.device("meta"):
    ref = transformers.UMT5EncoderModel(_hf_config(cfg)).state_dict()
  abstract = nn.meta.unbox(jax.eval_shape(UMT5Encoder(cfg).init, jax.random.PRNGKey(0),
                                          jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)))["params"]
  glob, layer = conv.parameter_mapping(cfg)
  got = {}
  for path, names, kind in glob:
    shape = _at(abstract, path).shape
    got.update({n: shape[::-1] if kind == "linear" else shape for n in names})
  for path, names, kind in layer:
    shape = _at(abstract["layers"], path).shape[1:]
    got.update({n.format(i=i): shape[::-1] if kind == "linear" else shape for n in names for i in range(24)})
  assert got == {k: tuple(v.shape) for k, v in ref.items()}
  assert sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(abstract)) == 5_680_910_336


def test_load_safetensors_sharded_bf16_and_original_names(hf_model, tmp_path):
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  from jaxwm.training.sharding import DEFAULT_RULES, make_mesh  # pylint: disable=g-import-not-at-top
  hf_model.save_pretrained(tmp_path / "hf")  # tied embedding saved once
  want = conv.hf_to_jaxwm(hf_model.state_dict(), CFG)
  ids = jnp.zeros((1, 4), jnp.int32)
  abstract = jax.eval_shape(UMT5Encoder(CFG).init, jax.random.PRNGKey(0), ids, jnp.ones_like(ids))
  mesh = make_mesh(data=1, fsdp=-1)
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, DEFAULT_RULES)
  got = conv.load_umt5_safetensors(tmp_path / "hf", CFG, abstract, shardings)  # a folder of shards
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), got, want)
  wq = got["params"]["layers"]["attn"]["q"]["kernel"]
  assert wq.sharding == shardings["params"]["layers"]["attn"]["q"]["kernel"]
  assert len(wq.addressable_shards) == 8 and wq.addressable_shards[0].data.shape == (3, 8, 64)

  # bfloat16 file with original Wan names (wan/modules/t5.py) -> bfloat16 parameters.
  to_original = [(r"^shared\.", "token_embedding."), (r"^encoder\.final_layer_norm\.", "norm."),
                 (r"^encoder\.block\.(\d+)\.layer\.0\.layer_norm\.", r"blocks.\1.norm1."),
                 (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.",
                  r"blocks.\1.pos_embedding.embedding."),
                 (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.", r"blocks.\1.attn."),
                 (r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.", r"blocks.\1.norm2."),
                 (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.", r"blocks.\1.ffn.gate.0."),
                 (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.", r"blocks.\1.ffn.fc1."),
                 (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.", r"blocks.\1.ffn.fc2.")]
  original = {}
  for k, v in hf_model.state_dict().items():
    if k != "encoder.embed_tokens.weight":
      for pattern, repl in to_original:
        k = re.sub(pattern, repl, k)
      original[k] = v.to(torch.bfloat16).contiguous()
  save_file(original, str(tmp_path / "wan_t5.safetensors"))
  got = conv.load_umt5_safetensors(tmp_path / "wan_t5.safetensors", dataclasses.replace(CFG, param_dtype="bfloat16"))
  want_bf16 = jax.tree_util.tree_map(lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16)), want)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), got, want_bf16)
  assert got["params"]["final_norm"]["scale"].dtype == jnp.bfloat16
  # The release's file: the same dict written by torch.save (models_t5_umt5-xxl-enc-bf16.pth).
  torch.save(original, tmp_path / "models_t5_umt5-enc-bf16.pth")
  got = conv.load_umt5_safetensors(tmp_path / "models_t5_umt5-enc-bf16.pth",
                                   dataclasses.replace(CFG, param_dtype="bfloat16"))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), got, want_bf16)
  (tmp_path / "broken.pth").write_bytes(b"not a zip")
  with pytest.raises(ValueError, match="broken.pth: not a torch state dict"):
    conv.load_umt5_safetensors(tmp_path / "broken.pth", CFG)


def test_tokenizers_match_t5_tokenizer(spm_dir, tmp_path):
  hf_tok = transformers.T5Tokenizer.from_pretrained(str(spm_dir), extra_ids=0)
  cleaned = [text_lib.clean_prompt(p) for p in PROMPTS]
  ref = hf_tok(cleaned, padding="max_length", truncation=True, max_length=16, return_tensors="np")
  hf_tok.save_pretrained(tmp_path / "hf_tok")
  for path in (spm_dir / "spiece.model", spm_dir, tmp_path / "hf_tok", tmp_path / "hf_tok" / "tokenizer.json"):
    ids, mask = text_lib.load_tokenizer(path)(cleaned, 16)
    np.testing.assert_array_equal(ids, ref["input_ids"], err_msg=str(path))
    np.testing.assert_array_equal(mask, ref["attention_mask"], err_msg=str(path))
  assert ids[3, -1] == 1 and mask[2].sum() == 1  # truncated prompt ends with </s>; the empty prompt is </s>
  with pytest.raises(ValueError, match="tokenizer_path="):
    text_lib.load_tokenizer(tmp_path / "missing.model")


def test_text_encoder_load_and_encode_match_reference(hf_model, spm_dir, tmp_path):
  hf_model.save_pretrained(tmp_path / "hf")
  te = text_lib.TextEncoder.load(spm_dir / "spiece.model", sorted((tmp_path / "hf").glob("*.safetensors")),
                                 cfg=CFG, max_length=16)
  emb, mask = te.encode(PROMPTS)
  hf_tok = transformers.T5Tokenizer.from_pretrained(str(spm_dir), extra_ids=0)
  ref = hf_tok([text_lib.clean_prompt(p) for p in PROMPTS], padding="max_length", truncation=True, max_length=16,
               return_tensors="np")
  want = _hf_run(hf_model, ref["input_ids"], ref["attention_mask"]) * ref["attention_mask"][..., None]
  assert emb.shape == (4, 16, CFG.d_model) and emb.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(mask), ref["attention_mask"])
  np.testing.assert_allclose(np.asarray(emb), want, atol=1e-4, rtol=1e-4)
  assert not np.asarray(emb)[1, int(mask[1].sum()):].any()
  with pytest.raises(ValueError, match="prompts="):
    te.encode("a single string")
  # By name, as --text_encoder / data.text_encoder take it: the folder's config.json gives the size (not XXL's).
  from jaxwm.encoders import make_text_encoder  # pylint: disable=g-import-not-at-top
  named = make_text_encoder(f"umt5:{spm_dir / 'spiece.model'},{tmp_path / 'hf'}", max_length=16)
  assert named.cfg.d_model == CFG.d_model and named.cfg.num_layers == CFG.num_layers
  np.testing.assert_allclose(np.asarray(named.encode(PROMPTS)[0]), np.asarray(emb), atol=1e-6)


@pytest.fixture(scope="module")
def random_encoder():
  return text_lib.random_text_encoder(max_length=16)


def test_null_embedding_is_computed_once_and_cached_to_file(random_encoder, tmp_path, monkeypatch):
  path = str(tmp_path / "null.npy")
  te = text_lib.TextEncoder(random_encoder.cfg, random_encoder.params, random_encoder.tokenizer, 16, null_path=path)
  calls = []
  encode = te.encode
  monkeypatch.setattr(te, "encode", lambda prompts: calls.append(prompts) or encode(prompts))
  null = te.null_embedding()
  assert te.null_embedding() is null and calls == [[""]]
  assert null.shape == (16, CFG.d_model) and null[0].any() and not null[1:].any()
  np.testing.assert_array_equal(np.load(path), np.asarray(null))
  # A fresh encoder with the same cache file reads it instead of encoding.
  fresh = text_lib.TextEncoder(te.cfg, te.params, te.tokenizer, 16, null_path=path)
  monkeypatch.setattr(fresh, "encode", lambda prompts: pytest.fail("encoded despite the cache file"))
  np.testing.assert_array_equal(np.asarray(fresh.null_embedding()), np.asarray(null))


def test_drop_text_and_cfg_combine(random_encoder):
  emb, _ = random_encoder.encode(["a red car", "waves on a beach", "snow"])
  null = random_encoder.null_embedding()
  drop = jax.jit(text_lib.drop_text)
  key = jax.random.PRNGKey(3)
  np.testing.assert_array_equal(np.asarray(drop(key, emb, 0.0, null)), np.asarray(emb))
  np.testing.assert_array_equal(np.asarray(drop(key, emb, 1.0, null)), np.broadcast_to(np.asarray(null), emb.shape))
  np.testing.assert_array_equal(np.asarray(random_encoder.drop_text(key, emb, 1.0)),
                                np.broadcast_to(np.asarray(null), emb.shape))
  many = jnp.broadcast_to(emb[:1], (64,) + emb.shape[1:])
  kept = np.all(np.asarray(drop(key, many, 0.5, null)) == np.asarray(emb[:1]), axis=(1, 2))
  assert 10 < kept.sum() < 54
  with pytest.raises(ValueError, match="prob=1.5"):
    text_lib.drop_text(key, emb, 1.5, null)

  cond, uncond = jnp.asarray(np.random.default_rng(1).normal(size=(2, 2, 3, 4, 4, 8)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(text_lib.cfg_combine(cond, uncond, 1.0)), np.asarray(cond))
  np.testing.assert_allclose(np.asarray(text_lib.cfg_combine(cond, uncond, 0.0)), np.asarray(uncond), atol=1e-6)
  np.testing.assert_allclose(np.asarray(text_lib.cfg_combine(cond, uncond, 5.0)),
                             np.asarray(uncond + 5.0 * (cond - uncond)), atol=1e-5)


def test_prompts_are_cleaned_as_wan_cleans_them():
  """ftfy (UTF-8 read as cp1252 repaired), then html entities unescaped twice, then whitespace collapsed."""
  broken = "caf\u00c3\u00a9 &amp;amp; the  \n room"  # 'café' mis-decoded, a doubly escaped '&'
  assert text_lib.clean_prompt(broken) == "café & the room"
