"""The viewer (jaxwm.play): a walk is deterministic and flies back to frame 0 exactly; the server streams chunks
over a WebSocket, merges input while generating, refuses malformed messages and sessions beyond its maximum with
a message, survives a disconnect mid-chunk, and records an MP4."""

import asyncio
import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

aiohttp = pytest.importorskip("aiohttp")
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from jaxwm.play.engine import Model, Player, first_frame  # noqa: E402
from jaxwm.play.server import App  # noqa: E402
from jaxwm.sampling.controls import Controls  # noqa: E402
from jaxwm.sampling.load import load_model  # noqa: E402


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
  workdir, _, _ = tiny_checkpoint
  config, m, variables, step = load_model(workdir)
  return Model(config, m, variables, step, max_frames=9)


def test_a_walk_is_deterministic_and_flies_back_to_frame_0(model):
  first, k = first_frame(model, 3)
  runs = []
  for _ in range(2):
    p = Player(model, first, k, memory="window", steps=2, controls=Controls(speed=0.1, turn=10.0))
    out = [p.step(["w", "right"])["frames"], p.step([], drag=(30.0, -5.0))["frames"]]
    runs.append(np.concatenate(out))
  np.testing.assert_array_equal(runs[0], runs[1])
  assert runs[0].shape == (2 * model.chunk, *model.frame_hw, 3) and runs[0].dtype == np.uint8
  back = p.step(back=True)
  while back["returning"]:
    back = p.step()
  np.testing.assert_array_equal(p.pose, np.eye(4))
  assert back["resident"][0] == 0 and p.room_left() is None  # a bounded memory: no end
  full = Player(model, first, k, memory="full", steps=2)
  while full.room_left() >= model.chunk:
    full.step(["w"])
  with pytest.raises(ValueError, match="the full memory is full"):
    full.step(["w"])
  with pytest.raises(ValueError, match="memory='lru'"):
    Player(model, first, k, memory="lru")
  with pytest.raises(ValueError, match="steps=0"):
    Player(model, first, k, steps=0)
  with pytest.raises(ValueError, match="no text conditioning"):
    Player(model, first, k, prompt="a red room")
  with pytest.raises(ValueError, match=r"first frame is \(8, 8, 3\)"):
    Player(model, first[:8, :8], k)
  img = np.zeros((40, 60, 3), np.uint8)
  img[:, 30:] = 255
  assert first_frame(model, image=img)[0].shape == (*model.frame_hw, 3)


def _png_shape(url):
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))).shape


async def _receive(ws, kind, timeout=120):
  while True:
    msg = await asyncio.wait_for(ws.receive_json(), timeout)
    if msg["type"] == kind:
      return msg
    assert msg["type"] not in ("error", "refused") or kind in ("error", "refused"), msg


def test_the_server_streams_refuses_and_survives(model, tmp_path):
  async def scenario():
    app = App(model, memory="window", steps=2, max_sessions=1, out_dir=tmp_path)
    async with TestClient(TestServer(app.web_app())) as client:
      page = await client.get("/")
      assert page.status == 200 and "WebSocket" in await page.text()
      ws = await client.ws_connect("/ws")
      hello = await _receive(ws, "hello")
      assert hello["memory"] == "window" and "landmark" in hello["memories"] and hello["chunk"] == model.chunk

      other = await client.ws_connect("/ws")  # beyond --max-sessions
      refused = await _receive(other, "refused")
      assert "at most 1 walks" in refused["reason"]
      await other.close()

      await ws.send_json({"type": "start", "clip": 2, "memory": "landmark", "steps": 2})
      await _receive(ws, "started")
      await ws.send_json({"type": "record", "on": True})
      await ws.send_json({"type": "input", "keys": ["w"], "drag": [3, 0]})
      chunk = await _receive(ws, "chunk")
      assert len(chunk["frames"]) == model.chunk and len(chunk["path"]) == model.chunk
      assert _png_shape(chunk["frames"][0]) == (*model.frame_hw, 3)
      for _ in range(5):  # held keys and drags while a chunk generates: merged, not queued
        await ws.send_json({"type": "input", "keys": ["w", "left"], "drag": [1, 1]})
      await ws.send_json({"type": "input", "keys": []})
      await ws.send_json({"type": "record", "on": False})
      rec = await _receive(ws, "recording")
      got = await client.get(rec["url"])
      assert got.status == 200 and len(await got.read()) > 1000 and rec["frames"] >= model.chunk

      for bad, words in (("not json", "Expecting value"), (json.dumps([1]), "JSON object"),
                         (json.dumps({"type": "jump"}), "type='jump'"),
                         (json.dumps({"type": "input", "keys": ["x"]}), "keys="),
                         ('{"type": "input", "keys": [], "drag": [NaN, 0]}', "drag="),
                         (json.dumps({"type": "start", "clip": 99}), "clip=99"),
                         (json.dumps({"type": "start", "memory": "lru"}), "memory='lru'")):
        await ws.send_str(bad)
        err = await _receive(ws, "error")
        assert words in err["message"], (bad, err)

      await ws.send_json({"type": "input", "keys": ["d"]})
      await ws.close()  # mid-chunk
      for _ in range(200):
        if not app.walks:
          break
        await asyncio.sleep(0.05)
      assert not app.walks
      again = await client.ws_connect("/ws")  # the server is still up, with the slot free
      await _receive(again, "hello")
      await again.close()
  asyncio.run(scenario())
