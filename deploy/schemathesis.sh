#!/usr/bin/env bash
# Fuzzes the HTTP/JSON API with schemathesis, every check on, against a real
# node: from the repository root, `deploy/schemathesis.sh`. It exits 0 only
# when schemathesis finds no failure.
#
# It builds tally-node (debug; TALLY_NODE_BIN names another binary), starts
# two nodes of one region on free loopback ports (the second is the copy a
# `"durability": "replicated"` add needs; both move to the newest cluster
# version by themselves, so like sets and uniques take writes), and runs
# schemathesis on the node's own /v1/openapi.json with the configuration and
# hooks of node/tests/python/ (schemathesis.toml says what they tell
# schemathesis about the API, and why). The event stream is left out: it
# never ends.
#
# schemathesis comes from PyPI into a virtualenv, target/schemathesis-venv,
# made on first use; TALLY_HTTP_PYTHON names a python that has it already
# (node/tests/http_schemathesis.rs runs this script that way). Extra
# arguments go to `schemathesis run` (e.g. --max-examples 20 for a short run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

python=${TALLY_HTTP_PYTHON:-}
if [[ -z $python ]]; then
  venv=$root/target/schemathesis-venv
  if ! "$venv/bin/python" -c 'import schemathesis' >/dev/null 2>&1; then
    echo "installing schemathesis (pip, into $venv)" >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q schemathesis
  fi
  python=$venv/bin/python
fi

node=${TALLY_NODE_BIN:-}
if [[ -z $node ]]; then
  cargo build -q -p tally-node
  node=${CARGO_TARGET_DIR:-$root/target}/debug/tally-node
fi

scratch=$(mktemp -d)
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap stop EXIT

# Six ports free for TCP and UDP on loopback (gRPC, gossip, HTTP of each
# node), below the kernel's ephemeral range.
read -r -a ports < <("$python" - <<'EOF'
import random, socket
ports = []
while len(ports) < 6:
    port = random.randint(20000, 32000)
    try:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", port))
    except OSError:
        continue
    if port not in ports:
        ports.append(port)
print(*ports)
EOF
)

start_node() { # NAME GRPC GOSSIP HTTP [SEED]
  local args=(--data-dir "$scratch/$1" --region eu --node-name "$1" --cluster-id schemathesis
    --grpc-addr "127.0.0.1:$2" --gossip-addr "127.0.0.1:$3" --http-addr "127.0.0.1:$4"
    --gossip-interval 100ms --sync-interval 100ms --cluster-version-upgrade auto)
  [[ -n ${5:-} ]] && args+=(--seeds "127.0.0.1:$5")
  "$node" "${args[@]}" >"$scratch/$1.log" 2>&1 &
  pids+=($!)
}
start_node fuzzed "${ports[0]}" "${ports[1]}" "${ports[2]}"
start_node fuzzed-copy "${ports[3]}" "${ports[4]}" "${ports[5]}" "${ports[1]}"
base=http://127.0.0.1:${ports[2]}

# Ready once a replicated add (which needs the copy) and a like (which needs
# the newest cluster version) both succeed.
ready=""
for _ in $(seq 600); do
  if "$python" - "$base" <<'EOF' 2>/dev/null; then ready=yes; break; fi
import sys, urllib.request
base = sys.argv[1]
for method, path, body in [
    ("POST", "/v1/counters/ready", b'{"delta": 1, "durability": "replicated"}'),
    ("PUT", "/v1/likes/ready/members/probe", None),
]:
    request = urllib.request.Request(base + path, data=body, method=method,
                                     headers={"content-type": "application/json"})
    urllib.request.urlopen(request, timeout=5)
EOF
  sleep 0.1
done
if [[ -z $ready ]]; then
  echo "the nodes did not become ready; their logs:" >&2
  cat "$scratch"/*.log >&2
  exit 1
fi

export SCHEMATHESIS_HOOKS=$root/node/tests/python/schemathesis_hooks.py
cd "$scratch"
status=0
"$python" -c 'import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())' \
  --no-color --config-file "$root/node/tests/python/schemathesis.toml" \
  run "$base/v1/openapi.json" --url "$base" \
  --checks all --exclude-path-regex '/events$' \
  --request-timeout 20 --max-examples 100 "$@" || status=$?
for pid in "${pids[@]}"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "a node died under the fuzzer; its logs:" >&2
    cat "$scratch"/*.log >&2
    status=1
  fi
done
exit "$status"
