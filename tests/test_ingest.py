"""Video ingestion: PyAV reading, resampling, exact resize/crop intrinsics, array_record shards,
rejects, resumption, the CLI, and reading back with RecordClips / LatentWindow."""

import json

import numpy as np
import pytest

from jaxwm import encoders
from jaxwm.data import ingest as ing
from jaxwm.data import records
from jaxwm.data import ingest_parts
from jaxwm.data.procedural import make_clip, make_scene, render
from jaxwm.data.records import LatentWindow, RecordClips, decode_record, encode_record
from jaxwm.data.video import adjust_intrinsics, read_video, resample_indices, resize_center_crop, write_mp4
from jaxwm.geometry.camera_files import write_cameras
from jaxwm.geometry.formats import scale_intrinsics
from jaxwm.geometry.cameras import reanchor
from jaxwm.geometry.rotations import downsample_poses, rotation_about_axis
from jaxwm.models import vae
from jaxwm.utils.cli import run as run_cli

HW = (32, 32)
GOOD = {"a": 9, "b": 17, "c": 13}  # stem -> frames


@pytest.fixture(scope="module", name="inputs")
def _inputs(tmp_path_factory):
  """Videos, RealEstate10K cameras (one c2w JSON in OpenGL cm) and captions; four bad inputs."""
  d = tmp_path_factory.mktemp("ingest_inputs")
  vids, cams = d / "videos", d / "cameras"
  vids.mkdir()
  cams.mkdir()
  clips = {}
  for i, (stem, n) in enumerate(GOOD.items()):
    clips[stem] = make_clip(2 * i, 2 * i, num_frames=n, image_hw=HW, family="free")
    write_mp4(vids / f"{stem}.mp4", clips[stem]["frames"])
    c2w, k = clips[stem]["c2w"].astype(np.float64), clips[stem]["intrinsics"]
    kw = {"convention": "opengl", "unit": "cm"} if stem == "b" else {}
    write_cameras(cams / f"{stem}{'.json' if stem == 'b' else '.txt'}", c2w, k, HW, **kw)
  (vids / "broken.mp4").write_bytes(b"\x00garbage" * 64)
  write_cameras(cams / "broken.txt", clips["a"]["c2w"], clips["a"]["intrinsics"], HW)
  write_mp4(vids / "wrongcount.mp4", clips["a"]["frames"])
  write_cameras(cams / "wrongcount.txt", clips["a"]["c2w"][:8], clips["a"]["intrinsics"][:8], HW)
  write_mp4(vids / "nocam.mp4", clips["a"]["frames"])
  write_mp4(vids / "nanpose.mp4", clips["a"]["frames"])
  nan = clips["a"]["c2w"].copy()
  nan[3, 0, 3] = np.nan
  np.savez(cams / "nanpose.npz", c2w=nan, K=clips["a"]["intrinsics"])
  captions = d / "captions.jsonl"
  captions.write_text("".join(json.dumps({"stem": s, "caption": f"a room {s}"}) + "\n" for s in ("a", "b")))
  return {"videos": vids, "cameras": cams, "captions": captions, "clips": clips}


def test_read_video_and_resample(inputs):
  v = read_video(inputs["videos"] / "b.mp4")
  assert v["frames"].shape == (17, 32, 32, 3) and v["frames"].dtype == np.uint8 and v["fps"] == 10
  np.testing.assert_allclose(v["timestamps"], np.arange(17) / 10)
  assert np.abs(v["frames"].astype(int) - inputs["clips"]["b"]["frames"]).mean() < 12  # codec loss
  np.testing.assert_array_equal(resample_indices(v["timestamps"], stride=3), [0, 3, 6, 9, 12, 15])
  np.testing.assert_array_equal(resample_indices(v["timestamps"], fps=5), [0, 2, 4, 6, 8, 10, 12, 14, 16])
  np.testing.assert_array_equal(resample_indices(np.arange(10) / 30, fps=12), [0, 2, 5, 7])  # nearest ticks
  with pytest.raises(ValueError, match="target fps 20 is above the video's 10"):
    resample_indices(v["timestamps"], fps=20)
  with pytest.raises(ValueError, match="unreadable video"):
    read_video(inputs["videos"] / "broken.mp4")


