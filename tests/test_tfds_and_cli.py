"""The TFDS builder (array_record, Tensor features, no TensorFlow) and the preview command."""

import sys

import numpy as np
from PIL import Image

from jaxwm.data.procedural import ProceduralClips
from jaxwm.data.procedural.__main__ import main
from jaxwm.data.procedural.tfds_builder import build, load_source


def test_tfds_build_and_read(tmp_path):
  builder = build(tmp_path, "tiny", num_train=3, num_eval=2, image_hw=(16, 16), num_frames=4)
  assert "tensorflow" not in sys.modules
  assert list(tmp_path.rglob("*.array_record*"))
  for split, family, n in [("train", "mixed", 3), ("eval", "loops", 2)]:
    src = load_source(builder, split)
    ref = ProceduralClips(split, n, num_frames=4, image_hw=(16, 16), family=family)
    assert len(src) == n
    for i in range(n):
      got, want = src[i], ref[i]
      for key in ("frames", "depth", "c2w", "intrinsics"):
        np.testing.assert_array_equal(np.asarray(got[key]), want[key])
      assert int(got["return_frame"]) == int(want["return_frame"])
      assert got["family"].decode() == str(want["family"])
  # Rebuilding reuses the files.
  again = build(tmp_path, "tiny", num_train=3, num_eval=2, image_hw=(16, 16), num_frames=4)
  assert again.data_dir == builder.data_dir


def test_preview_writes_a_gif(tmp_path, capsys):
  path = tmp_path / "loop.gif"
  assert main(["--preview", str(path), "--frames", "5", "--size", "16", "--axes", "yaw+roll"]) == 0
  assert "return frame 4" in capsys.readouterr().out
  with Image.open(path) as im:
    assert im.n_frames == 5
    assert im.size == (16 * 16 * 2 + 2 * 16, 16 * 16)
