#!/usr/bin/env bash
# The container cluster test: builds the image, starts the compose cluster
# (eu-west with two nodes, us-east, ap-south), drives adds into every node
# through the `tally` CLI inside the containers, and meanwhile
#   - cuts ap-south off the network (docker network disconnect) and keeps
#     adding on both sides,
#   - pauses us-east-1 (docker pause) while adds to it are in flight,
#   - kills eu-west-2 (docker kill, i.e. SIGKILL) while adds to it are in
#     flight, and starts it again,
#   - reconnects ap-south,
# then asserts that every node reports the exact total of every key and that
# `tally status` on every node shows 4 live members and `converged: yes`.
# Everything (containers, network, volumes) is torn down on any exit.
#
# Totals are exact because every add carries its own idempotency key and is
# retried, on the same node and with the same key, until it is acknowledged:
# an add whose answer was lost (node killed, paused, ...) is applied once.
# The expected total of a key is the sum of the deltas of all adds sent.
#
# Every CLI call runs with TALLY_ROUTING=pinned: the node it names serves it
# (no forwarding to the key's owner in eu-west), so "retried on the same
# node" holds. A retry that fails over to another owner is recognised only
# once the first owner's idempotency record reached it
# (docs/src/concepts/partitioned-regions.md), and the kill phase would count such an add twice.
#
# Traffic stays inside the compose project's own network: the CLI runs in the
# containers (docker exec) and talks to its own node; no host port is
# published. Nothing is exec'd into a container while it is paused: with
# runc, an exec that races a pause can block in the frozen cgroup and hold
# the container's lock, so `docker unpause` never returns (a CI run hung for
# 78 minutes that way). The adds to the paused node come from a neighbour's
# container instead, and every docker call is bounded by `timeout`.
#
# Usage: deploy/test.sh            (exit status 0 on success)
# Environment:
#   TALLY_TEST_SECURE      1: the same with docker-compose.secure.yml (TLS,
#                          mutual TLS between nodes, tokens, sealed gossip,
#                          --secure), with certificates and keys from
#                          deploy/tls/make-certs.sh, and a rogue node (the
#                          cluster id, no key, no certificate) that must
#                          never become a member
#   TALLY_IMAGE            image to build and test (default: a tag of this
#                          run's own, removed at the end)
#   TALLY_TEST_SKIP_BUILD  1: do not run deploy/docker/build.sh; test
#                          $TALLY_IMAGE (default tally:dev) as it is
#   TALLY_TEST_KEEP        1: leave the cluster up on failure (for debugging;
#                          tear it down with the printed command)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
project="tallytest$(date +%s)$$"
# The image gets a tag of its own, so that concurrent runs (and whoever uses
# tally:dev) never see each other's image; layers are shared, and the tag is
# removed at the end.
own_image=0
if [[ -z "${TALLY_IMAGE:-}" ]]; then
  if [[ "${TALLY_TEST_SKIP_BUILD:-0}" == 1 ]]; then
    TALLY_IMAGE=tally:dev
  else
    TALLY_IMAGE="tally:$project"
    own_image=1
  fi
fi
export TALLY_IMAGE
compose_files=(-f "$root/deploy/docker-compose.yml")
secure="${TALLY_TEST_SECURE:-0}"
if [[ "$secure" == 1 ]]; then
  compose_files+=(-f "$root/deploy/docker-compose.secure.yml")
fi
nodes=(eu-west-1 eu-west-2 us-east-1 ap-south-1)
keys=(post:1:likes post:1:views poll:7:votes)
check_keys=("${keys[@]}" idem:check) # keys checked at the end
work="$(mktemp -d "${TMPDIR:-/tmp}/tally-test.XXXXXX")"
started=$SECONDS
run_id="r$(date +%s)$$"
hot_key="bench:key:0" # what `tally bench --keys 1` adds to
hot_expected=""       # its exact total, when the bench reports no error

