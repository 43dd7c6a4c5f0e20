#!/usr/bin/env bash
# Usage: scripts/fetch-npm-openai.sh DEST
#
# Installs the official `openai` npm package (the test client of `kvllm serve`) into
# DEST/node_modules. The package is cached under ${XDG_CACHE_HOME:-~/.cache}/kvllm, so a
# second build folder costs a copy. When the npm registry cannot be reached it prints one
# line, writes DEST/SKIP and exits 0, so that the test can skip instead of fail offline.
set -euo pipefail

readonly PACKAGE="openai@7.59.0"

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
mkdir -p "$1"
dest=$(cd "$1" && pwd)

exec 9>"$dest/.lock"
flock 9
[[ -f "$dest/COMPLETE" ]] && exit 0
rm -f "$dest/SKIP"

skip() {
  echo "fetch-npm-openai: SKIP: $1" | tee "$dest/SKIP"
  exit 0
}

cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kvllm/npm-${PACKAGE/@/-}"
mkdir -p "$cache"
exec 8>"$cache.lock"
flock 8
if [[ ! -f "$cache/COMPLETE" ]]; then
  command -v npm >/dev/null || skip "npm is not installed"
  command -v node >/dev/null || skip "node is not installed"
  # A bounded wait: an unreachable registry should cost a minute, not npm's default retries.
  if ! timeout 180 npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
      --fetch-retries=1 --fetch-timeout=60000 "$PACKAGE" >"$cache/npm.log" 2>&1; then
    skip "npm could not install $PACKAGE (registry unreachable?): $(tail -1 "$cache/npm.log")"
  fi
  touch "$cache/COMPLETE"
fi
rm -rf "$dest/node_modules"
cp -r "$cache/node_modules" "$dest/node_modules"
touch "$dest/COMPLETE"
