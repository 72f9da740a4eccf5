"""Text conditioning for training and sampling: umT5 prompt embeddings, text dropout and guidance.

As in Wan, a prompt is cleaned (``ftfy``, html unescape, whitespace collapsed),
tokenized with ``</s>`` appended, padded/truncated to ``max_length`` (512), encoded by umT5, and
every position past the prompt's length is set to zero:

    emb[b, t] = UMT5Encoder(ids, mask)[b, t] * [t < len_b]        (float32, [B, L, d_model]).

The transformer's ``text_embedder`` maps ``d_model`` to its width. Text dropout (for classifier-free
guidance) swaps a whole example's embedding for the empty prompt's; guidance then combines the
two velocities: ``v = v_u + s (v_c - v_u)``.
"""

import html
import io
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.models.umt5 import UMT5Config, UMT5Encoder

_TINY_CORPUS = (
    "a camera moves slowly through a quiet forest at dawn",
    "a drone flies over a city at night with bright lights",
    "waves crash on a rocky beach under a grey sky",
    "walking down a narrow street in an old town",
    "a red car drives along a winding mountain road",
    "the room is empty and the walls are white",
    "turn left, then look up at the tall tower",
    "snow falls on the roofs of small wooden houses",
)


def clean_prompt(text):
  """Wan's prompt cleaning: ``ftfy.fix_text`` (mojibake and odd unicode repaired), html unescape twice,
  whitespace collapsed."""
  import ftfy  # pylint: disable=g-import-not-at-top
  text = ftfy.fix_text(text)
  text = html.unescape(html.unescape(text))
  return re.sub(r"\s+", " ", text).strip()


class SentencePieceTokenizer:
  """A sentencepiece model (file or serialized proto) as a T5 tokenizer: ids then ``</s>``; pad id 0 if unset."""

  def __init__(self, model_file=None, model_proto=None):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.sp = spm.SentencePieceProcessor(model_file=model_file, model_proto=model_proto)
    self.eos_id = self.sp.eos_id()
    if self.eos_id < 0:
      raise ValueError(f"sentencepiece model {model_file or '<proto>'} has no eos piece: T5 tokenizers need </s>")
    self.pad_id = max(self.sp.pad_id(), 0)

  def __call__(self, prompts, max_length):
    """``list[str] -> (ids [B, max_length] int32, mask [B, max_length] int32)``; long prompts keep ``</s>`` last."""
    ids = np.full((len(prompts), max_length), self.pad_id, np.int32)
    mask = np.zeros((len(prompts), max_length), np.int32)
    for b, pieces in enumerate(self.sp.encode(list(prompts))):
      row = pieces[:max_length - 1] + [self.eos_id]
      ids[b, :len(row)], mask[b, :len(row)] = row, 1
    return ids, mask


