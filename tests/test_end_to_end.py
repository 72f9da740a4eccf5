"""The papers' job end to end on CPU, at test size: procedural videos with RealEstate10K cameras and captions
-> ingestion with a (tiny, random) Wan2.2 VAE and umT5 -> train.py (TI2V, text dropout) -> sample.py with a
prompt, an MP4 decoded by the VAE chunk by chunk."""

import json

import av
import numpy as np
import pytest
from PIL import Image

from jaxwm.data import ingest as ing
from jaxwm.data.procedural import make_clip
from jaxwm.data.video import write_mp4
from jaxwm.geometry.camera_files import write_cameras

pytestmark = pytest.mark.slow  # ingests, trains, samples and distils through the command lines

HW = (64, 64)  # the tiny Wan2.2 VAE compresses 16x: 4x4 latents
VAE, TEXT = "wan2.2-tiny:0", "umt5-tiny:0"


@pytest.fixture(scope="module", name="dataset")
def _dataset(tmp_path_factory):
  d = tmp_path_factory.mktemp("e2e")
  vids, cams = d / "videos", d / "cameras"
  vids.mkdir()
  cams.mkdir()
  clips = {}
  for i in range(3):
    clip = make_clip(2 * i, 2 * i, num_frames=17, image_hw=HW, family="rotate_loop" if i else "palindrome")
    write_mp4(vids / f"v{i}.mp4", clip["frames"])
    write_cameras(cams / f"v{i}.txt", clip["c2w"].astype(np.float64), clip["intrinsics"], HW)
    clips[f"v{i}"] = clip
  (vids / "broken.mp4").write_bytes(b"\x00not a video" * 32)
  write_cameras(cams / "broken.txt", clips["v0"]["c2w"], clips["v0"]["intrinsics"], HW)
  (d / "captions.json").write_text(json.dumps({"v0": "a painted room", "v1": "a room with a ball"}))
  out = d / "records"
  summary = ing.ingest(vids, out, height=HW[0], width=HW[1], clip_frames=17, cameras=cams,
                       captions=d / "captions.json", encoder=ing.make_encoder(VAE),
                       text_encoder=ing.make_text_encoder(TEXT), progress=False)
  return {"dir": d, "out": out, "summary": summary, "clips": clips}


def _check_ingestion(dataset):
  from jaxwm.data.records import RecordClips  # pylint: disable=g-import-not-at-top
  src = RecordClips(dataset["out"])
  assert len(src) == 3
  rec = src[0]
  assert rec["latents"].shape == (5, 4, 4, 8)  # 17 frames -> 1 + 16/4 latent frames of the tiny Wan2.2 VAE
  assert rec["c2w"].shape == (5, 4, 4) and rec["text_emb"].ndim == 2
  assert src.null_text() is not None and src.null_text().shape == rec["text_emb"].shape
  rejects = [json.loads(l) for l in (dataset["out"] / "rejects.jsonl").read_text().splitlines()]
  assert [r["video"] for r in rejects] == ["broken.mp4"] and rejects[0]["reason"]