log() { printf '[test.sh +%3ds] %s\n' "$((SECONDS - started))" "$*"; }
fail() {
  printf '[test.sh +%3ds] FAIL: %s\n' "$((SECONDS - started))" "$*" >&2
  exit 1
}

if command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  fail "neither docker-compose nor the docker compose plugin is installed"
fi
# compose ARGS...: docker compose on this project, killed after 180 s.
compose() { timeout -k 5 180 "${compose_cmd[@]}" "${compose_files[@]}" -p "$project" "$@"; }

declare -A cid # node name -> container id
project_started=0
net=""         # the project's network

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  # Stop our own background workers, by pid.
  local pids
  pids="$(jobs -p)"
  [[ -n "$pids" ]] && kill $pids 2>/dev/null
  if [[ $project_started == 0 ]]; then
    : # nothing was started
  elif [[ $rc -ne 0 ]]; then
    log "diagnostics after the failure:"
    compose ps 2>&1 | sed 's/^/    /'
    for node in "${nodes[@]}"; do
      [[ -n "${cid[$node]:-}" ]] || continue
      log "last log lines of $node:"
      dock 30 logs --tail 25 "${cid[$node]}" 2>&1 | sed 's/^/    /'
    done
  fi
  if [[ $project_started == 0 ]]; then
    :
  elif [[ $rc -ne 0 && "${TALLY_TEST_KEEP:-0}" == 1 ]]; then
    log "TALLY_TEST_KEEP=1: cluster left up; remove it with:"
    log "  ${compose_cmd[*]} ${compose_files[*]} -p $project down -v"
  else
    log "tearing down project $project (containers, network, volumes)"
    for node in "${nodes[@]}"; do
      [[ -n "${cid[$node]:-}" ]] && dock 60 unpause "${cid[$node]}" >/dev/null 2>&1
    done
    if ! compose down --volumes --remove-orphans --timeout 10 >"$work/down.log" 2>&1; then
      cat "$work/down.log"
      log "teardown failed: remove project $project by hand"
      [[ $rc -eq 0 ]] && rc=1
    fi
  fi
  if [[ $own_image == 1 && ! ( $rc -ne 0 && "${TALLY_TEST_KEEP:-0}" == 1 ) ]]; then
    dock 60 rmi "$TALLY_IMAGE" >/dev/null 2>&1
  fi
  if [[ $rc -ne 0 && "${TALLY_TEST_KEEP:-0}" == 1 ]]; then
    log "work files (ledgers, certificates) kept in $work"
  else
    rm -rf "$work"
  fi
  if [[ $rc -eq 0 ]]; then
    log "PASS in $((SECONDS - started)) s"
  else
    log "FAILED (exit $rc) after $((SECONDS - started)) s"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_until_quiet SECONDS COMMAND...: polls COMMAND every half second; false
# when it never succeeded.
wait_until_quiet() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every half second.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      fail "timed out after ${limit}s waiting until $what"
    fi
    sleep 0.5
  done
}

# dock SECONDS ARGS...: `docker ARGS...`, killed after SECONDS.
dock() { timeout -k 5 "$1" docker "${@:2}"; }

tally_in() { # tally_in NODE ARGS...: the CLI inside the node's container
  # (its endpoint, and with security its CA and token, come from the
  # container's environment: TALLY_ENDPOINT, TALLY_TLS_CA, TALLY_TOKEN)
  dock 60 exec -e TALLY_ROUTING=pinned "${cid[$1]}" tally "${@:2}"
}
# tally_via VIA NODE ARGS...: the CLI inside VIA's container, talking to
# NODE over the project network (node certificates name their node).
tally_via() {
  local scheme=http
  [[ "$secure" == 1 ]] && scheme=https
  dock 60 exec -e TALLY_ROUTING=pinned "${cid[$1]}" tally --endpoint "$scheme://$2:7100" "${@:3}"
}
# via NODE: the container whose CLI drives NODE's adds (itself, unless
# routed elsewhere for a phase by setting via_override[NODE]).
declare -A via_override=()
via() { echo "${via_override[$1]:-$1}"; }

