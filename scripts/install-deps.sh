#!/usr/bin/env bash
# Installs the Debian packages listed in deps/debian-packages.txt (or the list given, e.g.
# deps/debian-packages-fuzz.txt) that are not yet installed.
# Idempotent: does nothing (and needs no privileges) when everything is present.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
list="${1:-$here/deps/debian-packages.txt}"
[ -f "$list" ] || { echo "mixkv: no package list at $list" >&2; exit 2; }

missing=()
while read -r pkg; do
  pkg=${pkg%%#*}
  pkg=${pkg//[[:space:]]/}
  [ -n "$pkg" ] || continue
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done < "$list"

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "mixkv: installing missing Debian packages: ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "mixkv: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq || echo "mixkv: apt-get update failed; trying the install with the cached package lists" >&2
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
