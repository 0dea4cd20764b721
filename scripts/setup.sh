#!/usr/bin/env bash
# One-time set-up on a fresh machine (idempotent; fast when everything is there already):
#   1. a Docker engine that answers (installs docker.io and starts dockerd when root on Debian),
#   2. .venv with mgpu-cloud, its test tools and CPU torch 2.13.0,
#   3. the docker provider's node image (a local Debian base via debootstrap when no registry),
#   4. Chromium and its WebDriver for the dashboard's browser tests (Debian's packages).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }

have_docker() { docker info >/dev/null 2>&1; }

start_docker() {
  if have_docker; then return 0; fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "No Docker engine answers, and this script can only install one as root on Debian/Ubuntu."
    say "Install Docker Engine (https://docs.docker.com/engine/install/), start it, make sure"
    say "'docker info' works for this user, then run this again."
    exit 1
  fi
  if ! command -v dockerd >/dev/null; then
    say "installing docker.io ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  say "starting dockerd ..."
  nohup dockerd >/var/log/mgpu-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    if have_docker; then say "Docker engine is up"; return 0; fi
    sleep 1
  done
  say "dockerd did not answer within 60 s; see /var/log/mgpu-dockerd.log"
  exit 1
}

ensure_debootstrap() {
  command -v debootstrap >/dev/null && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  else
    say "debootstrap is needed to build a local base image: apt-get install debootstrap"
    exit 1
  fi
}

ensure_venv() {
  local py="${PYTHON:-python3}"
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv ..."
    "$py" -m venv .venv
  fi
  # torch pinned to the CPU build (a newer pin or a range pulls multi-GB CUDA builds).
  if ! .venv/bin/python -c 'import provision, torch, moto, pytest, starlette, uvicorn, selenium' >/dev/null 2>&1 \
     || [ pyproject.toml -nt .venv/.installed ]; then
    say "installing mgpu-cloud and test tools into .venv ..."
    .venv/bin/pip install -q --upgrade pip >/dev/null
    .venv/bin/pip install -q torch==2.13.0 -e ".[test]"
    touch .venv/.installed
  fi
}

ensure_images() {
  if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1 \
     && ! docker image inspect mgpu-cloud/base:bookworm >/dev/null 2>&1 \
     && ! docker pull debian:bookworm-slim >/dev/null 2>&1; then
    say "no registry reachable: building a local Debian base image (once, ~2-5 min) ..."
    ensure_debootstrap
    .venv/bin/mgpu-cloud image base
  fi
  say "node image: $(.venv/bin/mgpu-cloud image build)"
}

ensure_browser() {
  # The dashboard's browser tests drive Debian's Chromium through chromedriver (Selenium);
  # no browser download (Playwright's would fail without internet).
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then return 0; fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing chromium + chromium-driver (dashboard browser tests) ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    say "the dashboard's browser tests need Chromium and chromedriver: apt-get install chromium chromium-driver"
    say "(they are skipped without them, except when CI=true)"
  fi
}

start_docker
ensure_browser
ensure_venv
ensure_images
say "ready"
