#!/usr/bin/env bash
# data/get_tinyshakespeare.sh DEST: put tiny Shakespeare at DEST, checksum verified.
# Copies from $TINYSHAKESPEARE when set, else downloads it from its canonical public URL.
# An existing DEST with the right checksum is kept as it is.
set -euo pipefail
dest=${1:-data/tinyshakespeare/input.txt}
url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
want=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
sum_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sum_of "$dest")" = "$want" ]; then
  echo "[data] $dest present, sha256 verified"; exit 0
fi
mkdir -p "$(dirname "$dest")"
tmp="$dest.part.$$"
trap 'rm -f "$tmp"' EXIT
if [ -n "${TINYSHAKESPEARE:-}" ]; then
  if [ ! -r "$TINYSHAKESPEARE" ]; then
    echo "error: TINYSHAKESPEARE=$TINYSHAKESPEARE is not a readable file; expected the path of tiny Shakespeare's input.txt (or unset it to download)" >&2; exit 2
  fi
  cp "$TINYSHAKESPEARE" "$tmp"
  from=$TINYSHAKESPEARE
elif command -v curl >/dev/null; then
  curl -fsSL --retry 3 -o "$tmp" "$url" || { echo "error: could not download $url; check the network, or pass TINYSHAKESPEARE=/path/to/input.txt" >&2; exit 1; }
  from=$url
elif command -v wget >/dev/null; then
  wget -q -O "$tmp" "$url" || { echo "error: could not download $url; check the network, or pass TINYSHAKESPEARE=/path/to/input.txt" >&2; exit 1; }
  from=$url
else
  echo "error: neither curl nor wget found to download $url; install one, or pass TINYSHAKESPEARE=/path/to/input.txt" >&2; exit 1
fi
got=$(sum_of "$tmp")
if [ "$got" != "$want" ]; then
  echo "error: $from has sha256 $got, expected $want (tiny Shakespeare, 1115394 bytes); give the right file with TINYSHAKESPEARE=/path" >&2; exit 2
fi
mv "$tmp" "$dest"
trap - EXIT
echo "[data] $dest from $from, sha256 verified"