class HFTokenizer:
  """A local transformers tokenizer (directory or ``tokenizer.json``), called as Wan does."""

  def __init__(self, path):
    if os.path.isdir(path):
      from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
      self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    else:
      from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
      self.tok = PreTrainedTokenizerFast(tokenizer_file=path, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")

  def __call__(self, prompts, max_length):
    out = self.tok(list(prompts), padding="max_length", truncation=True, max_length=max_length,
                   add_special_tokens=True, return_attention_mask=True, return_tensors="np")
    return out["input_ids"].astype(np.int32), out["attention_mask"].astype(np.int32)


def load_tokenizer(path):
  """A tokenizer from a local path (never downloads).

  ``*.model``: a sentencepiece file (umT5's ``spiece.model``); a directory: transformers'
  ``AutoTokenizer`` (or its ``spiece.model`` when it has no tokenizer config); ``*.json``: a
  ``tokenizer.json``.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ValueError(f"tokenizer_path={path!r} does not exist: pass a local sentencepiece .model file, "
                     "a tokenizer.json or a tokenizer directory")
  if os.path.isdir(path):
    has_config = any(os.path.exists(os.path.join(path, n)) for n in ("tokenizer_config.json", "tokenizer.json"))
    spiece = os.path.join(path, "spiece.model")
    return HFTokenizer(path) if has_config or not os.path.exists(spiece) else SentencePieceTokenizer(spiece)
  if path.endswith(".model"):
    return SentencePieceTokenizer(model_file=path)
  if path.endswith(".json"):
    return HFTokenizer(path)
  raise ValueError(f"tokenizer_path={path!r}: expected a .model (sentencepiece) or .json file, or a directory")


def _encode(cfg, params, ids, mask):
  h = UMT5Encoder(cfg).apply(params, ids, mask)
  return jnp.where(mask[..., None] > 0, h, 0.0).astype(jnp.float32)


def drop_text(key, embeddings, prob, null_embedding):
  """Replaces each example's embedding by ``null_embedding`` with probability ``prob`` (pure jnp, jittable).

  ``embeddings [B, L, D]``, ``null_embedding [L, D]`` (or broadcastable) -> ``[B, L, D]``; example ``b``
  is dropped iff ``u_b < prob`` with ``u_b ~ U[0, 1)`` from ``key`` (so ``prob`` 0 keeps all, 1 drops all).
  """
  if isinstance(prob, (int, float)) and not 0.0 <= prob <= 1.0:
    raise ValueError(f"prob={prob!r}: must lie in [0, 1]")
  drop = jax.random.uniform(key, (embeddings.shape[0],)) < prob
  null = jnp.broadcast_to(jnp.asarray(null_embedding, embeddings.dtype), embeddings.shape[1:])
  return jnp.where(drop[:, None, None], null[None], embeddings)


def cfg_combine(cond_velocity, uncond_velocity, scale):
  """Classifier-free guidance on text: ``uncond + scale * (cond - uncond)``.

  Evaluated as ``cond + (scale - 1) * (cond - uncond)`` (equal), so ``scale = 1`` returns ``cond`` exactly.
  """
  return cond_velocity + (scale - 1.0) * (cond_velocity - uncond_velocity)


class TextEncoder:
  """umT5 weights, config and tokenizer: prompts -> Wan text embeddings.

  Attributes: ``cfg`` (:class:`UMT5Config`), ``params`` (``{"params": ...}``), ``tokenizer`` (called
  as ``tokenizer(prompts, max_length) -> (ids, mask)``), ``max_length``, ``null_path`` (optional
  ``.npy`` cache of the empty-prompt embedding).
  """

  def __init__(self, cfg: UMT5Config, params, tokenizer, max_length=512, null_path=None):
    if not isinstance(max_length, int) or max_length < 2:
      raise ValueError(f"max_length={max_length!r}: must be an int >= 2 (room for a token and </s>)")
    self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
    self.max_length, self.null_path = max_length, null_path
    self._null = None
    self._fn = jax.jit(lambda p, i, m: _encode(cfg, p, i, m))

  @classmethod
  def load(cls, tokenizer_path, weights_paths, cfg=None, max_length=512, null_path=None, shardings=None):
    """Tokenizer from ``tokenizer_path`` (see :func:`load_tokenizer`), weights from safetensors file(s)
    (transformers or original Wan names; :func:`jaxwm.convert.umt5.load_umt5_safetensors`); ``cfg``
    defaults to :meth:`UMT5Config.xxl`."""
    from jaxwm.convert.umt5 import load_umt5_safetensors  # pylint: disable=g-import-not-at-top
    cfg = UMT5Config.xxl() if cfg is None else cfg
    tokenizer = load_tokenizer(tokenizer_path)
    params = load_umt5_safetensors(weights_paths, cfg, shardings=shardings)
    return cls(cfg, params, tokenizer, max_length=max_length, null_path=null_path)

  def tokenize(self, prompts):
    """``list[str] -> (ids [B, max_length] int32, mask [B, max_length] int32)`` after :func:`clean_prompt`."""
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts) or not len(prompts):
      raise ValueError(f"prompts={prompts!r:.80}: must be a non-empty list of strings")
    ids, mask = self.tokenizer([clean_prompt(p) for p in prompts], self.max_length)
    return np.asarray(ids, np.int32), np.asarray(mask, np.int32)

  def encode(self, prompts):
    """``list[str] -> (embeddings [B, max_length, d_model] float32, mask [B, max_length] int32)``;
    embeddings are zero past each prompt's token count (``</s>`` included)."""
    ids, mask = self.tokenize(prompts)
    return self._fn(self.params, jnp.asarray(ids), jnp.asarray(mask)), jnp.asarray(mask)

  def null_embedding(self):
    """The empty prompt's embedding ``[max_length, d_model]`` float32, computed once.

    Cached in memory; with ``null_path``, read from that ``.npy`` when present (shape checked) and
    written there after the first computation (the file is not tied to the weights: delete it when
    they change).
    """
    if self._null is None:
      want = (self.max_length, self.cfg.d_model)
      if self.null_path and os.path.exists(self.null_path):
        arr = np.load(self.null_path)
        if arr.shape != want:
          raise ValueError(f"null_path={self.null_path!r} holds shape {arr.shape}; expected {want} "
                           "(max_length, d_model): delete it to recompute")
      else:
        arr = np.asarray(self.encode([""])[0][0], np.float32)
        if self.null_path:
          np.save(self.null_path, arr)
      self._null = jnp.asarray(arr, jnp.float32)
    return self._null

  def drop_text(self, key, embeddings, prob):
    """:func:`drop_text` with this encoder's :meth:`null_embedding` (pass the array itself into jitted steps)."""
    return drop_text(key, embeddings, prob, self.null_embedding())


def train_tiny_sentencepiece(sentences=_TINY_CORPUS, vocab_size=64):
  """A tiny unigram sentencepiece model (serialized bytes) with T5 ids: pad 0, ``</s>`` 1, unk 2, no bos.

  Trains in well under a second; ``vocab_size`` is an upper bound (the corpus may yield fewer pieces).
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if not isinstance(vocab_size, int) or vocab_size < 8:
    raise ValueError(f"vocab_size={vocab_size!r}: must be an int >= 8")
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(list(sentences) * 4), model_writer=buf,
                                 vocab_size=vocab_size, model_type="unigram", hard_vocab_limit=False,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
                                 minloglevel=2)
  return buf.getvalue()


def random_text_encoder(cfg=None, seed=0, max_length=32, null_path=None):
  """A :class:`TextEncoder` with random weights (``cfg`` defaults to :meth:`UMT5Config.tiny`) and a tiny
  sentencepiece tokenizer trained on the fly, for tests and procedural data."""
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  cfg = UMT5Config.tiny() if cfg is None else cfg
  tokenizer = SentencePieceTokenizer(model_proto=train_tiny_sentencepiece(vocab_size=min(64, cfg.vocab_size)))
  if tokenizer.sp.vocab_size() > cfg.vocab_size:
    raise ValueError(f"cfg.vocab_size={cfg.vocab_size}: the tiny tokenizer needs {tokenizer.sp.vocab_size()}")
  ids = jnp.zeros((1, max_length), jnp.int32)
  params = nn.meta.unbox(jax.jit(UMT5Encoder(cfg).init)(jax.random.PRNGKey(seed), ids, jnp.ones_like(ids)))
  return TextEncoder(cfg, params, tokenizer, max_length=max_length, null_path=null_path)
