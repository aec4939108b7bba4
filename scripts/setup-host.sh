#!/usr/bin/env bash
# Prepare this host for harbor_gym, idempotently: Debian's docker.io, bubblewrap and debootstrap; a running
# Docker engine; the local base image (Debian bookworm minbase + python3) and its root filesystem folder for the
# bubblewrap backend; a settings file that maps public image names to that local base and sets the pull policy.
#
# Every step checks before it acts, so a second run costs a few seconds. Environment:
#   HARBOR_GYM_CACHE        where the base rootfs and settings live (default ~/.cache/harbor_gym)
#   HARBOR_GYM_PULL_POLICY  pull policy written to the settings (default: never, since this host has no registry)
#   HARBOR_GYM_SKIP_PIP=1   do not pip-install the project
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${HARBOR_GYM_CACHE:-$HOME/.cache/harbor_gym}
base_image=harbor-gym/base:bookworm
rootfs=$cache/rootfs/bookworm-python3
settings=${HARBOR_GYM_SETTINGS:-$cache/settings.toml}
log() { printf '[setup-host] %s\n' "$*" >&2; }

# --- Debian packages ---------------------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${need[*]} and cannot install them (needs root and apt-get)"; exit 1
  fi
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- Docker engine -----------------------------------------------------------------------------------------
if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd"
  # A killed engine leaves its pid files behind; they would stop a new one from starting. A pid file is stale when
  # it names no live process of that name (a zombie left by a killed parent counts as dead).
  for f in /var/run/docker.pid /run/docker.pid /var/run/docker/containerd/containerd.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1 || true)
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    if [ -z "$pid" ] || [ -z "$state" ] || [ "$state" = Z ] || { [ "$comm" != dockerd ] && [ "$comm" != containerd ]; }; then
      log "removing stale pid file $f"
      rm -f "$f"
    fi
  done
  mkdir -p /var/log
  nohup dockerd >/var/log/harbor-gym-dockerd.log 2>&1 &
  for _ in $(seq 1 120); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  timeout 10 docker info >/dev/null 2>&1 || { log "dockerd did not answer; see /var/log/harbor-gym-dockerd.log"; tail -20 /var/log/harbor-gym-dockerd.log >&2; exit 1; }
fi
log "docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"

# --- Local base root filesystem and image ------------------------------------------------------------------
if [ ! -f "$rootfs/.harbor-gym-complete" ]; then
  log "debootstrap bookworm minbase + python3 into $rootfs (about a minute)"
  rm -rf "$rootfs.partial"
  mkdir -p "$(dirname "$rootfs")"
  debootstrap --variant=minbase --include=python3,procps bookworm "$rootfs.partial" http://deb.debian.org/debian >/tmp/harbor-gym-debootstrap.log 2>&1 \
    || { tail -20 /tmp/harbor-gym-debootstrap.log >&2; exit 1; }
  rm -rf "$rootfs.partial"/var/cache/apt/archives/*.deb "$rootfs.partial"/var/lib/apt/lists/*
  rm -rf "$rootfs"
  mv "$rootfs.partial" "$rootfs"
  touch "$rootfs/.harbor-gym-complete"
fi
if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  log "importing $rootfs as $base_image"
  tar -C "$rootfs" --exclude=./.harbor-gym-complete -c . | docker import \
    --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$base_image" >/dev/null
fi

# --- Settings: explicit aliases and pull policy ------------------------------------------------------------
mkdir -p "$(dirname "$settings")"
cat >"$settings.tmp" <<TOML
# Written by scripts/setup-host.sh. Public image names that this host cannot pull, mapped to local ones.
pull_policy = "${HARBOR_GYM_PULL_POLICY:-never}"

[image_aliases]
"debian:bookworm-slim" = "$base_image"
"debian:bookworm" = "$base_image"
"debian:12-slim" = "$base_image"
"python:3.11-slim" = "$base_image"
"python:3.12-slim" = "$base_image"
"python:3.11-slim-bookworm" = "$base_image"
"python:3.12-slim-bookworm" = "$base_image"
"ubuntu:24.04" = "$base_image"
"ubuntu:22.04" = "$base_image"

[rootfs_aliases]
"$base_image" = "$rootfs"
TOML
mv "$settings.tmp" "$settings"
log "settings in $settings"

# --- The project itself ------------------------------------------------------------------------------------
if [ "${HARBOR_GYM_SKIP_PIP:-0}" != 1 ]; then
  if ! python3 -m pip install -q --root-user-action=ignore -e "$here[test,notebook]" >/tmp/harbor-gym-pip.log 2>&1; then
    tail -30 /tmp/harbor-gym-pip.log >&2; log "pip install failed"; exit 1
  fi
  (cd / && python3 -c 'import harbor_gym') || { log "harbor_gym does not import after pip install"; exit 1; }
fi
log "ready"