def test_resize_crop_intrinsics_are_exact():
  """Resizing + cropping a render equals rendering with the adjusted intrinsics, to a fraction of
  a pixel (renders supersampled 4x, so both sides are antialiased)."""
  scene = make_scene(4)
  c2w = np.eye(4)[None]
  c2w[0, :3, 3] = np.mean(scene.camera_zone, axis=0)

  def rendered(k, hw, f=4):
    x, _ = render(scene, c2w, scale_intrinsics(k, hw, (hw[0] * f, hw[1] * f)), (hw[0] * f, hw[1] * f))
    return x.reshape(1, hw[0], f, hw[1], f, 3).astype(float).mean(axis=(2, 4))

  k = np.array([[[40.0, 0, 32], [0, 40.0, 24], [0, 0, 1]]])
  small, k2 = resize_center_crop(np.rint(rendered(k, (48, 64))).astype(np.uint8), k, (24, 24))
  np.testing.assert_allclose(k2[0], [[20, 0, 12], [0, 20, 12], [0, 0, 1]])  # 48x64 -> 24x32 -> crop 4 columns
  shifted = k2 + np.array([[0, 0, 0.5], [0, 0, 0.5], [0, 0, 0]])  # half a pixel off
  err, err_shifted = (np.abs(small - rendered(kk, (24, 24))).mean() for kk in (k2, shifted))
  assert err < 3 and err_shifted > 2 * err, (err, err_shifted)
  np.testing.assert_allclose(adjust_intrinsics(k, (48, 64), (48, 64)), k)


def test_latent_cameras_group_like_the_causal_vae():
  c2w = np.tile(np.eye(4), (9, 1, 1))
  c2w[:, :3, :3] = rotation_about_axis(np.radians(np.arange(9.0)), 1)
  c2w[:, 0, 3] = np.arange(9.0)
  k = np.tile(np.eye(3), (9, 1, 1))
  lc, lk = ing.latent_cameras(c2w, k, 4)
  assert lc.shape == (3, 4, 4) and lk.shape == (3, 3, 3)
  np.testing.assert_allclose(lc[0], c2w[0])
  np.testing.assert_allclose(lc[1:], downsample_poses(c2w[1:], 4))
  np.testing.assert_allclose(lc[1:, 0, 3], [2.5, 6.5])
  np.testing.assert_allclose(lc[1, :3, :3], rotation_about_axis(np.radians(2.5), 1), atol=1e-6)
  with pytest.raises(ValueError, match="8 frames are not 1 \\+ k \\* 4"):
    ing.latent_cameras(c2w[:8], k[:8], 4)


def test_record_round_trip():
  rec = {"latents": np.ones((2, 3, 3, 4), np.float16), "caption": "x", "meta": json.dumps({"a": 1})}
  back = decode_record(encode_record(rec))
  assert back["latents"].dtype == np.float16 and back["caption"] == "x" and json.loads(back["meta"]) == {"a": 1}


def _ingest(inputs, out, **kw):
  args = dict(cameras=inputs["cameras"], captions=inputs["captions"], height=32, width=32, clip_frames=5, stride=2,
              shard_size=2, batch_size=2, progress=False)
  return ing.ingest(inputs["videos"], out, **{**args, **kw})


