#!/usr/bin/env bash
# Makes what a secure co2 deployment needs, with openssl, into DIR:
#   ca.crt, ca.key          a CA (ca.key signs; keep it offline)
#   shard.crt, shard.key    the shards' certificate: serverAuth, with every
#                           --shard NAME (and localhost, 127.0.0.1) as a
#                           subject alternative name; workers dial these names
#   worker-W.crt, .key      one client certificate per --worker W (clientAuth)
#                           for shards started with --tls_client_ca=ca.crt
#   job-tokens              with --job J: the shards' token file, one line
#                           "J <token>" (--job_tokens_file)
#   token                   the same token alone, the workers' token file
#                           (--aggregator_token_file)
#   admin-token             with --job J: the shards' admin token
#                           (--admin_token_file), for co2-admin
# Keys and tokens are written mode 600. Existing files are not overwritten.
#
# Usage: make-certs.sh DIR [--shard NAME]... [--worker W]... [--job J] [--days N]
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[[ $# -ge 1 && $1 != -* ]] || usage
DIR=$1
shift
SHARDS=() WORKERS=() JOB="" DAYS=365
while [[ $# -gt 0 ]]; do
  case $1 in
    --shard) SHARDS+=("$2"); shift 2 ;;
    --worker) WORKERS+=("$2"); shift 2 ;;
    --job) JOB=$2; shift 2 ;;
    --days) DAYS=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "make-certs.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed" >&2; exit 1; }
mkdir -p "$DIR"
cd "$DIR"
umask 077

refuse_existing() {
  for f in "$@"; do
    [[ ! -e $f ]] || { echo "make-certs.sh: $DIR/$f exists; not overwriting it" >&2; exit 1; }
  done
}

# sign NAME EXTENSIONS: NAME.key (EC P-256) and NAME.crt signed by the CA.
sign() {
  local name=$1 ext=$2
  refuse_existing "$name.key" "$name.crt"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$name.key" -subj "/CN=$name" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days "$DAYS" -extfile <(printf '%s\n' "$ext") -out "$name.crt" 2>/dev/null
  rm -f "$name.csr"
  chmod 600 "$name.key"
  chmod 644 "$name.crt"
  echo "made $DIR/$name.crt and $name.key"
}

if [[ ! -e ca.crt ]]; then
  refuse_existing ca.key
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -nodes -keyout ca.key -subj "/CN=co2 CA" -days "$DAYS" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt 2>/dev/null
  chmod 600 ca.key
  chmod 644 ca.crt
  echo "made $DIR/ca.crt and ca.key"
fi

SANS="DNS:localhost,IP:127.0.0.1"
for name in "${SHARDS[@]}"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then SANS+=",IP:$name"; else SANS+=",DNS:$name"; fi
done
sign shard "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$SANS"

for w in "${WORKERS[@]}"; do
  sign "worker-$w" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
done

if [[ -n $JOB ]]; then
  refuse_existing job-tokens token admin-token
  token=$(openssl rand -hex 32)
  printf '%s %s\n' "$JOB" "$token" >job-tokens
  printf '%s\n' "$token" >token
  openssl rand -hex 32 >admin-token
  chmod 600 job-tokens token admin-token
  echo "made $DIR/job-tokens (shards) and token (workers) for job $JOB, and admin-token (shards, co2-admin)"
fi
