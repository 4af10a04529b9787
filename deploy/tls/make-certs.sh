#!/usr/bin/env bash
# make-certs.sh: a TEST certificate authority and certificates for Tally
# nodes and clients, made with openssl. Not for production keys: use your
# organisation's PKI (or cert-manager) there; the files have the same shape.
#
# Usage:
#   deploy/tls/make-certs.sh DIR [NODE[,SAN...]]...
#
#   DIR    where the files go (created; an existing CA in it is reused, so
#          running it again adds or renews node certificates under the same CA)
#   NODE   a node name; its certificate names the node (the URI SAN
#          tally://node/NODE, which makes it a node certificate: only such a
#          certificate may replicate, forward or confirm handoffs, and only
#          as the node it names) and gets the SANs DNS:NODE, DNS:localhost
#          and IP:127.0.0.1, plus any extra SAN given after commas: DNS names,
#          `*.` wildcards or IP addresses. A NODE ending in `-*` (e.g.
#          `eu-west-*`) is one certificate for every node whose name starts
#          with what comes before the `*` (a StatefulSet's pods); its files
#          are named without `-*`. Default: the compose cluster's nodes
#          eu-west-1 eu-west-2 us-east-1 ap-south-1.
#
#   Example for Kubernetes (node names are REGION-POD, e.g. eu-west-tally-0):
#   deploy/tls/make-certs.sh ./certs \
#     'eu-west-*,*.tally-eu-west.tally.svc.cluster.local,*.eu-west.tally.example.com'
#
# Files (PEM; keys are PKCS#8, ECDSA P-256, mode 0600):
#   ca.crt ca.key                 the test CA (shared by every region: nodes
#                                 trust peers and clients it signed)
#   NODE.crt NODE.key             one per node: extendedKeyUsage serverAuth and
#                                 clientAuth (a node serves and pulls with it),
#                                 URI tally://node/NODE
#   client.crt client.key         a client certificate (clientAuth only), CN=client,
#                                 no node URI: a node refuses it as a peer
#   tokens                        an --auth-tokens file: `NAME TOKEN ROLES`
#                                 lines: client (read,write), reader (read),
#                                 ops (admin); random 32-byte hex tokens;
#                                 kept if it exists
#   other-ca.crt other-ca.key     a second, unrelated CA, for negative tests
#   other-node.crt other-node.key a node certificate signed by the OTHER CA,
#                                 with the same SANs as a real node: a node
#                                 must refuse a peer presenting it
#   gossip.key                    a --gossip-key-file: one random 32-byte key in
#                                 hex (gossip is sealed under it); kept if it
#                                 exists
#   cli.env                       TALLY_TOKEN=<the client token>, for the CLI
#                                 (docker-compose.secure.yml reads it)
#
# Node flags that use them (see deploy/README.md):
#   --tls-cert DIR/NODE.crt --tls-key DIR/NODE.key --tls-ca DIR/ca.crt
#   --auth-tokens DIR/tokens --gossip-key-file DIR/gossip.key --secure
# and the CLI: tally --endpoint https://NODE:7100 --tls-ca DIR/ca.crt --token TOKEN ...
#
# Environment:
#   TALLY_CERT_DAYS   validity in days (default 365)
#   TALLY_CERT_UID    chown the node and client keys, tokens and cli.env (not
#                     the CA keys) to this uid (and gid),
#                     e.g. 10001, the image's user, so that containers can read
#                     them through a bind mount (needs root)
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
command -v openssl >/dev/null || { echo "error: openssl is not installed" >&2; exit 1; }

