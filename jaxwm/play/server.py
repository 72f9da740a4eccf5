"""Drive a trained world model in the browser: ``jaxwm-play --workdir runs/tiny`` (or ``python -m jaxwm.play``).

  jaxwm-play --workdir runs/tiny [--adapter runs/tiny_distill] [--memory landmark] [--steps 2] [--port 8000]

Starts a local aiohttp server (bound to 127.0.0.1 unless ``--host`` says otherwise) and prints its URL. The
page streams what the camera sees as you steer it (``w a s d`` move, ``r f`` up / down, arrows or a mouse drag
turn; ``b`` flies back to the first view), with frames per second, per-chunk latency, a top-down map of the
path with the frames the memory keeps, a choice of first frame (an eval scene or an uploaded image), memory
policy and step count, a prompt for a text-conditioned model, reset, and recording to MP4. A model trained on
ingested videos (VAE latents) streams the same way, each chunk decoded by its VAE as it arrives.

One walk per WebSocket connection, at most ``--max-sessions`` at once (a further one is refused with a
message). Chunks are generated off the event loop, one at a time for the whole server; input that arrives
while a chunk is generating is merged (the keys held now, the drag summed), never queued. A malformed message
is answered with an error and logged; a connection that closes mid-chunk is cleaned up when the chunk ends.

Messages (JSON, page -> server): ``{"type": "start", "clip": k | "image": "<data URL>", "memory": name,
"steps": n, "prompt": text}``, ``{"type": "input", "keys": [...], "drag": [dx, dy]}``, ``{"type": "back"}``,
``{"type": "record", "on": true | false}``. Server -> page: ``hello`` (options), ``started``, ``chunk``
(frames as PNG data URLs, stats, the path's new points, resident frames), ``recording`` (the MP4's URL),
``error``, ``refused``.
"""

import asyncio
import base64
import concurrent.futures
import io
import json
import logging
import math
import pathlib
import sys
import tempfile
import uuid

import numpy as np

from jaxwm.settings import Choice, Int
from jaxwm.utils.cli import IsDir, Parser, Refusal
from jaxwm.utils.cli import run as run_cli

log = logging.getLogger("jaxwm.play")
MAX_MESSAGE = 4 << 20  # bytes: an uploaded first frame fits
MAX_RECORD = 3000  # frames kept for one recording
MAX_RECORDINGS = 20  # recordings kept for download
NUM_CLIPS = 35


def _png(frame):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  Image.fromarray(np.asarray(frame, np.uint8)).save(buf, format="PNG")
  return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image(data_url):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if not isinstance(data_url, str) or "," not in data_url:
    raise ValueError("image: must be a data URL")
  try:
    im = Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1], validate=True)))
    return np.asarray(im.convert("RGB"))
  except Exception as e:  # pylint: disable=broad-except  (PIL raises several kinds for a non-image)
    raise ValueError(f"image: not a readable image ({type(e).__name__})") from None


class _Walk:
  """One connection's state: its player, the merged input, the recording."""

  def __init__(self):
    self.player = None
    self.keys, self.drag, self.back = (), [0.0, 0.0], False
    self.record = None
    self.wake = asyncio.Event()


