"""Runs notebooks/quickstart.ipynb end to end (its code cells, in order) on a tiny checkpoint."""

import json
import pathlib

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook(tiny_checkpoint, tmp_path, monkeypatch, capsys):
  workdir, _, _ = tiny_checkpoint
  monkeypatch.setenv("JAXWM_CHECKPOINT", str(workdir))
  monkeypatch.setenv("JAXWM_OUT_DIR", str(tmp_path))
  cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
  assert len(cells) >= 3
  namespace = {"__name__": "__main__"}
  for i, cell in enumerate(cells):
    exec(compile("".join(cell["source"]), f"quickstart.ipynb[cell {i}]", "exec"), namespace)  # pylint: disable=exec-used
  out = capsys.readouterr().out
  assert "restored step 2" in out and "rotate_loop yaw 90.0 degrees" in out
  assert (tmp_path / "quickstart_yaw90.gif").exists()
  assert namespace["video"].shape == namespace["gt"].shape
