"""Check a port before trusting it: load the same weights into the PyTorch reference and into jaxwm, run seeded
random inputs at a shape you choose, and compare every block's activations, the outputs, and the gradients of a
fixed scalar loss with respect to the inputs and every parameter group (``jaxwm-parity``, also
``python -m jaxwm.parity``).

  jaxwm-parity transformer Wan2.2-TI2V-5B-Diffusers/transformer --frames 3 --height 16 --width 16
  jaxwm-parity transformer Wan2.2-TI2V-5B          # the authors' folder: config.json + diffusion_pytorch_model*.safetensors
  jaxwm-parity transformer Wan2.2-TI2V-5B --wan-code Wan2.2   # the authors' own WanModel as the reference
  jaxwm-parity vae Wan2.2-TI2V-5B-Diffusers/vae --frames 5 --height 64 --width 64
  jaxwm-parity vae Wan2.2-TI2V-5B/Wan2.2_VAE.pth --version wan2.2
  jaxwm-parity text Wan2.2-TI2V-5B-Diffusers/text_encoder --text-len 16 --dtype bfloat16
  jaxwm-parity text Wan2.2-TI2V-5B/models_t5_umt5-xxl-enc-bf16.pth

References: diffusers' ``WanTransformer3DModel`` and ``AutoencoderKLWan``, transformers' ``UMT5EncoderModel`` (all
on the CPU, float32 or bfloat16), or for the transformer the authors' ``WanModel`` from their code (``--wan-code``,
float32; its CUDA flash-attn call replaced by torch's SDPA with the same masking). Shapes are latent sizes for the transformer, pixels for the VAE. Prints a
table, writes it as JSON (``--json``), and exits 1 when a tensor is beyond the tolerance the report states
(float32: 1e-4 of the reference's largest magnitude; bfloat16: against PyTorch in float32 on the same rounded
weights, within 1e-2 or twice PyTorch's own bfloat16 error), 2 on a bad argument.
"""

import argparse
import importlib
import pathlib
import sys

from jaxwm.parity import CHECKS
from jaxwm.settings import Choice, Float, Int
from jaxwm.utils.cli import SEED, Parser, Refusal, refuse, write_json
from jaxwm.utils.cli import run as run_cli


def _parser():
  p = Parser(prog="jaxwm-parity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("model", check=Choice(tuple(CHECKS)), help="which model: " + ", ".join(CHECKS))
  p.add_argument("weights", help="the weights: a folder with config.json (diffusers or the authors' layout) or a file "
                                 "(the release's .pth files)")
  p.add_argument("--dtype", default="float32", check=Choice(("float32", "bfloat16")), help="compute dtype of both sides")
  p.add_argument("--frames", type=int, default=None, check=Int(1),
                 help="transformer: latent frames (default 2); vae: video frames, 1 + 4k (default 5)")
  p.add_argument("--height", type=int, default=None, check=Int(1),
                 help="transformer: latent height (default 4); vae: pixels (default 32)")
  p.add_argument("--width", type=int, default=None, check=Int(1), help="as --height")
  p.add_argument("--text-len", type=int, default=8, check=Int(1), help="transformer context / text tokens (default 8)")
  p.add_argument("--batch", type=int, default=None, check=Int(1), help="samples (default 1; text: 2, padded apart)")
  p.add_argument("--seed", type=int, default=0, check=SEED, help="seed of the random inputs")
  p.add_argument("--tol", type=float, default=None, check=Float(gt=0), help="override the tolerance (relative)")
  p.add_argument("--version", default="wan2.2", check=Choice(("wan2.2", "wan2.1")),
                 help="vae: which full-size VAE a bare .pth file is (a folder's config.json says it itself)")
  p.add_argument("--config", default=None, help="text: a config.json for a weights file without one beside it "
                                                "(default: umT5-XXL)")
  p.add_argument("--wan-code", default=None,
                 help="transformer: a checkout of github.com/Wan-Video/Wan2.2; the authors' WanModel "
                      "(wan/modules/model.py, loaded by path) is then the reference instead of diffusers' (float32)")
  p.add_argument("--json", default=None, help="also write the report to this JSON file")
  return p


def _kwargs(args):
  kw = {"dtype": args.dtype, "seed": args.seed, "tol": args.tol}
  if args.batch is not None:
    kw["batch"] = args.batch
  shape = {k: getattr(args, k) for k in ("frames", "height", "width") if getattr(args, k) is not None}
  if args.model == "text":
    if shape:
      raise refuse(f"--{next(iter(shape))}", next(iter(shape.values())), "applies to transformer and vae only")
    return {**kw, "text_len": args.text_len, "config": args.config}
  if args.config is not None:
    raise refuse("--config", args.config, "applies to text only (the transformer and a VAE folder carry config.json)")
  if args.wan_code is not None and args.model != "transformer":
    raise refuse("--wan-code", args.wan_code, "applies to transformer only")
  if args.model == "vae":
    return {**kw, **shape, "version": args.version}
  return {**kw, **shape, "text_len": args.text_len, "wan_code": args.wan_code}


def _main(argv):
  args = _parser().parse_args(argv)
  if not pathlib.Path(args.weights).exists():
    raise refuse("weights", args.weights, "no such file or folder")
  if args.json is not None and pathlib.Path(args.json).is_dir():
    raise refuse("--json", args.json, "is a directory")
  if args.wan_code is not None and not (pathlib.Path(args.wan_code) / "wan" / "modules" / "model.py").is_file():
    raise refuse("--wan-code", args.wan_code, "no wan/modules/model.py under it (a checkout of Wan-Video/Wan2.2)")
  if args.config is not None and not pathlib.Path(args.config).is_file():
    raise refuse("--config", args.config, "no such file")
  kwargs = _kwargs(args)
  check = importlib.import_module(CHECKS[args.model]).check
  try:
    report = check(args.weights, **kwargs)
  except (ValueError, KeyError) as e:
    raise Refusal(" ".join(str(e).strip("'\"").split())) from None
  print(report.table())
  if args.json is not None:
    write_json(pathlib.Path(args.json), report.to_json())
  return 0 if report.passed else 1


def main(argv=None):
  return run_cli(_main, sys.argv[1:] if argv is None else argv, "jaxwm-parity")


if __name__ == "__main__":
  sys.exit(main())
