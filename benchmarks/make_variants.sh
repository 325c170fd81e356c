#!/usr/bin/env bash
# Patched copies of the checkout's grm_service, one per proposed change (cumulative, in order),
# for `bench_gateway.py --variant NAME=DIR` / `profile_gateway.py --src DIR`. Prints NAME=DIR.
#   bash benchmarks/make_variants.sh [OUT_DIR]      (default /tmp/grm-variants)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=${1:-/tmp/grm-variants}
rm -rf "$out"
prev="$repo"
for patch in "$here"/variants/*.patch; do
  name=$(basename "$patch" .patch)
  mkdir -p "$out/$name"
  cp -r "$prev/grm_service" "$out/$name/"
  if ! (cd "$out/$name" && patch -p1 --quiet --no-backup-if-mismatch <"$patch" >&2); then
    echo "$name: patch no longer applies to the checkout; regenerate it" >&2
    exit 1
  fi
  prev="$out/$name"
  echo "$name=$out/$name"
done
