"""LPIPS in JAX against a PyTorch implementation of the same architecture with the same random
weights, through the converter's .pth -> .npz path."""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")


class TorchLPIPS(torch.nn.Module):
  """LPIPS v0.1 with an AlexNet trunk, written from the paper and the public code's layout."""

  def __init__(self):
    super().__init__()
    tnn = torch.nn
    self.features = tnn.Sequential(
        tnn.Conv2d(3, 64, 11, 4, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
        tnn.Conv2d(64, 192, 5, 1, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2),
        tnn.Conv2d(192, 384, 3, 1, 1), tnn.ReLU(), tnn.Conv2d(384, 256, 3, 1, 1), tnn.ReLU(),
        tnn.Conv2d(256, 256, 3, 1, 1), tnn.ReLU())
    self.lins = tnn.ModuleList(tnn.Sequential(tnn.Dropout(), tnn.Conv2d(c, 1, 1, bias=False))
                               for c in (64, 192, 384, 256, 256))
    self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188])[None, :, None, None])
    self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450])[None, :, None, None])

  def forward(self, a, b):
    def feats(x):
      x = (x - self.shift) / self.scale
      out = []
      for i, layer in enumerate(self.features):
        x = layer(x)
        if i in (1, 4, 7, 9, 11):
          out.append(x)
      return out
    total = 0
    for lin, fa, fb in zip(self.lins, feats(a), feats(b)):
      na = fa / (torch.sqrt((fa ** 2).sum(1, keepdim=True)) + 1e-10)
      nb = fb / (torch.sqrt((fb ** 2).sum(1, keepdim=True)) + 1e-10)
      total = total + lin((na - nb) ** 2).mean((2, 3))
    return total[:, 0]


def test_lpips_matches_torch_with_the_same_weights(tmp_path):
  from jaxwm.evaluation import lpips as lp  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  net = TorchLPIPS().eval()
  for lin in net.lins:
    torch.nn.init.uniform_(lin[1].weight, 0.0, 0.2)  # the released lin weights are non-negative
  alex = {f"features.{k}": v for k, v in net.features.state_dict().items()}
  lin = {f"lin{i}.model.1.weight": l[1].weight for i, l in enumerate(net.lins)}
  torch.save(alex, tmp_path / "alexnet.pth")
  torch.save(lin, tmp_path / "alex.pth")
  out = tmp_path / "lpips.npz"
  subprocess.run([sys.executable, "-m", "jaxwm.evaluation.lpips", "--alexnet", str(tmp_path / "alexnet.pth"),
                  "--lin", str(tmp_path / "alex.pth"), "--out", str(out)], check=True)
  params = lp.load_params(out)
  rng = np.random.default_rng(0)
  a = rng.integers(0, 256, size=(3, 64, 64, 3), dtype=np.uint8)
  b = np.clip(a.astype(int) + rng.integers(-40, 40, size=a.shape), 0, 255).astype(np.uint8)
  got = np.asarray(lp.lpips(params, a, b))
  to_t = lambda x: torch.tensor(x, dtype=torch.float32).permute(0, 3, 1, 2) / 127.5 - 1.0
  with torch.no_grad():
    want = net(to_t(a), to_t(b)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  assert np.all(want > 0)
  np.testing.assert_allclose(lp.lpips(params, a, a), 0.0, atol=1e-7)  # identical images
  with pytest.raises(ValueError, match="missing"):
    lp.convert({}, {})