dir="$1"
shift
nodes=("$@")
[[ ${#nodes[@]} -gt 0 ]] || nodes=(eu-west-1 eu-west-2 us-east-1 ap-south-1)
days="${TALLY_CERT_DAYS:-365}"
mkdir -p "$dir"
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

log() { printf '[make-certs] %s\n' "$*" >&2; }

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# make_ca NAME SUBJECT: NAME.key and NAME.crt, a self-signed CA (kept if present).
make_ca() {
  local name=$1 subject=$2
  if [[ -s "$dir/$name.key" && -s "$dir/$name.crt" ]]; then
    log "reusing $dir/$name.crt"
    return
  fi
  new_key "$dir/$name.key"
  cat >"$tmp/$name.ext" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $subject
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
  openssl req -x509 -new -key "$dir/$name.key" -sha256 -days "$days" \
    -config "$tmp/$name.ext" -extensions v3_ca -out "$dir/$name.crt"
  log "made CA $dir/$name.crt ($subject)"
}

# sign CA NAME CN EKU SANS: NAME.key and NAME.crt signed by CA.
sign() {
  local ca=$1 name=$2 cn=$3 eku=$4 sans=$5
  new_key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=$cn" -out "$tmp/$name.csr"
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = $eku"
    echo "subjectKeyIdentifier = hash"
    echo "authorityKeyIdentifier = keyid"
    [[ -n "$sans" ]] && echo "subjectAltName = $sans"
  } >"$tmp/$name.ext"
  openssl x509 -req -in "$tmp/$name.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" \
    -CAcreateserial -CAserial "$tmp/$ca.srl" -sha256 -days "$days" \
    -extfile "$tmp/$name.ext" -out "$dir/$name.crt" 2>/dev/null
  log "made $dir/$name.crt (CN=$cn, signed by $ca${sans:+, $sans})"
}

# sans NAME[,EXTRA...]: the subjectAltName value for a node: its identity
# URI, then the names peers dial it by.
sans() {
  local spec=$1 name extra out
  name="${spec%%,*}"
  out="URI:tally://node/$name"
  [[ "$name" == *\* ]] || out+=", DNS:$name"
  out+=", DNS:localhost, IP:127.0.0.1"
  if [[ "$spec" == *,* ]]; then
    IFS=',' read -r -a extra <<<"${spec#*,}"
    for e in "${extra[@]}"; do
      [[ -z "$e" ]] && continue
      if [[ "$e" =~ ^[0-9.]+$ || "$e" == *:*:* ]]; then out+=", IP:$e"; else out+=", DNS:$e"; fi
    done
  fi
  printf '%s' "$out"
}

make_ca ca "Tally test CA"
make_ca other-ca "Tally OTHER test CA (must be refused)"

# file_name NAME: a node's file name (a `-*` pattern without its `-*`).
file_name() { local name=$1; name="${name%\*}"; printf '%s' "${name%-}"; }

for spec in "${nodes[@]}"; do
  name="${spec%%,*}"
  [[ "$name" =~ ^[A-Za-z0-9._-]+(-\*)?$ ]] || { echo "error: bad node name $name" >&2; exit 2; }
  sign ca "$(file_name "$name")" "$(file_name "$name")" "serverAuth, clientAuth" "$(sans "$spec")"
done
sign ca client client "clientAuth" ""
sign other-ca other-node "${nodes[0]%%,*}" "serverAuth, clientAuth" "$(sans "${nodes[0]}")"

if [[ ! -s "$dir/tokens" ]]; then
  {
    echo "# Tally --auth-tokens file: NAME TOKEN ROLES per line (made by make-certs.sh; test only)"
    echo "# ROLES: read, write (adds and likes, reads too), admin (drain, backup...; reads too)"
    echo "client $(openssl rand -hex 32) read,write"
    echo "reader $(openssl rand -hex 32) read"
    echo "ops $(openssl rand -hex 32) admin"
  } >"$dir/tokens"
  log "made $dir/tokens"
fi

if [[ ! -s "$dir/gossip.key" ]]; then
  {
    echo "# Tally --gossip-key-file: the first key seals gossip, every key opens it (made by make-certs.sh)"
    openssl rand -hex 32
  } >"$dir/gossip.key"
  log "made $dir/gossip.key"
fi

if [[ ! -s "$dir/cli.env" ]]; then
  echo "TALLY_TOKEN=$(awk '$1 == "client" { print $2 }' "$dir/tokens")" >"$dir/cli.env"
  log "made $dir/cli.env"
fi

# Self-check: every node and the client verify against ca.crt; the other
# CA's node certificate must not.
for spec in "${nodes[@]}" client; do
  name="$(file_name "${spec%%,*}")"
  openssl verify -CAfile "$dir/ca.crt" "$dir/$name.crt" >/dev/null ||
    { echo "error: $name.crt does not verify against ca.crt" >&2; exit 1; }
done
if openssl verify -CAfile "$dir/ca.crt" "$dir/other-node.crt" >/dev/null 2>&1; then
  echo "error: other-node.crt verifies against ca.crt" >&2
  exit 1
fi
chmod 0644 "$dir"/*.crt
if [[ -n "${TALLY_CERT_UID:-}" ]]; then
  # Node and client keys only: the CA keys stay with whoever signs.
  for file in "$dir"/*.key "$dir/tokens" "$dir/cli.env" "$dir/gossip.key"; do
    case "$(basename "$file")" in
      ca.key | other-ca.key) ;;
      *) chown "$TALLY_CERT_UID:$TALLY_CERT_UID" "$file" ;;
    esac
  done
  log "node and client keys, tokens and cli.env now belong to uid $TALLY_CERT_UID"
fi
log "done: $(cd "$dir" && ls | tr '\n' ' ')"
