#!/usr/bin/env bash
# Writes data/corpus/python-stdlib.json: the code corpus of `phasekv tokenizer train` (and of the
# code models, docs/PROBE.md), the top-level modules of the Python standard library that Debian's
# python3 installs under /usr/lib/python3.11 (packages libpython3.11-minimal and
# libpython3.11-stdlib), pinned by path, size and SHA-256. Held out by file: every 10th file in
# path order ("held_out": true), so a validation loss never sees a file seen in training.
# Usage: bash scripts/code-corpus.sh [OUT]   (default data/corpus/python-stdlib.json)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/corpus/python-stdlib.json}
ROOT=/usr/lib/python3.11
python3 - "$ROOT" "$OUT" <<'PY'
import glob, hashlib, json, os, subprocess, sys
root, out = sys.argv[1], sys.argv[2]
paths = sorted(glob.glob(os.path.join(root, "*.py")))
if not paths:
    sys.exit(f"no *.py under {root}: is python3.11 installed?")
def package(p):
    return subprocess.run(["dpkg", "-S", p], capture_output=True, text=True).stdout.split(":")[0]
files = []
for i, p in enumerate(paths):
    data = open(p, "rb").read()
    files.append({"path": p, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                  "package": package(p), "held_out": i % 10 == 9})
doc = {"description": "Code corpus: the top-level modules of the Python 3.11 standard library "
                      "as Debian 12 installs them. Every 10th file in path order is held out.",
       "root": root, "files": files}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(tmp, out)
print(f"{out}: {len(files)} files, {sum(f['bytes'] for f in files)} bytes, "
      f"{sum(f['held_out'] for f in files)} held out")
PY
