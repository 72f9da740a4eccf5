"""The viewer's page (one file, no build step): the stream, the keys, stats, the map, the options."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>jaxwm play</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 16px; background: #111; color: #ddd; }
 #row { display: flex; gap: 16px; align-items: flex-start; }
 #view { width: 512px; height: 512px; image-rendering: pixelated; background: #000; border: 1px solid #444; }
 #map { width: 256px; height: 256px; background: #1b1b1b; border: 1px solid #444; }
 .panel { display: flex; flex-direction: column; gap: 8px; }
 button, select, input { font: inherit; }
 #stats, #pose { font-variant-numeric: tabular-nums; }
 #status { color: #fc6; min-height: 1.2em; }
 kbd { border: 1px solid #666; border-radius: 3px; padding: 0 4px; }
</style></head><body>
<h3>jaxwm: drive the world model</h3>
<div id="row">
 <canvas id="view" width="512" height="512"></canvas>
 <div class="panel">
  <div id="stats">fps -, latency - ms, frame 0</div>
  <div id="pose">x 0.00 y 0.00 z 0.00, yaw 0.0&deg;, pitch 0.0&deg;</div>
  <canvas id="map" width="256" height="256"></canvas>
  <div>map: path (grey), frames in memory (green), camera (white)</div>
  <label>first frame: eval scene <input id="clip" type="number" min="0" value="0" style="width:4em"></label>
  <label>or an image <input id="image" type="file" accept="image/*"></label>
  <label>memory <select id="memory"></select></label>
  <label>steps <input id="steps" type="number" min="1" max="50" style="width:4em"></label>
  <label id="promptrow" hidden>prompt <input id="prompt" type="text" maxlength="1000" style="width:16em"></label>
  <button id="reset">reset</button>
  <button id="back">back to the first view (<kbd>b</kbd>)</button>
  <button id="record">record MP4</button>
  <div><kbd>w</kbd><kbd>a</kbd><kbd>s</kbd><kbd>d</kbd> move, <kbd>r</kbd>/<kbd>f</kbd> up/down,
   arrows or drag to turn</div>
  <div id="status"></div>
 </div>
</div>
<script>
const view = document.getElementById("view"), vctx = view.getContext("2d");
vctx.imageSmoothingEnabled = false;
const map = document.getElementById("map"), mctx = map.getContext("2d");
const $ = (id) => document.getElementById(id);
const KEYMAP = {w: "w", a: "a", s: "s", d: "d", r: "r", f: "f", ArrowLeft: "left", ArrowRight: "right",
                ArrowUp: "up", ArrowDown: "down"};
let refused = null, ws, held = new Set(), path = [[0, 0]], resident = [], queue = [], times = [], recording = false, imageURL = null;
function status(t) { $("status").textContent = t; }
function send(m) { if (ws && ws.readyState === 1) ws.send(JSON.stringify(m)); }
function sendInput(drag) { send({type: "input", keys: [...held], drag: drag || [0, 0]}); }
function start() {
  path = [[0, 0]]; resident = [0]; queue = []; times = []; drawMap();
  $("pose").textContent = "x 0.00 y 0.00 z 0.00, yaw 0.0\u00b0, pitch 0.0\u00b0"; delete $("pose").dataset.pose;
  const m = {type: "start", memory: $("memory").value, steps: parseInt($("steps").value)};
  if (!$("promptrow").hidden) m.prompt = $("prompt").value;
  if (imageURL) m.image = imageURL; else m.clip = parseInt($("clip").value) || 0;
  send(m); status("starting ...");
}
function show(src) { const im = new Image(); im.onload = () => vctx.drawImage(im, 0, 0, view.width, view.height); im.src = src; }
function drawMap() {
  mctx.fillStyle = "#1b1b1b"; mctx.fillRect(0, 0, 256, 256);
  const xs = path.map(p => p[0]), zs = path.map(p => p[1]);
  const span = Math.max(1e-3, xs.concat(zs).reduce((a, v) => Math.max(a, Math.abs(v)), 0)) * 1.2;
  const px = (p) => [128 + 120 * p[0] / span, 128 - 120 * p[1] / span];
  mctx.strokeStyle = "#888"; mctx.beginPath();
  path.forEach((p, i) => { const [x, y] = px(p); i ? mctx.lineTo(x, y) : mctx.moveTo(x, y); }); mctx.stroke();
  mctx.fillStyle = "#3c3";
  resident.forEach(f => { if (path[f]) { const [x, y] = px(path[f]); mctx.fillRect(x - 2, y - 2, 5, 5); } });
  const [cx, cy] = px(path[path.length - 1]); mctx.fillStyle = "#fff"; mctx.fillRect(cx - 3, cy - 3, 7, 7);
}
setInterval(() => { if (queue.length) show(queue.shift()); }, 125);  // frames play at 8 per second
function connect() {
  ws = new WebSocket(`ws://${location.host}/ws`);
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type === "hello") {
      $("memory").innerHTML = m.memories.map(x => `<option ${x === m.memory ? "selected" : ""}>${x}</option>`).join("");
      $("steps").value = m.steps; $("clip").max = m.clips - 1; $("promptrow").hidden = !m.text;
      view.height = Math.round(512 * m.size[0] / m.size[1]); view.style.height = view.height + "px";
      vctx.imageSmoothingEnabled = false; start();
    } else if (m.type === "started") { show(m.first); status(`ready: ${m.memory} memory, ${m.steps} steps`); }
    else if (m.type === "chunk") {
      queue.push(...m.frames); if (queue.length > 32) queue.splice(0, queue.length - 32);  // never lag behind
      path.push(...m.path); resident = m.resident; drawMap();
      const now = performance.now(); times.push([now, m.frames.length]); times = times.filter(t => now - t[0] < 5000);
      const n = times.reduce((a, t) => a + t[1], 0), dt = (now - times[0][0]) / 1000;
      $("stats").textContent = `fps ${dt > 0 ? (n / dt).toFixed(1) : "-"}, latency ${(1000 * m.latency_s).toFixed(0)} ms` +
        ` per chunk, frame ${m.frame}` + (m.room_left === null ? "" : `, ${m.room_left} frames left in memory`);
      const [x, y, z] = m.pose.xyz;
      $("pose").textContent = `x ${x.toFixed(2)} y ${y.toFixed(2)} z ${z.toFixed(2)}, ` +
        `yaw ${m.pose.yaw.toFixed(1)}\u00b0, pitch ${m.pose.pitch.toFixed(1)}\u00b0`;
      $("pose").dataset.pose = JSON.stringify(m.pose);
      status(m.returning ? "flying back ..." : "");
    } else if (m.type === "recording") {
      status(`recorded ${m.frames} frames`); const a = document.createElement("a"); a.href = m.url;
      a.download = ""; document.body.appendChild(a); a.click(); a.remove();
    } else if (m.type === "error") { status(m.message); }
    else if (m.type === "refused") { refused = m.reason; status(m.reason); }
  };
  ws.onclose = () => status(refused || "disconnected: reload the page");
}
document.addEventListener("keydown", (e) => {
  if (e.target.tagName === "INPUT") return;
  if (e.key === "b") { send({type: "back"}); return; }
  const k = KEYMAP[e.key] || KEYMAP[e.key.toLowerCase()]; if (!k) return; e.preventDefault();
  if (!held.has(k)) { held.add(k); sendInput(); }
});
document.addEventListener("keyup", (e) => {
  const k = KEYMAP[e.key] || KEYMAP[e.key.toLowerCase()]; if (k && held.delete(k)) sendInput();
});
window.addEventListener("blur", () => { if (held.size) { held.clear(); sendInput(); } });  // no stuck keys
let last = null;
view.addEventListener("mousedown", (e) => { last = [e.clientX, e.clientY]; });
window.addEventListener("mouseup", () => { last = null; });
view.addEventListener("mousemove", (e) => {
  if (!last) return; const d = [e.clientX - last[0], e.clientY - last[1]]; last = [e.clientX, e.clientY];
  sendInput(d);
});
$("reset").onclick = start;
$("back").onclick = () => send({type: "back"});
$("record").onclick = () => {
  recording = !recording; send({type: "record", on: recording});
  $("record").textContent = recording ? "stop recording" : "record MP4";
};
$("image").onchange = (e) => {
  const f = e.target.files[0]; if (!f) { imageURL = null; return; }
  const r = new FileReader(); r.onload = () => { imageURL = r.result; start(); }; r.readAsDataURL(f);
};
$("clip").onchange = () => { imageURL = null; $("image").value = ""; start(); };
$("memory").onchange = start; $("steps").onchange = start; $("prompt").onchange = start;
connect();
</script></body></html>
"""