class App:
  """The server: the loaded model, the options, the sessions."""

  def __init__(self, model, *, memory="landmark", steps=None, max_sessions=4, controls=None, out_dir=None):
    self.model, self.memory, self.steps, self.max_sessions = model, memory, steps, max_sessions
    self.controls = controls
    self.walks = set()
    self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxwm-play")  # one chunk at a time
    self.out_dir = pathlib.Path(out_dir or tempfile.mkdtemp(prefix="jaxwm_play_"))
    self.recordings = {}

  def web_app(self):
    from aiohttp import web  # pylint: disable=g-import-not-at-top
    from jaxwm.play.page import PAGE  # pylint: disable=g-import-not-at-top
    app = web.Application(client_max_size=MAX_MESSAGE)
    async def page(request):
      del request
      return web.Response(text=PAGE, content_type="text/html")

    app.router.add_get("/", page)
    app.router.add_get("/ws", self.websocket)
    app.router.add_get("/recording/{name}", self.recording)
    return app

  async def recording(self, request):
    from aiohttp import web  # pylint: disable=g-import-not-at-top
    path = self.recordings.get(request.match_info["name"])
    if path is None:
      raise web.HTTPNotFound()
    return web.FileResponse(path, headers={"Content-Disposition": f"attachment; filename={path.name}"})

  async def websocket(self, request):
    from aiohttp import WSMsgType, web  # pylint: disable=g-import-not-at-top
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, heartbeat=30)
    await ws.prepare(request)
    if len(self.walks) >= self.max_sessions:
      await ws.send_json({"type": "refused", "reason": f"the server runs at most {self.max_sessions} walks at once "
                                                       "(--max-sessions); try again later"})
      await ws.close()
      return ws
    walk = _Walk()
    self.walks.add(walk)
    log.info("walk opened (%d of at most %d)", len(self.walks), self.max_sessions)
    runner = asyncio.create_task(self._generate(ws, walk))
    try:
      await ws.send_json({"type": "hello", "memories": self._memories(), "memory": self.memory,
                          "steps": self.steps or int(self.model.config.sample.num_steps), "clips": NUM_CLIPS,
                          "chunk": self.model.chunk, "size": list(self.model.frame_hw),
                          "text": self.model.text})
      async for msg in ws:
        if msg.type != WSMsgType.TEXT:
          await self._error(ws, "messages must be JSON text")
          continue
        try:
          await self._handle(ws, walk, json.loads(msg.data))
        except (ValueError, TypeError, KeyError) as e:
          await self._error(ws, " ".join(str(e).split()))
        except Exception as e:  # pylint: disable=broad-except  (an unreadable upload, a failed write: the walk goes on)
          log.exception("a message failed")
          await self._error(ws, f"{type(e).__name__}: {' '.join(str(e).split())}")
    finally:
      runner.cancel()
      self.walks.discard(walk)
      log.info("walk closed (%d open)", len(self.walks))
    return ws

  def _memories(self):
    from jaxwm.memory import POLICIES  # pylint: disable=g-import-not-at-top
    return list(POLICIES)

  async def _error(self, ws, message):
    log.warning("refused a message: %s", message)
    if not ws.closed:
      await ws.send_json({"type": "error", "message": message})

  async def _handle(self, ws, walk, msg):
    from jaxwm.play.engine import Player, first_frame  # pylint: disable=g-import-not-at-top
    from jaxwm.sampling.controls import KEYS  # pylint: disable=g-import-not-at-top
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
      raise ValueError("a message is a JSON object with a 'type'")
    kind = msg["type"]
    if kind == "start":
      clip, image = msg.get("clip", 0), msg.get("image")
      Int(0, NUM_CLIPS - 1)("clip", clip)
      Choice(self._memories())("memory", msg.get("memory", self.memory))
      steps = msg.get("steps", self.steps)
      first, k = await asyncio.get_running_loop().run_in_executor(
          self.executor, lambda: first_frame(self.model, clip, None if image is None else _image(image)))
      player = await asyncio.get_running_loop().run_in_executor(
          self.executor, lambda: Player(self.model, first, k, memory=msg.get("memory", self.memory), steps=steps,
                                        controls=self.controls, prompt=msg.get("prompt", "")))
      walk.player, walk.keys, walk.drag, walk.back = player, (), [0.0, 0.0], False
      await ws.send_json({"type": "started", "first": _png(first), "memory": player.memory_name,
                          "steps": player.steps})
    elif kind == "input":
      keys, drag = msg.get("keys", []), msg.get("drag", [0, 0])
      if not isinstance(keys, list) or any(k not in KEYS for k in keys):
        raise ValueError(f"keys={keys!r:.80}: must be a list of {', '.join(KEYS)}")
      if (not isinstance(drag, list) or len(drag) != 2 or
          not all(isinstance(v, (int, float)) and math.isfinite(v) and abs(v) < 1e4 for v in drag)):
        raise ValueError(f"drag={drag!r:.80}: must be [dx, dy], finite pixels under 10000")
      walk.keys = tuple(dict.fromkeys(keys))
      walk.drag = [walk.drag[0] + drag[0], walk.drag[1] + drag[1]]  # merged while a chunk generates
    elif kind == "back":
      walk.back = True
    elif kind == "record":
      if msg.get("on"):
        walk.record = []
      elif walk.record is not None:
        frames, walk.record = walk.record, None
        url = await asyncio.get_running_loop().run_in_executor(None, self._write_recording, frames)
        await ws.send_json({"type": "recording", "url": url, "frames": len(frames)})
    else:
      raise ValueError(f"type={kind!r}: must be start, input, back or record")
    walk.wake.set()

  def _write_recording(self, frames):
    from jaxwm.utils.media import write_video  # pylint: disable=g-import-not-at-top
    if not frames:
      raise ValueError("the recording has no frames")
    name = f"walk_{uuid.uuid4().hex[:8]}.mp4"
    path = self.out_dir / name
    write_video(path, np.stack(frames), fps=8, scale=max(1, 256 // max(self.model.frame_hw)))
    self.recordings[name] = path
    while len(self.recordings) > MAX_RECORDINGS:  # the oldest go: a long-running server keeps a bounded folder
      old = self.recordings.pop(next(iter(self.recordings)))
      old.unlink(missing_ok=True)
    return f"/recording/{name}"

  async def _generate(self, ws, walk):
    """Generates a chunk whenever keys are held, a drag is pending or the way back goes on."""
    loop = asyncio.get_running_loop()
    while not ws.closed:
      await walk.wake.wait()
      walk.wake.clear()
      while walk.player is not None and not ws.closed and (walk.keys or any(walk.drag) or walk.back):
        keys, drag, back = walk.keys, walk.drag, walk.back
        walk.drag, walk.back = [0.0, 0.0], False
        player = walk.player
        try:
          out = await loop.run_in_executor(self.executor, lambda: player.step(keys, drag, back))  # pylint: disable=cell-var-from-loop
        except ValueError as e:  # the full memory is full, ...
          walk.keys, walk.back = (), False
          await self._error(ws, str(e))
          break
        except Exception as e:  # pylint: disable=broad-except  (the server stays up; the walk can be reset)
          log.exception("a chunk failed")
          walk.keys, walk.back = (), False
          await self._error(ws, f"generating the chunk failed ({type(e).__name__}: {e}); reset to start again")
          break
        if ws.closed or player is not walk.player:
          break  # closed or reset mid-chunk: the chunk is dropped
        walk.back = walk.back or out["returning"]  # a "back" that arrived meanwhile is kept
        if walk.record is not None and len(walk.record) < MAX_RECORD:
          walk.record.extend(out["frames"])
        await ws.send_json({"type": "chunk", "frames": [_png(f) for f in out["frames"]],
                            "latency_s": out["latency_s"], "path": out["path"], "resident": out["resident"],
                            "frame": out["frame"], "returning": out["returning"], "pose": out["pose"],
                            "room_left": player.room_left()})


def _parser():
  from jaxwm.memory import POLICIES  # pylint: disable=g-import-not-at-top
  p = Parser(prog="jaxwm-play", description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="runs/tiny", check=IsDir("a training workdir or checkpoint directory"),
                 help="training workdir (default runs/tiny)")
  p.add_argument("--adapter", check=IsDir("a distillation workdir or its adapter/"),
                 help="a distilled LoRA adapter, merged in (its few-step settings become the defaults)")
  p.add_argument("--memory", default="landmark", check=Choice(tuple(POLICIES)), help="default memory policy")
  p.add_argument("--steps", type=int, check=Int(1, 50), help="Euler steps per chunk (default: the checkpoint's)")
  p.add_argument("--max-frames", type=int, default=65, check=Int(2), help="frames the full memory holds")
  p.add_argument("--frame-size", help="HxW frames of a records-trained model whose dataset (its manifest.json) "
                 "is not on this machine")
  p.add_argument("--max-sessions", type=int, default=4, check=Int(1), help="walks at once")
  p.add_argument("--speed", type=float, default=0.05, help="translation per frame (the model's units)")
  p.add_argument("--turn", type=float, default=5.0, help="degrees per frame")
  p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
  p.add_argument("--port", type=int, default=8000, check=Int(0, 65535))
  return p


def _main(argv):
  args = _parser().parse_args(argv)
  from jaxwm.play.engine import Model  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.controls import Controls  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  try:
    controls = Controls(speed=args.speed, turn=args.turn)
  except ValueError as e:
    raise Refusal(e) from None
  try:
    config, model, variables, step = load_model(args.workdir)
  except (FileNotFoundError, ValueError) as e:
    raise Refusal(e) from None
  if args.adapter:
    from jaxwm.distill.student import apply_adapter  # pylint: disable=g-import-not-at-top
    try:
      variables, note = apply_adapter(config, variables, args.adapter)
    except (FileNotFoundError, ValueError) as e:
      raise Refusal(f"--adapter={args.adapter!r}: {e}") from None
    print(f"jaxwm-play: {note}")
  from aiohttp import web  # pylint: disable=g-import-not-at-top
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  hw = None
  if args.frame_size is not None:
    import re  # pylint: disable=g-import-not-at-top
    m = re.fullmatch(r"(\d+)x(\d+)", args.frame_size.strip())
    if not m:
      raise Refusal(f"--frame-size={args.frame_size!r}: must be HxW in pixels, e.g. 480x832")
    hw = (int(m.group(1)), int(m.group(2)))
  try:
    viewer_model = Model(config, model, variables, step, args.max_frames, frame_hw=hw)
  except (ValueError, OSError) as e:
    if str(e).startswith("frame_hw="):
      raise Refusal(f"--frame-size={args.frame_size!r}: {str(e).split(': ', 1)[1]}") from None
    raise Refusal(f"--workdir={args.workdir!r}: {e}") from None
  app = App(viewer_model, memory=args.memory, steps=args.steps,
            max_sessions=args.max_sessions, controls=controls)
  print(f"jaxwm-play: {args.workdir} step {step}; open http://{args.host}:{args.port}/ (Ctrl-C stops)", flush=True)
  web.run_app(app.web_app(), host=args.host, port=args.port, print=None)
  return 0


def main(argv=None):
  """``jaxwm-play ARGV`` / ``python -m jaxwm.play ARGV``; returns the exit code (2: a refused argument)."""
  return run_cli(_main, sys.argv[1:] if argv is None else argv, "jaxwm-play")