healthy() { [[ "$(dock 30 inspect -f '{{.State.Health.Status}}' "${cid[$1]}")" == healthy ]]; }
all_healthy() {
  local node
  for node in "${nodes[@]}"; do healthy "$node" || return 1; done
}

# table_rows: the member rows of a `tally status` text on stdin (the node's
# own row, LAST SYNC `self`, included): REGION NODE REPLICA GRPC ALIVE
# LAST-SYNC SEQ-LAG DIGEST. Picked by their shape (8 columns, a 16-digit hex
# digest last), never by line number: lines above and below the table come
# and go (the cluster version line, problem lines).
table_rows() {
  awk 'NF == 8 && $1 != "REGION" && length($8) == 16 && $8 ~ /^[0-9a-f]+$/'
}
# status_rows NODE: table_rows of NODE's `tally status`; fails when it does.
status_rows() {
  local out
  out="$(tally_in "$1" status)" || return 1
  table_rows <<<"$out"
}
# live_members NODE: how many members (itself included) NODE sees alive.
live_members() {
  status_rows "$1" | awk '$5 == "yes" { n++ } END { print n + 0 }'
}
# member_alive NODE OTHER: yes/no, as NODE sees OTHER.
member_alive() {
  status_rows "$1" | awk -v other="$2" '$2 == other { print $5 }'
}
ap_south_down() { [[ "$(member_alive eu-west-1 ap-south-1)" == no ]]; }
sees_all() {
  local node
  for node in "${nodes[@]}"; do
    [[ "$(live_members "$node")" == "${#nodes[@]}" ]] || return 1
  done
}

# add_until_acked NODE KEY DELTA IDEM: one logical add, retried on the same
# node with the same idempotency key until acknowledged (at most 120 s: a
# paused or killed node must come back within that).
add_until_acked() {
  local node=$1 key=$2 delta=$3 idem=$4 deadline=$((SECONDS + 120)) out rc
  while true; do
    rc=0
    if [[ "$(via "$node")" == "$node" ]]; then
      out="$(tally_in "$node" add "$key" "$delta" --idempotency-key "$idem" 2>&1)" || rc=$?
    else
      out="$(tally_via "$(via "$node")" "$node" add "$key" "$delta" --idempotency-key "$idem" 2>&1)" || rc=$?
    fi
    if [[ $rc == 0 ]]; then
      printf '%s %s %s %s\n' "$key" "$delta" "$idem" "${out//$'\n'/ }"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      echo "add $idem ($key $delta) on $node never acknowledged; last error: $out" >&2
      return 1
    fi
    sleep 0.3
  done
}

