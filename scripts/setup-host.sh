#!/usr/bin/env bash
# Prepare this host for harbor_gym, idempotently: Debian's docker.io, bubblewrap, libseccomp2 and debootstrap; a running
# Docker engine; the local base image (Debian bookworm minbase + python3) and its root filesystem folder for the
# bubblewrap backend; a settings file that maps public image names to that local base and sets the pull policy.
#
# Every step checks before it acts, so a second run costs a few seconds. Environment:
#   HARBOR_GYM_CACHE        where the base rootfs and settings live (default ~/.cache/harbor_gym)
#   HARBOR_GYM_PULL_POLICY  pull policy written to the settings (default: never, since this host has no registry)
#   HARBOR_GYM_SKIP_PIP=1   do not pip-install the project
#   HARBOR_GYM_ENGINE_ROOT  the engine's data root (default /var/lib/harbor-gym/engine), a btrfs filesystem the engine
#                           uses with its btrfs storage driver, so that it honours `storage-opt size` (GYM-10)
#   HARBOR_GYM_ENGINE_FS_GB size of the sparse loop file that holds it when it is not a mount already (default 64)
#   HARBOR_GYM_SKIP_PODMAN=1 do not set up podman (rootful and rootless; see its section)
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
command -v mkfs.btrfs >/dev/null 2>&1 || need+=(btrfs-progs)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)  # the spoofing guard (harbor_gym/sandbox/_spoofguard.py)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)  # the local backend's size-bounded writable layer
dpkg -s libseccomp2 >/dev/null 2>&1 || need+=(libseccomp2)  # the local backend's seccomp filter (GYM-10)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${need[*]} and cannot install them (needs root and apt-get)"; exit 1
  fi
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- Docker engine -----------------------------------------------------------------------------------------
# The engine keeps its data on btrfs with its btrfs storage driver, which applies a container's `storage-opt size`
# as a btrfs quota-group limit: a sandbox's size is bounded by the filesystem itself (a watchdog could not stop
# `fallocate -l 10G`, which is instant). overlay2 applies `size` only on xfs mounted with project quotas, which needs
# kernel quota support that this machine's kernel lacks ("XFS: quota support not available"); btrfs qgroups do not.
# On ext4, Docker's usual set-up, neither works.
engine_root=${HARBOR_GYM_ENGINE_ROOT:-/var/lib/harbor-gym/engine}
engine_img=${engine_root%/}.btrfs
ensure_engine_fs() {
  if mountpoint -q "$engine_root"; then
    grep -q " $engine_root btrfs " /proc/mounts && return 0
    log "$engine_root is mounted but is not btrfs; storage limits will be refused"; return 0
  fi
  mkdir -p "$engine_root"
  if [ ! -f "$engine_img" ]; then
    log "creating the engine's btrfs data root ($engine_img, sparse, ${HARBOR_GYM_ENGINE_FS_GB:-64} GiB)"
    truncate -s "${HARBOR_GYM_ENGINE_FS_GB:-64}G" "$engine_img.partial"
    mkfs.btrfs -q "$engine_img.partial" >/dev/null
    mv "$engine_img.partial" "$engine_img"
  fi
  mount -o loop "$engine_img" "$engine_root"
}
# Simple quotas (Linux 6.7+) charge a container's subvolume only for what it writes, and cost next to nothing when
# subvolumes are deleted; full qgroups charge the image's shared extents too and made every container removal a
# long kernel-side rescan (an engine busy with tests spent its time there). Debian's btrfs-progs predates the
# `--simple` flag, so the ioctl is issued directly (BTRFS_IOC_QUOTA_CTL, command 4 = enable simple quotas; 2 =
# disable). A kernel without them gets full qgroups, which harbor_gym accounts for (the image counts in the limit).
ensure_engine_quota() {
  grep -q " $engine_root btrfs " /proc/mounts || return 0
  local dev fsid
  dev=$(basename "$(awk -v p="$engine_root" '$2 == p {print $1}' /proc/mounts | tail -1)")
  for fsid in /sys/fs/btrfs/*/; do
    [ -e "$fsid/devices/$dev" ] || continue
    [ -e "$fsid/features/simple_quota" ] && return 0
  done
  log "enabling btrfs simple quotas on $engine_root"
  python3 - "$engine_root" <<'PY' || { log "simple quotas unavailable; enabling full qgroups"; btrfs quota enable "$engine_root"; }
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
ctl = lambda cmd: fcntl.ioctl(fd, 0xC0109428, struct.pack("QQ", cmd, 0))  # BTRFS_IOC_QUOTA_CTL
try:
    ctl(4)
except OSError:
    ctl(2)  # full qgroups were on: switch them off first
    ctl(4)
PY
}
our_engine_wrong_root() {
  # An engine this script started earlier (its log exists) whose data root is not ours: restart it on ours.
  local root
  root=$(timeout 10 docker info --format '{{.DockerRootDir}}' 2>/dev/null) || return 1
  mountpoint -q "$engine_root" || return 1
  [ "$root" != "$engine_root" ] && [ -f /var/log/harbor-gym-dockerd.log ] && pgrep -x dockerd >/dev/null
}
ensure_engine_fs
ensure_engine_quota
if our_engine_wrong_root; then
  log "restarting the engine this script started on its btrfs data root $engine_root"
  pkill -x dockerd || true
  for _ in $(seq 1 60); do pgrep -x dockerd >/dev/null || break; sleep 0.5; done
fi
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
  driver=()
  grep -q " $engine_root btrfs " /proc/mounts && driver=(--storage-driver btrfs)
  nohup dockerd --data-root "$engine_root" "${driver[@]}" >/var/log/harbor-gym-dockerd.log 2>&1 &
  for _ in $(seq 1 120); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  timeout 10 docker info >/dev/null 2>&1 || { log "dockerd did not answer; see /var/log/harbor-gym-dockerd.log"; tail -20 /var/log/harbor-gym-dockerd.log >&2; exit 1; }
fi
log "docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null), data root $(docker info --format '{{.DockerRootDir}}' 2>/dev/null))"

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

# --- Podman, rootful and rootless (issue 17 item 2) ---------------------------------------------------------
# Never fatal for the rest: a podman failure is logged and leaves the Docker engine's set-up as it is (under CI the
# podman tests then fail, naming what is missing). HARBOR_GYM_SKIP_PODMAN=1 skips it.
#   HARBOR_GYM_PODMAN_USER   the unprivileged user rootless podman runs as (default hgpodman)
#   HARBOR_GYM_PODMAN_FS_GB  size of the sparse loop file holding rootful podman's btrfs store (default 32)
podman_user=${HARBOR_GYM_PODMAN_USER:-hgpodman}
podman_root=/var/lib/harbor-gym/podman
podman_marker="# Written by harbor_gym scripts/setup-host.sh"
setup_podman() {
  local need=() f
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v newuidmap >/dev/null 2>&1 || need+=(uidmap)
  command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
  command -v netavark >/dev/null 2>&1 || [ -x /usr/lib/podman/netavark ] || need+=(netavark)
  [ -x /usr/lib/podman/aardvark-dns ] || command -v aardvark-dns >/dev/null 2>&1 || need+=(aardvark-dns)
  [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || need+=(catatonit)
  command -v runc >/dev/null 2>&1 || need+=(runc)  # crun refuses this host's hybrid cgroup v1 set-ups; runc does not
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} (podman)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/tmp/harbor-gym-podman-apt.log 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/tmp/harbor-gym-podman-apt.log 2>&1; } \
      || { tail -20 /tmp/harbor-gym-podman-apt.log >&2; return 1; }
  fi
  # Engine settings of our own in a drop-in (no other file of podman's is touched): no systemd here (cgroupfs, file
  # events), netavark (never CNI), runc, exec sessions cleaned up 10 s after they end (podman's default keeps a
  # conmon per finished exec for 5 minutes). Without CAP_SYS_RESOURCE (some VMs) podman's default rlimits cannot
  # be set, so the host's own hard limits are given (nproc at most pid_max, where podman itself caps it).
  mkdir -p /etc/containers/containers.conf.d
  local ulimits=""
  if [ $(( 0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24 & 1 )) -eq 0 ]; then
    local nofile nproc
    nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt "$(cat /proc/sys/kernel/pid_max)" ] && nproc=$(cat /proc/sys/kernel/pid_max)
    ulimits="default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
  fi
  cat >/etc/containers/containers.conf.d/50-harbor-gym.conf.tmp <<CONF
$podman_marker (podman for harbor_gym).
[containers]
$ulimits
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
network_backend = "netavark"
runtime = "runc"
exit_command_delay = 10
CONF
  mv /etc/containers/containers.conf.d/50-harbor-gym.conf.tmp /etc/containers/containers.conf.d/50-harbor-gym.conf
  # Rootful store: btrfs on a loop file with simple quotas, as the Docker engine's, so `storage-opt size` binds.
  ( engine_root=$podman_root; engine_img=$podman_root.btrfs; HARBOR_GYM_ENGINE_FS_GB=${HARBOR_GYM_PODMAN_FS_GB:-32}
    ensure_engine_fs && ensure_engine_quota ) || return 1
  if [ ! -f /etc/containers/storage.conf ] || grep -q "^$podman_marker" /etc/containers/storage.conf; then
    if grep -q " $podman_root btrfs " /proc/mounts; then
      printf '%s\n[storage]\ndriver = "btrfs"\ngraphroot = "%s/storage"\nrunroot = "/run/containers/storage"\n' \
        "$podman_marker (rootful podman's store)." "$podman_root" >/etc/containers/storage.conf
    fi
  else
    log "/etc/containers/storage.conf is not ours: left as it is (harbor_gym refuses storage bounds podman cannot apply)"
  fi
  # Rootless: an unprivileged user with subordinate ids, a hand-made XDG_RUNTIME_DIR (no logind here), its own store
  # (native overlay in the user namespace, under /var/lib/harbor-gym) and /dev/net/tun usable (its usual mode 0666)
  # for slirp4netns.
  id -u "$podman_user" >/dev/null 2>&1 || useradd --create-home --shell /usr/sbin/nologin --comment "harbor_gym rootless podman" "$podman_user"
  local uid home
  uid=$(id -u "$podman_user"); home=$(getent passwd "$podman_user" | cut -d: -f6)
  for f in /etc/subuid /etc/subgid; do
    grep -q "^$podman_user:" "$f" 2>/dev/null && continue
    local start
    start=$(awk -F: 'BEGIN {m = 100000} {if ($2 + $3 > m) m = $2 + $3} END {print m}' "$f" 2>/dev/null || echo 100000)
    log "giving $podman_user subordinate ids $start-$((start + 65535)) in $f"
    if [ "$f" = /etc/subuid ]; then usermod --add-subuids "$start-$((start + 65535))" "$podman_user"
    else usermod --add-subgids "$start-$((start + 65535))" "$podman_user"; fi
  done
  install -d -m 0700 -o "$podman_user" -g "$podman_user" "/run/user/$uid" "/run/user/$uid/podman"
  install -d -m 0755 /var/lib/harbor-gym/rootless-podman
  install -d -m 0700 -o "$podman_user" -g "$podman_user" "$home/.config" "$home/.config/containers" \
    "/var/lib/harbor-gym/rootless-podman/$podman_user"
  printf '%s\n[storage]\ndriver = "overlay"\ngraphroot = "/var/lib/harbor-gym/rootless-podman/%s/storage"\n' \
    "$podman_marker (rootless podman's store)." "$podman_user" >"$home/.config/containers/storage.conf"
  chown "$podman_user:" "$home/.config/containers/storage.conf"
  [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ] && chmod 0666 /dev/net/tun
  as_user() { (cd / && runuser -u "$podman_user" -- env XDG_RUNTIME_DIR="/run/user/$uid" HOME="$home" "$@"); }
  # Podman has no daemon that outlives its containers: it trusts its run state (tmpdir, shm locks) to be wiped at
  # boot. On hosts whose /run is no tmpfs and whose processes can all be killed without a reboot (this CI's machines
  # between runs), that state keeps containers "Up" whose processes are gone: rootful, the lease reaper then takes
  # no lease ("open /proc/N/ns/mnt"); rootless, every command fails ("invalid internal status ... pause process").
  # When no process of a store is alive, its state is stale by definition: dropping the "alive" mark makes podman
  # refresh it at its next start exactly as after a reboot.
  if ! pgrep -u 0 -x conmon >/dev/null && ! pgrep -u 0 -x podman >/dev/null && [ -e /run/libpod/alive ]; then
    log "rootful podman: no conmon or podman process alive, its run state is stale: refreshed as after a reboot"
    rm -f /run/libpod/alive /dev/shm/libpod_lock
  fi
  if ! pgrep -u "$uid" >/dev/null && [ -e "/run/user/$uid/libpod/tmp/alive" ]; then
    log "rootless podman: no process of $podman_user alive, its run state is stale: refreshed as after a reboot"
    rm -f "/run/user/$uid/libpod/tmp/alive" "/run/user/$uid/libpod/tmp/pause.pid" "/dev/shm/libpod_rootless_lock_$uid"
  fi
  # The local base image in both stores (podman, rootful and rootless, has no registry either).
  if ! podman image exists "$base_image" 2>/dev/null; then
    log "importing $base_image into rootful podman's store"
    docker save "$base_image" | podman load -q >/dev/null || return 1
  fi
  if ! as_user podman image exists "$base_image" 2>/dev/null; then
    log "importing $base_image into $podman_user's rootless podman store"
    docker save "$base_image" | as_user podman load -q >/dev/null 2>&1 || return 1
  fi
  podman run --rm --network none "$base_image" true >/dev/null 2>&1 || { log "rootful podman cannot run a container"; return 1; }
  as_user podman run --rm --network none "$base_image" true >/dev/null 2>&1 || { log "rootless podman cannot run a container"; return 1; }
  log "podman ready ($(podman version --format '{{.Client.Version}}'): rootful store $(podman info --format '{{.Store.GraphDriverName}}'), rootless as $podman_user, XDG_RUNTIME_DIR=/run/user/$uid)"
}
if [ "${HARBOR_GYM_SKIP_PODMAN:-0}" = 1 ]; then
  log "podman skipped (HARBOR_GYM_SKIP_PODMAN=1)"
elif [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  log "podman not set up (needs root and apt-get)"
else
  set +e; (set -e; setup_podman); podman_rc=$?; set -e  # (set -e holds inside only outside a tested context)
  [ "$podman_rc" -eq 0 ] || log "podman set-up FAILED (the Docker engine's set-up is unaffected; the podman tests will fail under CI=true)"
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
