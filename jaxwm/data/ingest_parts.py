"""Ingestion across processes: each of ``count`` processes (hosts of a pod, or jobs on one machine) ingests its
share of the videos into the same ``--out`` folder (a file system all of them see), and the manifest is merged once.

Process ``i`` of ``n`` takes the sorted videos ``i, i + n, i + 2n, ...``, encodes them on its own devices and
writes its own shards (``<split>-part<i>-of-<n>-<k>.array_record``), its own part manifest
(``manifest.part<i>-of-<n>.json``, the same fields as ``manifest.json`` plus ``finished``) and its own rejects
(``rejects.part<i>-of-<n>.jsonl``). A rerun of process ``i`` resumes from its part. The process that finishes last
(every part ``finished``) writes ``manifest.json``: every part's shards in process order, their ``done`` lists
joined, ``processes: n``, and ``rejects.jsonl``, every part's rejects; readers (training, ``RecordClips``) see one
dataset, with the clips a one-process run writes.
"""

import json
import pathlib
import re

from jaxwm.data import records
from jaxwm.utils.cli import write_json, write_text

_PART = re.compile(r"manifest\.part(\d+)-of-(\d+)\.json$")


def tag(index, count):
  return f"part{index:03d}-of-{count:03d}"


def manifest_path(out, index, count):
  """Where process ``index`` of ``count`` keeps its manifest (``manifest.json`` for one process)."""
  return pathlib.Path(out) / (records.MANIFEST if count == 1 else f"manifest.{tag(index, count)}.json")


def rejects_path(out, index, count, name):
  return pathlib.Path(out) / (name if count == 1 else name.replace(".jsonl", f".{tag(index, count)}.jsonl"))


def shard_prefix(split, index, count):
  return split if count == 1 else f"{split}-{tag(index, count)}"


def leftovers(out, index, count):
  """The temporary files (``.<name>.tmp<pid>``) of crashed runs that process ``index`` of ``count`` may delete:
  every one when it is the only process; otherwise only those of its own part (its shards, part manifest and
  rejects, whose names carry its tag). Another part's, or a shared file's, may be in flight in a process running now
  (deleting them broke concurrent runs); the files they would replace are rewritten whole, so leaving them is safe.
  A crashed merge's shared temporary files (``.manifest.json.tmp*``) are therefore never deleted: hidden, and read by
  nothing."""
  temps = sorted(pathlib.Path(out).glob(".*.tmp*"))
  if count == 1:
    return temps
  own = re.compile(rf"^\.[^/]*[.-]{tag(index, count)}[.-]")
  return [t for t in temps if own.match(t.name)]


def check_layout(out, count):
  """The error message when ``out`` was ingested with another process count, else None."""
  out = pathlib.Path(out)
  counts = {int(m.group(2)) for p in out.glob("manifest.part*.json") if (m := _PART.match(p.name))}
  merged = records.read_manifest(out)
  if counts and counts != {count}:
    return f"holds the parts of an ingestion by {sorted(counts)} process(es); rerun with --process_count {max(counts)}"
  if merged is not None and merged.get("processes", 1) != count:
    return (f"holds an ingestion by {merged.get('processes', 1)} process(es); rerun with --process_count "
            f"{merged.get('processes', 1)} or use another --out")
  return None


def merge(out, count, rejects_name):
  """Writes ``manifest.json`` and the rejects file from the ``count`` parts when every part is finished.
  Returns the number of finished parts (``count``: merged)."""
  out = pathlib.Path(out)
  parts = []
  for i in range(count):
    p = manifest_path(out, i, count)
    part = json.loads(p.read_text()) if p.is_file() else None
    if part is None or not part.get("finished"):
      return sum(1 for q in parts if q.get("finished"))
    parts.append(part)
  done = {}
  for part in parts:
    for split, stems in part["done"].items():
      done.setdefault(split, {}).update(stems)
  shape = next((p["latent_shape"] for p in parts if p["latent_shape"] is not None), None)
  write_json(out / records.MANIFEST, {"settings": parts[0]["settings"], "latent_shape": shape,
                                      "shards": [sh for p in parts for sh in p["shards"]], "done": done,
                                      "processes": count})
  lines = []
  for i in range(count):
    r = rejects_path(out, i, count, rejects_name)
    if r.is_file():
      lines += [line for line in r.read_text().splitlines() if line.strip()]
  if lines:
    write_text(out / rejects_name, "\n".join(lines) + "\n")
  return count