# drive NODE PHASE COUNT: COUNT adds on NODE, spread over the keys, with
# deltas from 1 to 9 and some negative ones; the ledger file gets a line per
# acknowledged add.
drive() {
  local node=$1 phase=$2 count=$3 i key delta ledger="$work/ledger.$1.$2"
  : >"$ledger"
  for ((i = 1; i <= count; i++)); do
    key=${keys[$((i % ${#keys[@]}))]}
    delta=$(((i * 7 + ${#node} * 3 + ${#phase}) % 9 + 1))
    [[ $key == poll:7:votes && $((i % 2)) == 0 ]] && delta=$((-delta))
    add_until_acked "$node" "$key" "$delta" "$run_id-$node-$phase-$i" >>"$ledger" || return 1
  done
}

# start_drivers PHASE COUNT NODE...: one background driver per node.
declare -a driver_pids=()
declare -a driver_names=()
start_drivers() {
  local phase=$1 count=$2 node
  shift 2
  for node in "$@"; do
    drive "$node" "$phase" "$count" &
    driver_pids+=($!)
    driver_names+=("$node/$phase")
  done
}
wait_drivers() {
  local i
  for i in "${!driver_pids[@]}"; do
    wait "${driver_pids[$i]}" || fail "the adds of ${driver_names[$i]} failed"
  done
  driver_pids=()
  driver_names=()
}
acked() { cat "$work"/ledger.* 2>/dev/null | wc -l; }
acked_on() { cat "$work"/ledger."$1".* 2>/dev/null | wc -l; }

expected_total() { # expected_total KEY: the sum of every delta sent to KEY
  cat "$work"/ledger.* | awk -v key="$1" '$1 == key { sum += $2 } END { print sum + 0 }'
}
expected_in_region() { # expected_in_region KEY REGION: the same, over the region's nodes
  local node
  for node in "${nodes[@]}"; do
    [[ "${node%-*}" == "$2" ]] && cat "$work"/ledger."$node".* 2>/dev/null
  done | awk -v key="$1" '$1 == key { sum += $2 } END { print sum + 0 }'
}

# write_expectations: "KEY total VALUE" and "KEY REGION VALUE" lines, from
# the ledgers (and the hot key's bench count when it is exact).
write_expectations() {
  local key region
  : >"$work/expected"
  for key in "${check_keys[@]}"; do
    echo "$key total $(expected_total "$key")" >>"$work/expected"
    for region in eu-west us-east ap-south; do
      echo "$key $region $(expected_in_region "$key" "$region")" >>"$work/expected"
    done
  done
  if [[ -n "$hot_expected" ]]; then
    echo "$hot_key total $hot_expected" >>"$work/expected"
    echo "$hot_key eu-west $hot_expected" >>"$work/expected"
  fi
}

# exact_everywhere: every node reports the expected total of every key and
# the expected part of every region (`tally get KEY --breakdown`).
exact_everywhere() {
  local node key out ok=0
  : >"$work/mismatch"
  for node in "${nodes[@]}"; do
    for key in "${check_keys[@]}" ${hot_expected:+"$hot_key"}; do
      if ! out="$(tally_in "$node" get "$key" --breakdown 2>&1)"; then
        echo "$node $key: $out" >>"$work/mismatch"
        ok=1
        continue
      fi
      # Line 1 is the total; rows after the header are REGION VALUE + - SYNC.
      awk -v node="$node" -v key="$key" '
        FNR == NR { if ($1 == key) want[$2] = $3; next }
        FNR == 1 { got["total"] = $1; next }
        FNR > 2 { got[$1] = $2 }
        END {
          bad = 0
          for (part in want) {
            have = (part in got) ? got[part] : 0
            if (have != want[part]) { printf "%s %s %s: got %s, want %s\n", node, key, part, have, want[part]; bad = 1 }
          }
          exit bad
        }' "$work/expected" - <<<"$out" >>"$work/mismatch" || ok=1
    done
  done
  return $ok
}
# same_everywhere KEY: every node reports the same value for KEY.
same_everywhere() {
  local node values=""
  for node in "${nodes[@]}"; do
    values+="$(tally_in "$node" get "$1") " || return 1
  done
  [[ "$(tr ' ' '\n' <<<"$values" | sed '/^$/d' | sort -u | wc -l)" == 1 ]]
}
# pulled_recently: every node has completed a pull from every other member in
# the last 3 s (LAST SYNC in `tally status`): direct replication works again
# everywhere, not only through third parties.
pulled_recently() {
  local node
  : >"$work/stale"
  for node in "${nodes[@]}"; do
    status_rows "$node" | awk -v node="$node" '
      $6 != "self" && !($6 ~ /ms$/ || $6 ~ /^[0-2](\.[0-9])?s$/) { print node " <- " $2 ": " $6; bad = 1 }
      END { exit bad }' >>"$work/stale" || return 1
  done
}
converged_everywhere() {
  local node out
  for node in "${nodes[@]}"; do
    out="$(tally_in "$node" status)" || return 1
    grep -q '^converged: yes' <<<"$out" || return 1
    [[ "$(table_rows <<<"$out" | awk '$5 == "yes" { n++ } END { print n + 0 }')" == "${#nodes[@]}" ]] || return 1
  done
}

# ---------------------------------------------------------------------------
if [[ "${TALLY_TEST_SKIP_BUILD:-0}" != 1 ]]; then
  log "building the image $TALLY_IMAGE (deploy/docker/build.sh)"
  "$root/deploy/docker/build.sh"
fi
docker image inspect "$TALLY_IMAGE" >/dev/null 2>&1 || fail "no image $TALLY_IMAGE"

if [[ "$secure" == 1 ]]; then
  # TLS on every gRPC port, mutual TLS between nodes, tokens, --secure.
  # Captured first: with pipefail, `grep -q` closing the pipe early made the
  # docker run fail with "broken pipe".
  cli_help="$(docker run --rm --network none --entrypoint tally "$TALLY_IMAGE" --help)" || true
  grep -q -- --tls-ca <<<"$cli_help" ||
    fail "TALLY_TEST_SECURE=1 needs a tally CLI with --tls-ca and --token"
  log "security on: a test CA, node certificates and tokens (deploy/tls/make-certs.sh)"
  export TALLY_CERTS="$work/certs"
  "$root/deploy/tls/make-certs.sh" "$TALLY_CERTS" "${nodes[@]}" 2>"$work/certs.log" ||
    { cat "$work/certs.log"; fail "make-certs.sh failed"; }
  # Throwaway keys: readable by the image's user through the bind mount.
  chmod 0755 "$work" "$TALLY_CERTS"
  chmod 0644 "$TALLY_CERTS"/*
fi

log "starting project $project: ${nodes[*]} (compose: ${compose_cmd[*]})"
project_started=1
compose up -d >"$work/up.log" 2>&1 ||
  { cat "$work/up.log"; fail "docker compose up failed"; }
for node in "${nodes[@]}"; do
  cid[$node]="$(compose ps -q "$node")"
  [[ -n "${cid[$node]}" ]] || fail "no container for $node"
done
net="$(dock 30 inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}' "${cid[ap-south-1]}")"
net="${net%% *}"
[[ "$net" == "${project}_tally" || "$net" == *tally ]] || fail "unexpected network $net"
log "network $net; containers: $(for n in "${nodes[@]}"; do printf '%s=%s ' "$n" "${cid[$n]:0:12}"; done)"

log "waiting (<= 120 s) until every container is healthy"
wait_until 120 "every container is healthy" all_healthy
log "waiting (<= 60 s) until every node sees ${#nodes[@]} live members"
wait_until 60 "every node sees ${#nodes[@]} live members" sees_all
tally_in eu-west-1 status | sed 's/^/    /'

if [[ "$secure" == 1 ]]; then
  # A stock node on the cluster's network with the cluster id but without
  # the gossip key or a certificate (the image's binary, as an attacker who
  # read the compose file would run it): it must never become a member, and
  # a drain it is asked for must reach nobody.
  log "rogue: a node with the cluster id but no gossip key nor certificate joins the network"
  rogue="$(dock 60 run -d --network "$net" --tmpfs /data:uid=10001 \
    -e TALLY_CLUSTER_ID=tally-compose -e TALLY_REGION=eu-west -e TALLY_NODE_NAME=rogue \
    -e TALLY_SEEDS=eu-west-1:7101,eu-west-2:7101,us-east-1:7101,ap-south-1:7101 \
    -e TALLY_GOSSIP_INTERVAL=100ms "$TALLY_IMAGE")" || fail "the rogue container did not start"
  sleep 5
  dock 60 exec "$rogue" tally admin drain eu-west-2 >"$work/rogue-drain.out" 2>&1 || true
  sleep 3
  for node in "${nodes[@]}"; do
    out="$(tally_in "$node" status)" || fail "tally status on $node failed"
    grep -q rogue <<<"$out" && { echo "$out"; fail "$node lists the rogue node"; }
    grep -q "draining" <<<"$out" && { echo "$out"; fail "$node shows a drain the rogue asked for"; }
  done
  dock 60 rm -f "$rogue" >/dev/null
  log "  the rogue node was never a member and its drain reached nobody ($(tr '\n' ' ' <"$work/rogue-drain.out" | cut -c1-120))"
fi

log "phase 1: adds into every region (${#nodes[@]} nodes x 12)"
start_drivers initial 12 "${nodes[@]}"
wait_drivers
log "  $(acked) adds acknowledged"

log "idempotency: repeating an acknowledged add changes nothing"
# A key of its own: other keys' totals move with merges from other regions.
add_until_acked eu-west-1 idem:check 5 "$run_id-idem" >"$work/ledger.eu-west-1.idem"
again="$(tally_in eu-west-1 add idem:check 5 --idempotency-key "$run_id-idem")"
[[ "$again" == "5 (duplicate: already applied)" ]] || fail "a repeated add was not answered as a duplicate: $again"
[[ "$(tally_in eu-west-1 get idem:check)" == 5 ]] || fail "a repeated add changed the total"

ap_ip="$(dock 30 inspect -f "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "${cid[ap-south-1]}")"
log "partition: disconnecting ap-south-1 ($ap_ip) from $net"
dock 60 network disconnect "$net" "${cid[ap-south-1]}"
wait_until 30 "eu-west-1 sees ap-south-1 down" ap_south_down
log "  eu-west-1 sees ap-south-1 down"

log "phase 2: adds on both sides of the partition (4 x 12), and a hot key: tally bench on eu-west-1 for 3 s"
dock 60 exec -e TALLY_ROUTING=pinned "${cid[eu-west-1]}" tally bench --op add --keys 1 --concurrency 8 --connections 2 \
  --duration 3s --warmup 0s >"$work/bench.out" 2>&1 &
bench_pid=$!
start_drivers partitioned 12 "${nodes[@]}"
wait_drivers
wait "$bench_pid" || { cat "$work/bench.out"; fail "tally bench failed"; }
sed 's/^/    /' "$work/bench.out"
read -r bench_ops bench_errors < <(awk '$1 == "ops:" { print $2, $4 }' "$work/bench.out") || true
[[ "${bench_ops:-0}" -gt 0 ]] || fail "the bench acknowledged no add"
if [[ "$bench_errors" == 0 ]]; then
  hot_expected=$bench_ops # every add it sent was acknowledged (no warmup)
else
  log "  the bench saw $bench_errors errors: $hot_key is checked for agreement only"
fi
ap_value="$(tally_in ap-south-1 get post:1:likes)"
eu_value="$(tally_in eu-west-1 get post:1:likes)"
[[ "$ap_value" != "$eu_value" ]] || fail "ap-south-1 and eu-west-1 agree ($ap_value) while partitioned: is the partition real?"
log "  $(acked) adds acknowledged; post:1:likes is $eu_value in eu-west-1, $ap_value in ap-south-1"

log "pause: docker pause us-east-1 for 5 s while adds go to every node (to us-east-1 from eu-west-1's container)"
via_override[us-east-1]=eu-west-1
start_drivers paused 10 "${nodes[@]}"
via_override=()
sleep 1
dock 60 pause "${cid[us-east-1]}" >/dev/null
sleep 1
paused_count="$(acked_on us-east-1)"
sleep 4
[[ "$(acked_on us-east-1)" == "$paused_count" ]] || fail "us-east-1 acknowledged adds while paused"
log "  acknowledged so far: us-east-1 $(acked_on us-east-1) (none while paused), all $(acked)"
dock 60 unpause "${cid[us-east-1]}" >/dev/null
log "  us-east-1 unpaused"
wait_drivers
log "  $(acked) adds acknowledged"

log "kill: docker kill eu-west-2 (SIGKILL) while adds to it are in flight (from eu-west-1's container)"
via_override[eu-west-2]=eu-west-1
start_drivers killed 16 "${nodes[@]}"
via_override=()
wait_until 60 "eu-west-2 acknowledged 4 adds of this phase" \
  bash -c '[[ $(wc -l <"$0") -ge 4 ]]' "$work/ledger.eu-west-2.killed"
replica_before="$(status_rows eu-west-2 | awk '$6 == "self" { print $3 }')"
dock 60 kill "${cid[eu-west-2]}" >/dev/null
log "  killed after $(wc -l <"$work/ledger.eu-west-2.killed") acknowledged adds of this phase"
sleep 3
dock 60 start "${cid[eu-west-2]}" >/dev/null
log "  eu-west-2 started again; waiting (<= 60 s) until healthy"
wait_until 60 "eu-west-2 is healthy again" healthy eu-west-2
replica_after="$(status_rows eu-west-2 | awk '$6 == "self" { print $3 }')"
[[ -n "$replica_before" && "$replica_after" == "$replica_before" ]] ||
  fail "eu-west-2 came back as replica $replica_after, was $replica_before: its data directory was lost"
log "  eu-west-2 is back as the same replica $replica_after"
wait_drivers
log "  $(acked) adds acknowledged"

log "heal: reconnecting ap-south-1 to $net"
# The alias gives the node its service name back on the network (peers and
# seeds use it). Docker hands the freed address back when nobody took it; the
# node's gossip address was resolved at start, so say so if it changed.
dock 60 network connect --alias ap-south-1 "$net" "${cid[ap-south-1]}"
heal_at=$SECONDS
ap_ip2="$(dock 30 inspect -f "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "${cid[ap-south-1]}")"
[[ "$ap_ip2" == "$ap_ip" ]] || log "  note: ap-south-1 came back as $ap_ip2 (was $ap_ip)"

log "phase 3: adds after the heal (4 x 6)"
start_drivers healed 6 "${nodes[@]}"
wait_drivers
total_adds="$(acked)"
log "  $total_adds adds acknowledged in all"
write_expectations
for key in "${check_keys[@]}" ${hot_expected:+"$hot_key"}; do
  log "  expected $key = $(awk -v k="$key" '$1 == k && $2 == "total" { print $3 }' "$work/expected")" \
    "($(awk -v k="$key" '$1 == k && $2 != "total" { printf "%s%s %s", sep, $2, $3; sep = ", " }' "$work/expected"))"
done

log "waiting (<= 60 s) until every node reports the exact total and per-region parts of every key"
converge_start=$SECONDS
deadline=$((SECONDS + 60))
next_report=$((SECONDS + 5))
until exact_everywhere; do
  if ((SECONDS >= deadline)); then
    sed 's/^/    /' "$work/mismatch"
    for node in "${nodes[@]}"; do tally_in "$node" status 2>&1 | sed "s/^/    $node| /"; done
    fail "the totals did not converge within 60 s"
  fi
  if ((SECONDS >= next_report)); then
    log "  not yet: $(wc -l <"$work/mismatch") mismatches, e.g. $(head -n 1 "$work/mismatch")"
    next_report=$((SECONDS + 5))
  fi
  sleep 0.5
done
if [[ -z "$hot_expected" ]]; then
  wait_until 60 "every node agrees on $hot_key" same_everywhere "$hot_key"
fi
log "  every node holds the exact totals ($((SECONDS - converge_start)) s after the last add)"
log "waiting (<= 60 s) until every node sees ${#nodes[@]} live members and says converged"
wait_until 60 "tally status says converged with ${#nodes[@]} live members on every node" converged_everywhere
log "waiting (<= 60 s) until every node pulls from every other node directly again"
if ! wait_until_quiet 60 pulled_recently; then
  sed 's/^/    /' "$work/stale"
  fail "some nodes did not pull from some peers within 60 s of the heal"
fi
log "  every node pulled from every peer in the last 3 s ($((SECONDS - heal_at)) s after the heal)"
for node in "${nodes[@]}"; do
  log "  $node: $(for key in "${check_keys[@]}" "$hot_key"; do printf '%s=%s ' "$key" "$(tally_in "$node" get "$key")"; done)"
done
tally_in ap-south-1 status | sed 's/^/    /'
tally_in us-east-1 get post:1:likes --breakdown | sed 's/^/    /'
log "all ${#nodes[@]} nodes agree on the exact totals of $total_adds CLI adds${hot_expected:+ and $hot_expected bench adds}"
