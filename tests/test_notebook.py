"""notebooks/quickstart.ipynb as a new user runs it, and the installed commands it names.

The notebook's code cells run in this process, in order, from ``notebooks/`` as the working folder on a tiny
checkpoint; its install cell (checkout found: editable install; none: ``REPO_URL``, or one line naming it when
empty), ``CHECKPOINT`` resolution (from the repository root, not the working folder), the not-found message (it
names ``CHECKPOINT``, no command-line flag) and the training it starts are checked cell by cell (cells are found by
their tag). ``jaxwm-train`` and ``jaxwm-sample`` are in the installed metadata and run outside a checkout, where
``--config configs/tiny.py`` is the packaged config.
"""

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
CODE = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
TAGGED = {t: "".join(c["source"]) for c in CODE for t in c["metadata"].get("tags", [])}


def run_cell(tag, namespace):
  exec(compile(TAGGED[tag], f"quickstart.ipynb[{tag}]", "exec"), namespace)  # pylint: disable=exec-used


@pytest.fixture
def sandbox(monkeypatch):
  """No pip, no Colab or TPU hints, the notebook's environment variables unset, ``sys.path`` restored after."""
  calls = []
  monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
  monkeypatch.setattr(sys, "path", list(sys.path))
  for var in ("JAXWM_REPO_URL", "JAXWM_CHECKPOINT", "JAXWM_OUT_DIR", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
    monkeypatch.delenv(var, raising=False)
  return calls


def not_installed(monkeypatch):
  def distribution(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_cells_are_tagged_in_order():
  assert [c["metadata"]["tags"][0] for c in CODE] == ["install", "checkpoint", "train", "load", "stream", "show"]


def test_quickstart_notebook(tiny_checkpoint, tmp_path, monkeypatch, capsys, sandbox):
  workdir, _, _ = tiny_checkpoint
  monkeypatch.chdir(ROOT / "notebooks")
  monkeypatch.setenv("JAXWM_CHECKPOINT", str(workdir))
  monkeypatch.setenv("JAXWM_OUT_DIR", str(tmp_path))
  namespace = {"__name__": "__main__"}
  for cell in CODE:
    run_cell(cell["metadata"]["tags"][0], namespace)
  out = capsys.readouterr().out
  assert f"jaxwm is installed; using the checkout at {ROOT}" in out and not sandbox  # nothing pip-installed
  assert "training configs/tiny" not in out  # a checkpoint is there: nothing trained
  assert "restored step 2" in out and "rotate_loop yaw 90.0 degrees" in out
  assert (tmp_path / "quickstart_yaw90.gif").exists()
  assert namespace["video"].shape == namespace["gt"].shape


def test_install_cell_in_a_checkout_installs_it_editable(tmp_path, monkeypatch, capsys, sandbox):
  repo = tmp_path / "repo"
  (repo / "jaxwm").mkdir(parents=True)
  (repo / "jaxwm" / "__init__.py").write_text("")
  (repo / "pyproject.toml").write_text("[project]\nname = 'jaxwm'\n")
  (repo / "notebooks").mkdir()
  monkeypatch.chdir(repo / "notebooks")
  not_installed(monkeypatch)
  namespace = {}
  run_cell("install", namespace)
  assert namespace["REPO_ROOT"] == repo and sys.path[0] == str(repo)
  assert [c[:7] for c in sandbox] == [[sys.executable, "-m", "pip", "install", "-q", "-e", str(repo)]]
  assert f"installing jaxwm: pip install -q -e {repo}" in capsys.readouterr().out


def test_install_cell_outside_a_checkout_names_repo_url(tmp_path, monkeypatch, sandbox):
  monkeypatch.chdir(tmp_path)
  not_installed(monkeypatch)
  with pytest.raises(SystemExit) as e:
    run_cell("install", {})
  message = str(e.value.code)
  assert message.startswith("REPO_URL is empty: set REPO_URL = ") and "\n" not in message and not sandbox
  monkeypatch.setenv("JAXWM_REPO_URL", "https://github.com/someone/jaxwm")
  namespace = {}
  run_cell("install", namespace)
  assert namespace["REPO_ROOT"] is None
  assert [c[5:6] for c in sandbox] == [["git+https://github.com/someone/jaxwm"]]
  command = namespace["install_command"]
  assert command(None, "git+https://x/jaxwm@v1", tpu=True)[5:] == ["git+https://x/jaxwm@v1", "jax[tpu]"]
  assert command(None, "dist/jaxwm-0.1.0-py3-none-any.whl")[5:] == ["dist/jaxwm-0.1.0-py3-none-any.whl"]


def test_checkpoint_is_found_from_the_repository_root_and_named_when_missing(monkeypatch, sandbox):
  monkeypatch.chdir(ROOT / "notebooks")
  namespace = {}
  run_cell("install", namespace)
  run_cell("checkpoint", namespace)
  assert namespace["CHECKPOINT_PATH"] == str(ROOT / "runs" / "tiny")  # not notebooks/runs/tiny
  assert namespace["OUT_DIR"] == str(ROOT / "samples")
  assert namespace["resolve"]("/abs/run") == "/abs/run" and namespace["resolve"]("gs://b/run") == "gs://b/run"

  namespace["CHECKPOINT"] = "runs/no_such_run"
  namespace["CHECKPOINT_PATH"] = missing = str(ROOT / "runs" / "no_such_run")
  namespace["TRAIN_IF_MISSING"] = False
  for tag in ("train", "load"):
    with pytest.raises(SystemExit) as e:
      run_cell(tag, namespace)
    message = str(e.value.code)
    assert message.startswith(f"no checkpoint at CHECKPOINT = 'runs/no_such_run' ({missing})"), message
    assert "--workdir" not in message and "TRAIN_IF_MISSING = True" in message
  assert not pathlib.Path(missing).exists()


def test_train_cell_trains_configs_tiny_into_checkpoint(monkeypatch, capsys, sandbox):
  """With nothing at CHECKPOINT the train cell calls ``jaxwm.cli.train.main`` with arguments train.py accepts."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  from jaxwm.cli import train  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(ROOT / "notebooks")
  seen = []

  def main(argv):  # train.py's checks, no training
    argv = ["train.py", *train.resolve_argv(argv)]
    train._check_cli(argv[1:])  # pylint: disable=protected-access
    flag_values = flags.FlagValues()
    train._define_flags(flag_values, argv)  # pylint: disable=protected-access
    flag_values(argv)
    config_checks.validate(flag_values.config, workdir=flag_values.workdir)
    seen.append((argv, flag_values.config))
    return 0

  monkeypatch.setattr(train, "main", main)
  namespace = {}
  run_cell("install", namespace)
  run_cell("checkpoint", namespace)
  namespace["CHECKPOINT_PATH"] = missing = str(ROOT / "runs" / "no_such_run")
  run_cell("train", namespace)
  (argv, config), = seen
  assert argv[1] == f"--config={ROOT / 'configs' / 'tiny.py'}" and argv[-1] == f"--workdir={missing}"
  assert config.train.num_steps == namespace["TRAIN_STEPS"] == 200 and config.optim.ema_decay == 0
  assert config.data.data_dir == str(ROOT / "data" / "tfds")
  assert "training configs/tiny for 200 steps" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------------------
# jaxwm-train and jaxwm-sample (pip install -e . writes them)

def _script(name):
  path = shutil.which(name, path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
  assert path, f"{name} is not installed: pip install -e ."
  return path


def test_console_scripts_are_installed():
  scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
  assert scripts.get("jaxwm-train") == "jaxwm.cli.train:main"
  assert scripts.get("jaxwm-sample") == "jaxwm.cli.sample:main"
  assert scripts.get("jaxwm-play") == "jaxwm.play.server:main"


def test_console_scripts_run_outside_a_checkout(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  r = run(_script("jaxwm-train"), "--help")
  assert r.returncode == 0 and "--config" in r.stdout and "jaxwm-train" in r.stdout, r.stderr
  r = run(_script("jaxwm-sample"), "--help")
  assert r.returncode == 0 and "--workdir" in r.stdout, r.stderr
  r = run(_script("jaxwm-play"), "--help")
  assert r.returncode == 0 and "--memory" in r.stdout and "--max-sessions" in r.stdout, r.stderr
  r = run(_script("jaxwm-play"), "--workdir", "nothing_here")
  assert r.returncode == 2 and r.stderr.strip() == ("jaxwm-play: --workdir='nothing_here': no such directory (a "
                                                    "training workdir or checkpoint directory)"), r.stderr
  # configs/tiny.py is the packaged config here (no such file in tmp_path): loaded, then a bad value refused
  r = run(_script("jaxwm-train"), "--config", "configs/tiny.py", "--config.optim.lr=-1", "--workdir=w")
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip().splitlines()[-1] == "train.py: optim.lr=-1.0: must be a finite learning rate > 0"
  r = run(_script("jaxwm-train"), "--config=nope.py", "--workdir=w")
  assert r.returncode == 2 and r.stderr.startswith("train.py: --config='nope.py': no such file") and "tiny" in r.stderr
  assert not list(tmp_path.iterdir())  # refused before anything was written


def test_config_names_resolve_to_the_configs_package(tmp_path, monkeypatch):
  from jaxwm.cli.train import packaged_configs, resolve_config  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  tiny = str(ROOT / "configs" / "tiny.py")
  for name in ("tiny", "tiny.py", "configs/tiny.py"):
    assert resolve_config(name) == tiny
  assert resolve_config("configs/repro.py:loci") == f"{ROOT / 'configs' / 'repro.py'}:loci"
  assert resolve_config("elsewhere/tiny.py") == "elsewhere/tiny.py"  # only bare names and configs/<name>
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "tiny.py").write_text("")
  assert resolve_config("configs/tiny.py") == "configs/tiny.py"  # an existing file wins
  assert {"tiny", "small"} <= set(packaged_configs())