def test_ingest_train_sample_mp4(dataset, tmp_path):
  """One test (one xdist worker builds the dataset once)."""
  _check_ingestion(dataset)
  from jaxwm.cli.sample import main as sample_main  # pylint: disable=g-import-not-at-top
  from jaxwm.cli.train import cli as train_cli  # pylint: disable=g-import-not-at-top
  work = tmp_path / "run"
  code = train_cli([
      "--config=configs/tiny.py", "--config.data.source=records", f"--config.data.data_dir={dataset['out']}",
      f"--config.data.vae={VAE}", f"--config.data.text_encoder={TEXT}", "--config.data.latent_stride=16",
      "--config.data.num_frames=5", "--config.data.frame_stride=1", "--config.data.per_device_batch_size=1",
      "--config.model.in_channels=8", "--config.model.out_channels=8", "--config.model.camera.vae_stride=16",
      "--config.model.cross_attn=True", "--config.model.text_dim=64", "--config.model.dim=64",
      "--config.model.num_heads=2", "--config.model.num_layers=2", "--config.model.ffn_dim=64", "--config.recipe.text_dropout=0.1",
      "--config.train.num_steps=3", "--config.train.ckpt_every=3", "--config.train.sample_every=0",
      "--config.train.gain_every=0", f"--config.train.workdir={work}"])
  assert code == 0
  assert (work / "checkpoints" / "3").is_dir()
  first = dataset["clips"]["v1"]["frames"][0]
  Image.fromarray(first).save(tmp_path / "first.png")
  out = tmp_path / "sample.mp4"
  code = sample_main(["--workdir", str(work), "--image", str(tmp_path / "first.png"), "--trajectory",
                      str(dataset["dir"] / "cameras" / "v1.txt"), "--frames", "5", "--steps", "2",
                      "--prompt", "a room with a ball", "--guidance", "2.0", "--out", str(out)])
  assert code == 0 and out.is_file()
  with av.open(str(out)) as c:
    n = sum(1 for _ in c.decode(video=0))
    rate = float(c.streams.video[0].average_rate)
  assert n == 17  # 1 + 4 x 4 frames: the first latent frame alone, then 4 frames per latent frame
  report = json.loads(out.with_suffix(".json").read_text())
  assert report["vae"] == VAE and report["prompt"] == "a room with a ball" and report["frames"] == 5
  assert report["fps"] == 10.0 and abs(rate - 10.0) < 1e-6  # the ingested videos' rate (write_mp4's 10 fps)
  _check_viewer(work, first)


def _check_viewer(work, image):
  """The viewer on the records-trained model: a prompt, frames decoded by the VAE chunk by chunk (4 video frames
  per latent frame), equal to ``stream_video`` (sample.py's path) on the same poses, memory, key and prompt."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.play.engine import Model, Player, first_frame  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.controls import Controls  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.video import stream_video  # pylint: disable=g-import-not-at-top
  config, m, variables, step = load_model(work)
  chunk = config.recipe.chunk_size
  n = 1 + 2 * chunk
  model = Model(config, m, variables, step, max_frames=n)
  assert model.latent and model.text and model.frame_hw == HW
  away = config.copy_and_resolve_references()
  away.data.data_dir = str(work / "no_dataset_here")
  with pytest.raises(ValueError, match="manifest is not readable here"):
    Model(away, m, variables, step)
  assert Model(away, m, variables, step, frame_hw=(32, 48)).frame_hw == (32, 48)  # the dataset elsewhere
  with pytest.raises(ValueError, match="multiples of 16"):
    Model(away, m, variables, step, frame_hw=(30, 48))
  with pytest.raises(ValueError, match="manifest gives the size"):
    Model(config, m, variables, step, frame_hw=(32, 48))
  first, k = first_frame(model, image=np.asarray(image))
  assert first.shape == (*HW, 3) and first_frame(model, 1)[0].shape == (*HW, 3)
  controls = Controls(speed=0.1, turn=10.0)
  player = Player(model, first, k, memory="full", steps=2, controls=controls, prompt="a room with a ball")
  moves = [(["w", "right"], (0.0, 0.0)), ([], (20.0, -4.0))]
  frames, poses, pose = [], [np.eye(4)], np.eye(4)
  for keys, drag in moves:
    out = player.step(keys, drag)
    assert out["frames"].shape == (4 * chunk, *HW, 3) and out["frames"].dtype == np.uint8
    frames.append(out["frames"])
    c2w = controls.chunk(pose, chunk, keys, drag)
    poses.extend(c2w)
    pose = c2w[-1]
  np.testing.assert_allclose(player.pose, pose)
  with pytest.raises(ValueError, match="full memory is full"):
    player.step(["w"])
  context, null = model.text_contexts("a room with a ball")
  cams = {"c2w": np.stack(poses), "intrinsics": np.tile(k, (n, 1, 1))}
  _, video = stream_video(m, variables, config, first, cams, key=jax.random.key(0), num_frames=n,
                          autoencoder=model.autoencoder, context=context, null_context=null,
                          guidance=float(config.sample.guidance), num_steps=2,
                          memory=make_policy("full", max_frames=n, chunk_frames=chunk, image_hw=HW))
  np.testing.assert_array_equal(np.concatenate(frames), video[1:])