def test_ingest_rejects_resumes_and_reads_back(inputs, tmp_path):
  out = tmp_path / "ds"
  r = _ingest(inputs, out)
  # stride 2: a 9 -> 5 frames (1 clip), b 17 -> 9 (1 clip), c 13 -> 7 (1 clip).
  assert (r["new_clips"], r["new_shards"], r["rejected"]) == (3, 2, 4), r["summary"]
  # c has no caption (the rejected videos have none either, and are not counted): named in the summary
  assert r["uncaptioned"] == ["c"] and "1 video(s) had no caption" in r["summary"] and ": c (" in r["summary"]
  manifest = json.loads((out / "manifest.json").read_text())
  assert [s["file"] for s in manifest["shards"]] == ["train-00000.array_record", "train-00001.array_record"]
  assert all((out / s["file"]).is_file() for s in manifest["shards"]) and not list(out.glob(".*tmp*"))
  assert manifest["done"]["train"] == {"a": 1, "b": 1, "c": 1}
  rejects = {x["video"]: x["reason"] for x in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
  assert set(rejects) == {"broken.mp4", "wrongcount.mp4", "nocam.mp4", "nanpose.mp4"}
  assert rejects["broken.mp4"].startswith("unreadable video")
  assert rejects["wrongcount.mp4"] == "pose count 8 (wrongcount.txt) does not match frame count 9"
  assert rejects["nocam.mp4"].startswith("missing camera file")
  assert rejects["nanpose.mp4"].startswith("bad camera file: ")
  assert "c2w at frame 3: non-finite" in rejects["nanpose.mp4"]

  before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
  again = _ingest(inputs, out)
  assert (again["new_clips"], again["new_shards"], again["rejected"], again["skipped"]) == (0, 0, 0, 7)
  assert again["uncaptioned"] == [] and "caption" not in again["summary"]
  strict = _ingest(inputs, tmp_path / "strict", require_captions=True)
  assert (strict["new_clips"], strict["rejected"], strict["uncaptioned"]) == (2, 5, [])
  reasons = {x["video"]: x["reason"] for x in map(json.loads, (tmp_path / "strict" / "rejects.jsonl").read_text()
                                                                .splitlines())}
  assert reasons["c.mp4"].startswith("no caption for 'c' in --captions=")
  with pytest.raises(ing.SettingsError, match="--require_captions: needs --captions"):
    _ingest(inputs, tmp_path / "none", captions=None, require_captions=True)
  assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before

  src = RecordClips(out, split="train")
  assert len(src) == 3 and src.latent_shape == (5, 8, 8, 48)
  for i in range(3):
    rec = src[i]
    meta = json.loads(rec["meta"])
    stem, clip = meta["stem"], inputs["clips"][meta["stem"]]
    assert rec["latents"].shape == (5, 8, 8, 48) and rec["first_frame"].shape == (32, 32, 3)
    np.testing.assert_array_equal(rec["source_frames"], [0, 2, 4, 6, 8])
    # Poses are exact (float64 from the camera file); pixels are within codec loss.
    np.testing.assert_allclose(rec["c2w"], clip["c2w"][rec["source_frames"]], atol=1e-5)
    np.testing.assert_allclose(rec["intrinsics"], clip["intrinsics"][rec["source_frames"]], atol=1e-5)
    pixels = np.asarray(vae.to_uint8(vae.decode(rec["latents"]))).astype(float)
    assert np.abs(pixels - clip["frames"][rec["source_frames"]]).mean() < 12
    np.testing.assert_array_equal(pixels[0], rec["first_frame"])
    assert rec["caption"] == {"a": "a room a", "b": "a room b", "c": ""}[stem]

  window = LatentWindow(3, frame_stride=2).random_map(src[0], np.random.default_rng(0))
  idx = window["latent_index"]
  np.testing.assert_array_equal(idx, [0, 2, 4])
  np.testing.assert_allclose(window["c2w"], reanchor(src[0]["c2w"][idx]), atol=1e-6)
  np.testing.assert_array_equal(window["latents"], src[0]["latents"][idx])
  starts = {int(LatentWindow(2).random_map(src[1], np.random.default_rng(s))["latent_index"][0]) for s in range(20)}
  assert len(starts) > 1
  first = LatentWindow(2, from_start=True).random_map(src[1], np.random.default_rng(3))
  assert first["latent_index"][0] == 0 and first["first_frame"].shape == (32, 32, 3)


def _wan_like():
  """A causal-VAE stand-in: space-to-depth of frame 0, then of the mean of each group of 4."""
  def fn(x):
    x = x.astype(np.float32)
    groups = x[:, 1:].reshape(x.shape[0], -1, 4, *x.shape[2:]).mean(axis=2)
    return vae.encode(np.concatenate([x[:, :1], groups], 1) / 127.5 - 1.0, 8)
  return encoders.LatentEncoder("wan_like", fn, temporal_stride=4, spatial_stride=8)


def test_causal_vae_and_text_encoder(inputs, tmp_path):
  text = encoders.CaptionEncoder("len", lambda caps: np.array([[[len(c)] * 4] * 3 for c in caps], np.float32))
  r = _ingest(inputs, tmp_path / "ds", clip_frames=9, stride=1, hop=4, encoder=_wan_like(), text_encoder=text,
              dtype="float16", max_clips_per_video=2)
  assert r["new_clips"] == 5, r["summary"]  # a: 1 clip, b: 2 (of 3), c: 2
  src = RecordClips(tmp_path / "ds")
  rec = src[0]
  assert rec["latents"].shape == (3, 4, 4, 192) and rec["latents"].dtype == np.float16
  assert rec["text_emb"].shape == (3, 4) and rec["text_emb"][0, 0] == len(rec["caption"])
  clip = inputs["clips"][json.loads(rec["meta"])["stem"]]
  lc, _ = ing.latent_cameras(clip["c2w"][rec["source_frames"]], clip["intrinsics"][rec["source_frames"]], 4)
  np.testing.assert_allclose(rec["c2w"], lc, atol=1e-6)


def test_cli(inputs, tmp_path, capsys):
  base = ["--videos", str(inputs["videos"]), "--cameras", str(inputs["cameras"]), "--height", "16", "--width", "16",
          "--clip_frames", "5", "--no_progress"]
  out = tmp_path / "ds"
  assert run_cli(ing.main, base + ["--out", str(out), "--fps", "5", "--vae", "space_to_depth:8"], "ingest") == 0
  assert "ingest: 7 videos: 3 new clips in 1 new shards, 4 rejected" in capsys.readouterr().out
  assert RecordClips(out)[0]["latents"].shape == (5, 2, 2, 192)
  refusals = [
      (["--height", "30"], "--height=30: must be a positive multiple of 4"),
      (["--fps", "5", "--stride", "2"], "--fps=5.0 and --stride=2: give one of them"),
      (["--fps", "nan"], "--fps=nan: must be a finite number > 0"),
      (["--vae", "/no/such/weights"], "--vae='/no/such/weights': expected a built-in name or 'module:factory'"),
      (["--vae", "nosuchmodule:make"], "--vae='nosuchmodule:make': cannot load (ModuleNotFoundError"),
      (["--dtype", "int8"], "--dtype='int8': must be one of 'float32', 'float16'"),
      (["--split", "a/b"], "--split='a/b': must be letters, digits or _"),
      (["--captions", str(inputs["cameras"])], "is the camera directory"),
      (["--require_captions"], "--require_captions: needs --captions"),
      (["--vae", "space_to_depth:8"], "holds clips made with other settings: fps=5.0 (now None), stride=None (now 1)"),
  ]
  for extra, message in refusals:
    assert run_cli(ing.main, base + ["--out", str(out)] + extra, "ingest") == 2, extra
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, (extra, err)
  with pytest.raises(ValueError, match="no finished shards of split 'eval'; it has \\['train'\\]"):
    RecordClips(out, split="eval")


def test_crash_then_resume(inputs, tmp_path):
  """A run that dies mid-way leaves only finished shards; the next run completes without duplicates."""
  good = encoders.space_to_depth_encoder()
  calls = []

  def flaky(x):
    calls.append(1)
    if len(calls) == 2:
      raise RuntimeError("power cut")
    return good.fn(x)

  out = tmp_path / "ds"
  with pytest.raises(RuntimeError, match="power cut"):
    _ingest(inputs, out, shard_size=1, batch_size=1, encoder=encoders.LatentEncoder(good.name, flaky, 1, 4))
  assert [s["clips"] for s in json.loads((out / "manifest.json").read_text())["shards"]] == [["a/0"]]
  (out / ".train-00001.array_record.tmp1").write_bytes(b"half a shard")
  r = _ingest(inputs, out, shard_size=1, batch_size=1)
  assert (r["new_clips"], r["total_clips"]) == (2, 3) and not list(out.glob(".*tmp*"))
  keys = [k for s in json.loads((out / "manifest.json").read_text())["shards"] for k in s["clips"]]
  assert keys == ["a/0", "b/0", "c/0"]
  # Rejected inputs were logged once, by the run that met them.
  assert len((out / "rejects.jsonl").read_text().splitlines()) == 4


def test_a_part_deletes_only_its_own_leftovers(inputs, tmp_path):
  """Process 1 of 2, starting while process 0 writes into the same folder, removes its own part's temporary files
  (a crash's leftovers) and none of process 0's or of the shared files' (which may be in flight). Deleting
  every ``.*.tmp*`` made two concurrent processes fail now and then (one renamed a file the other was deleting)."""
  out = tmp_path / "two"
  out.mkdir()
  mine = [".train-part001-of-002-00000.array_record.tmp11", ".manifest.part001-of-002.json.tmp11",
          ".rejects.part001-of-002.jsonl.tmp11"]
  theirs = [".train-part000-of-002-00000.array_record.tmp22", ".manifest.part000-of-002.json.tmp22",
            ".rejects.part000-of-002.jsonl.tmp22", ".manifest.json.tmp22", ".rejects.jsonl.tmp22",
            ".null_text.npy.tmp22", ".train-part001-of-020-00000.array_record.tmp33"]
  for name in mine + theirs:
    (out / name).write_bytes(b"partial")
  assert [p.name for p in ingest_parts.leftovers(out, 1, 2)] == sorted(mine)
  assert len(ingest_parts.leftovers(out, 0, 1)) == len(mine + theirs)  # one process: every leftover is its own
  r = _ingest(inputs, out, process_index=1, process_count=2)
  assert "(process 1 of 2" in r["summary"] and r["new_clips"] == 2, r["summary"]
  assert sorted(p.name for p in out.glob(".*tmp*")) == sorted(theirs)


def test_grain_loader_over_records(inputs, tmp_path):
  import grain.python as grain  # pylint: disable=g-import-not-at-top
  _ingest(inputs, tmp_path / "ds")
  src = RecordClips(tmp_path / "ds")
  sampler = grain.IndexSampler(num_records=len(src), shard_options=grain.NoSharding(), shuffle=True, num_epochs=1,
                               seed=0)
  loader = grain.DataLoader(data_source=src, sampler=sampler, worker_count=0,
                            operations=[LatentWindow(3, frame_stride=2), grain.Batch(2, drop_remainder=True)])
  batch = next(iter(loader))
  assert batch["latents"].shape == (2, 3, 8, 8, 48) and batch["c2w"].shape == (2, 3, 4, 4)
  np.testing.assert_allclose(batch["c2w"][:, 0], np.broadcast_to(np.eye(4), (2, 4, 4)), atol=1e-6)


def test_plug_in_encoders_load_from_a_file(tmp_path):
  """``--vae`` / ``--text_encoder`` as ``file.py:factory``: the factory's :mod:`jaxwm.encoders` protocol object is
  used; a factory returning something else is refused in one line naming the flag."""
  plugin = tmp_path / "my_encoders.py"
  plugin.write_text("import numpy as np\n"
                    "from jaxwm import encoders\n"
                    "def text():\n"
                    "  return encoders.CaptionEncoder('bag', lambda caps: np.ones((len(caps), 3, 8), np.float32))\n"
                    "def latent():\n"
                    "  return encoders.space_to_depth_encoder(2)\n"
                    "def wrong():\n"
                    "  return 42\n")
  text = ing.make_text_encoder(f"{plugin}:text")
  assert text.name == "bag" and text.fn(["a", "b"]).shape == (2, 3, 8)
  assert ing.make_encoder(f"{plugin}:latent").spatial_stride == 2
  with pytest.raises(ing.SettingsError, match=r"--text_encoder=.*the factory must return a CaptionEncoder"):
    ing.make_text_encoder(f"{plugin}:wrong")
  with pytest.raises(ing.SettingsError, match=r"--vae=.*the factory must return a LatentEncoder"):
    ing.make_encoder(f"{plugin}:wrong")


def test_a_damaged_shard_is_named(inputs, tmp_path):
  """A shard that became unreadable after ingestion (a bad disk, a partial copy): opening the dataset raises one
  line naming the shard file, not an anonymous decoder error. (A record that fails to decode later is named
  with its shard and position the same way.)"""
  _ingest(inputs, tmp_path / "ds", clip_frames=5, stride=2, shard_size=2)
  src = RecordClips(tmp_path / "ds")
  good = [src[i] for i in range(len(src))]
  manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
  shards = [sh for sh in manifest["shards"] if sh["split"] == "train"]
  last = len(src) - 1  # the last record: the last shard's last one
  real = src._source  # pylint: disable=protected-access
  src._source = {**{i: real[i] for i in range(last)}, last: b"not a record"}  # pylint: disable=protected-access
  with pytest.raises(records.DamagedRecordError,
                     match=rf"record {last} of split 'train', shard {shards[-1]['file']} \(record "
                           rf"{shards[-1]['num_clips'] - 1} of it\), is unreadable"):
    src[last]
  shard = sorted((tmp_path / "ds").glob("train-*"))[-1]
  data = bytearray(shard.read_bytes())
  data[16:len(data) - 64] = bytes(len(data) - 80)  # the records' bytes zeroed, the footer kept
  shard.write_bytes(bytes(data))
  with pytest.raises(records.DamagedRecordError, match=rf"shard {shard.name} of split 'train' cannot be opened"):
    RecordClips(tmp_path / "ds")
  assert len(good) >= 2


def test_two_processes_equal_one(inputs, tmp_path):
  """Two concurrent ``python -m jaxwm.data.ingest`` processes (``--process_index 0/1 --process_count 2``) into one
  folder: each writes its share's shards and part manifest, the last to finish merges ``manifest.json``, and the
  dataset holds the records a one-process run writes (every record equal, byte for byte), the same rejects (a
  duplicate stem in another process's share included); a rerun resumes per process, another count is refused."""
  import os  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  vids = tmp_path / "videos"
  shutil.copytree(inputs["videos"], vids)
  shutil.copy(vids / "a.mp4", vids / "a.mov")  # a duplicate stem: one-process rejects the later one
  args = ["--videos", str(vids), "--cameras", str(inputs["cameras"]), "--captions", str(inputs["captions"]),
          "--height", "32", "--width", "32", "--clip_frames", "5", "--stride", "2", "--shard_size", "1",
          "--no_progress"]
  assert run_cli(ing.main, args + ["--out", str(tmp_path / "one")], "ingest") == 0
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}

  def launch(i, n=2):
    return subprocess.Popen([sys.executable, "-m", "jaxwm.data.ingest", *args, "--out", str(tmp_path / "two"),
                             "--process_index", str(i), "--process_count", str(n)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  procs = [launch(0), launch(1)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  assert any("every part is finished" in o for o, _ in outs), outs
  assert sum("(process 0 of 2: 4 of 8)" in o or "(process 1 of 2: 4 of 8)" in o for o, _ in outs) == 2
  one, two = RecordClips(tmp_path / "one"), RecordClips(tmp_path / "two")
  m1, m2 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("one", "two"))
  assert m2["processes"] == 2 and m2["settings"] == m1["settings"] and m2["done"] == m1["done"]
  keys = lambda m: sorted(k for sh in m["shards"] for k in sh["clips"])  # pylint: disable=unnecessary-lambda-assignment
  assert keys(m1) == keys(m2) == ["a/0", "b/0", "c/0"]
  # Sorted, process 0 takes a.mov, b, c, nocam and process 1 a.mp4 (the duplicate), broken, nanpose, wrongcount.
  assert {sh["file"].split("-of-")[0] for sh in m2["shards"]} == {"train-part000"}
  by_key = lambda src: {json.loads(src[i]["meta"])["stem"]: src[i] for i in range(len(src))}  # pylint: disable=unnecessary-lambda-assignment
  r1, r2 = by_key(one), by_key(two)
  for stem in r1:
    assert r1[stem].keys() == r2[stem].keys()
    for k in r1[stem]:
      np.testing.assert_array_equal(r1[stem][k], r2[stem][k], err_msg=f"{stem} {k}")
  rejects = lambda d: sorted(json.loads(x)["video"] for x in (d / "rejects.jsonl").read_text().splitlines())  # pylint: disable=unnecessary-lambda-assignment
  assert rejects(tmp_path / "one") == rejects(tmp_path / "two") == sorted(
      ["a.mp4", "broken.mp4", "nanpose.mp4", "nocam.mp4", "wrongcount.mp4"])
  assert (tmp_path / "two" / "null_text.npy").exists() == (tmp_path / "one" / "null_text.npy").exists()
  again = launch(1)
  out, err = again.communicate(timeout=300)
  assert again.returncode == 0 and "0 new clips" in out and "every part is finished" in out, (out, err)
  wrong = launch(0, 3)
  out, err = wrong.communicate(timeout=300)
  assert wrong.returncode == 2 and "parts of an ingestion by [2] process(es)" in err and err.count("\n") == 1, err
