#!/usr/bin/env bash
# Usage: scripts/fetch-vocab-tests.sh DEST
#
# Fetches llama.cpp's tokenizer conformance files into DEST: models/ggml-vocab-*.gguf
# (vocabulary-only GGUF files) and their .inp/.out pairs (inputs and the token ids Hugging Face
# tokenizers give them). They come from the npm package node-llama-cpp, which ships llama.cpp's
# source as a git bundle; the npm registry is the one source of it this project can reach.
#
# Idempotent: does nothing when DEST is complete. The package tarball and the extracted files
# are cached under ${XDG_CACHE_HOME:-~/.cache}/kvllm, so a second build folder costs a copy.
# When the registry cannot be reached it prints one line, writes DEST/SKIP and exits 0, so that
# the conformance test can skip instead of fail on an offline machine.
set -euo pipefail

readonly PACKAGE="node-llama-cpp@3.21.1"
readonly BUNDLE="package/llama/gitRelease.bundle"

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
dest=$1
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# Test processes run in parallel and may all call this at once: one fetches, the rest wait.
exec 9>"$dest/.lock"
flock 9

[[ -f "$dest/COMPLETE" ]] && exit 0
rm -f "$dest/SKIP"

cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kvllm/vocab-tests-${PACKAGE#*@}"
mkdir -p "$cache"
exec 8>"$cache.lock"
flock 8

skip() {
  echo "fetch-vocab-tests: SKIP: $1" | tee "$dest/SKIP"
  exit 0
}

if [[ ! -f "$cache/COMPLETE" ]]; then
  command -v npm >/dev/null || skip "npm is not installed"
  command -v git >/dev/null || skip "git is not installed"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # A bounded wait: an unreachable registry should cost a minute, not npm's default retries.
  if ! tarball=$(cd "$work" && timeout 120 npm pack --loglevel=error --fetch-retries=1 \
      --fetch-timeout=60000 "$PACKAGE" 2>"$work/npm.log"); then
    skip "cannot fetch $PACKAGE from the npm registry: $(head -n 1 "$work/npm.log")"
  fi
  tar -xzf "$work/$tarball" -C "$work" "$BUNDLE"
  git clone --quiet --bare "$work/$BUNDLE" "$work/llama.git"
  rm -rf "$cache/models"
  git -C "$work/llama.git" archive HEAD models |
    tar -x -C "$cache" --wildcards 'models/ggml-vocab-*'
  touch "$cache/COMPLETE"
fi

cp "$cache"/models/ggml-vocab-* "$dest/"
touch "$dest/COMPLETE"
echo "fetch-vocab-tests: $(ls "$dest"/ggml-vocab-*.gguf | wc -l) vocabularies in $dest"
