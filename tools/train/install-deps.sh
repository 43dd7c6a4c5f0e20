#!/bin/bash
# Installs the Debian packages the training pipeline needs: PyTorch and numpy
# for training, R with janeaustenr for the Austen novels,
# and matplotlib for the loss plot.  (The KJV Bible package, bible-kjv-text,
# stores its text in a custom compressed format readable only through the
# `bible` program, and the compute budget is better spent on Austen alone,
# so it is not used.)  libopenblas0-pthread matters: without it Debian's torch
# falls back to the reference BLAS, about 20x slower.  Idempotent: apt is only called when a
# package is missing, so re-runs are quiet.
set -euo pipefail

packages=(python3-torch python3-numpy python3-matplotlib libopenblas0-pthread
          r-base-core r-cran-janeaustenr)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
