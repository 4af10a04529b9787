#!/usr/bin/env bash
# Builds the statically linked `tally-node` and `tally` binaries on the host
# and the container image around them (FROM scratch: nothing is pulled).
#
#   deploy/docker/build.sh            # builds tally:dev
#   TALLY_IMAGE=tally:1.2 deploy/docker/build.sh
#   deploy/docker/build.sh --binaries-only   # the cargo build alone, no image
#
# The same cargo invocation also builds `tally-sim` (the simulator), which
# the image does not hold: .ci/run runs its sweeps on this build, so CI
# compiles the release dependency tree once instead of twice (with the same
# packages selected, cargo unifies the same features, and a second run of
# this script finds everything up to date).
#
# Idempotent and fast when nothing changed: cargo rebuilds nothing, the build
# context is only rewritten where a file's content changed, and Docker's layer
# cache answers the rest (a few seconds in all).
#
# Environment:
#   TALLY_IMAGE               image tag (default tally:dev)
#   TALLY_STATIC_TARGET_DIR   cargo target dir for the static build
#                             (default <repo>/target/static; kept apart from
#                             target/ because other RUSTFLAGS rebuild everything)
#   TALLY_CARGO_PROFILE       release (default) or another cargo profile
#
# The first build compiles the whole dependency tree (about 4 minutes on 2 cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
image="${TALLY_IMAGE:-tally:dev}"
target_dir="${TALLY_STATIC_TARGET_DIR:-$root/target/static}"
profile="${TALLY_CARGO_PROFILE:-release}"
triple="$(uname -m)-unknown-linux-gnu"
context="$target_dir/docker-context"

log() { printf '[build.sh] %s\n' "$*" >&2; }

binaries_only=0
case "${1:-}" in
  "") ;;
  --binaries-only) binaries_only=1 ;;
  *) log "usage: deploy/docker/build.sh [--binaries-only]"; exit 2 ;;
esac

log "static build of tally-node, tally and tally-sim ($triple, profile $profile) into $target_dir"
start=$SECONDS
# --target keeps RUSTFLAGS off build scripts and proc macros, which must stay
# dynamic host binaries; only the two shipped binaries are linked statically.
(
  cd "$root"
  RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target_dir" \
    cargo build --profile "$profile" --target "$triple" -p tally-node -p tally-cli -p tally-sim \
    --bin tally-node --bin tally --bin tally-sim
)
log "cargo done in $((SECONDS - start)) s"

# cargo names the `release` profile's directory `release`, `dev` `debug`.
profile_dir="$profile"
[[ "$profile" == dev ]] && profile_dir=debug
bin_dir="$target_dir/$triple/$profile_dir"

for bin in tally-node tally; do
  path="$bin_dir/$bin"
  [[ -x "$path" ]] || { log "error: $path was not built"; exit 1; }
  if command -v readelf >/dev/null 2>&1; then
    if readelf -lW "$path" | grep -q 'program interpreter'; then
      log "error: $path is dynamically linked; a FROM scratch image needs a static binary"
      exit 1
    fi
  fi
done

if [[ $binaries_only == 1 ]]; then
  log "binaries in $bin_dir (no image: --binaries-only)"
  exit 0
fi

# The build context: only what the image holds. A file is rewritten only when
# its content changed, so Docker's cache stays warm.
put() { # put SRC DEST MODE
  if ! cmp -s "$1" "$2" 2>/dev/null; then
    install -m "$3" "$1" "$2"
  fi
}
mkdir -p "$context/bin" "$context/etc" "$context/data"
put "$bin_dir/tally-node" "$context/bin/tally-node" 0755
put "$bin_dir/tally" "$context/bin/tally" 0755
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf 'root:x:0:0:root:/:/sbin/nologin\ntally:x:10001:10001:tally:/data:/sbin/nologin\n' >"$tmp/passwd"
printf 'root:x:0:\ntally:x:10001:\n' >"$tmp/group"
printf 'hosts: files dns\n' >"$tmp/nsswitch.conf"
for file in passwd group nsswitch.conf; do
  put "$tmp/$file" "$context/etc/$file" 0644
done
# Nothing else may linger in the context (it is all copied into the image).
find "$context/data" -mindepth 1 -delete

previous="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
log "docker build -t $image (context $context)"
docker build -t "$image" -f "$root/deploy/docker/Dockerfile" "$context" >&2
# The image the tag used to name is now untagged: remove it unless in use.
current="$(docker image inspect -f '{{.Id}}' "$image")"
if [[ -n "$previous" && "$previous" != "$current" &&
  "$(docker image inspect -f '{{len .RepoTags}}' "$previous" 2>/dev/null)" == 0 ]]; then
  docker rmi "$previous" >/dev/null 2>&1 && log "removed the previous, now untagged image ${previous:7:12}"
fi
log "image $image: $(docker image inspect -f '{{.Id}} {{.Size}} bytes' "$image")"
