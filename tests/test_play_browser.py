"""The viewer in a real browser: headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it) driven by
Playwright loads the page served by :class:`jaxwm.play.server.App`, presses keys, and sees the reported pose move
the way each key says (``w``: forward along +z; the right arrow: yaw towards +x) while frames arrive and change
on the canvas; a screenshot is saved (``JAXWM_PLAY_SCREENSHOT`` names where, else the test's tmp dir)."""

import asyncio
import json
import os
import shutil
import threading

import pytest

aiohttp = pytest.importorskip("aiohttp")
sync_api = pytest.importorskip("playwright.sync_api")
from aiohttp import web  # noqa: E402

from jaxwm.play.engine import Model  # noqa: E402
from jaxwm.play.server import App  # noqa: E402
from jaxwm.sampling.controls import Controls  # noqa: E402
from jaxwm.sampling.load import load_model  # noqa: E402

CHROMIUM = os.environ.get("JAXWM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")


class _Server:
  """The app on 127.0.0.1 (a free port) in a thread with its own event loop."""

  def __init__(self, app):
    self.loop = asyncio.new_event_loop()
    self.runner = web.AppRunner(app.web_app())
    self.loop.run_until_complete(self.runner.setup())
    site = web.TCPSite(self.runner, "127.0.0.1", 0)
    self.loop.run_until_complete(site.start())
    self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"  # pylint: disable=protected-access
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.thread.start()

  def close(self):
    asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(30)


def _pose(page):
  raw = page.get_attribute("#pose", "data-pose")
  return json.loads(raw) if raw else None


def _canvas(page):
  return page.evaluate("document.getElementById('view').toDataURL()")


def _hold(page, key, until, app, timeout_s=120):
  """Holds ``key`` until ``until(pose)`` holds for the reported pose, releases it and waits for the chunk in
  flight (generated with the key still held: the server's one generation thread goes idle, then its message
  arrives); returns the pose then."""
  page.keyboard.down(key)
  try:
    page.wait_for_function(f"""() => {{ const r = document.getElementById('pose').dataset.pose;
      if (!r) return false; const p = JSON.parse(r); return {until}; }}""", timeout=timeout_s * 1000, polling=100)
  finally:
    page.keyboard.up(key)
  page.wait_for_timeout(300)  # the release reaches the server
  app.executor.submit(lambda: None).result(timeout_s)  # the chunk in flight is done
  seen = None
  for _ in range(timeout_s * 2):  # settled: no new chunk for 1.5 s
    now = page.text_content("#stats")
    if now == seen:
      break
    seen = now
    page.wait_for_timeout(1500)
  return _pose(page)


def test_keys_in_a_browser_move_the_reported_pose_and_stream_frames(tiny_checkpoint, tmp_path):
  workdir, _, _ = tiny_checkpoint
  config, m, variables, step = load_model(workdir)
  model = Model(config, m, variables, step, max_frames=9)
  app = App(model, memory="window", steps=2, controls=Controls(speed=0.1, turn=1.0), out_dir=tmp_path)
  server = _Server(app)
  try:
    with sync_api.sync_playwright() as pw:
      browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
      page = browser.new_page(viewport={"width": 960, "height": 640})
      errors = []
      page.on("pageerror", lambda e: errors.append(str(e)))
      page.goto(server.url)
      page.wait_for_function("() => document.getElementById('status').textContent.startsWith('ready')",
                             timeout=120_000)
      page.wait_for_timeout(300)  # the first frame's image decodes onto the canvas
      first = _canvas(page)

      fwd = _hold(page, "w", "p.xyz[2] > 0.15", app)  # forward: +z in the first camera's frame
      assert abs(fwd["xyz"][0]) < 1e-3 and abs(fwd["xyz"][1]) < 1e-3 and abs(fwd["yaw"]) < 1e-3, fwd
      page.wait_for_timeout(600)  # frames play at 8 per second from the page's queue
      moved = _canvas(page)
      assert moved != first  # frames arrived and were drawn

      # The right arrow: the view turns towards +x (1 degree a frame, so the page sees it long before +-180).
      right = _hold(page, "ArrowRight", "p.yaw > 3", app)
      assert 3 < right["yaw"] < 170 and abs(right["pitch"]) < 1e-3, right
      assert right["xyz"] == pytest.approx(fwd["xyz"], abs=1e-6), right
      page.wait_for_timeout(600)
      assert _canvas(page) != moved
      stats = page.text_content("#stats")
      assert stats.startswith("fps ") and "latency" in stats and " frame " in stats, stats
      assert int(stats.split(" frame ")[1].split(",")[0]) >= 2 * model.chunk, stats
      assert not errors, errors
      shot = os.environ.get("JAXWM_PLAY_SCREENSHOT") or str(tmp_path / "viewer.png")
      page.screenshot(path=shot)
      assert os.path.getsize(shot) > 10_000
      browser.close()
  finally:
    server.close()
