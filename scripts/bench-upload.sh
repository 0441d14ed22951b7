#!/usr/bin/env bash
# Issue 7 performance: upload the same 1 GiB file to the local store with
# `vidctl upload` (release build; through the api: presigned parts, 4 at once)
# and with `aws s3 cp` (awscli from PyPI; 16 MiB parts, 4 at once, the same
# store), and report each throughput and the ratio vidctl / awscli.
# Figures only, no assertions. Needs the local stack (`make up`).
# Usage: scripts/bench-upload.sh [size_mib=1024] [runs=1]
#
# The file is random bytes sent as video/mp4; vidctl's transcode operation is
# cancelled right after the upload and both objects are deleted at the end.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZE_MIB="${1:-1024}"
RUNS="${2:-1}"
PARALLEL=4
CHUNK_MIB=16

# shellcheck disable=SC1091
source .local/stack.env
API_URL="${VIDCTL_API_URL:-http://127.0.0.1:8080}"
ENDPOINT="$VID__S3__ENDPOINT"
BUCKET="$VID__S3__BUCKET"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"

cargo build --release -q -p vid-client --bin vidctl
VIDCTL="$TARGET/release/vidctl"

# awscli from PyPI, in the repository's venv.
AWS="$ROOT/.local/venv/bin/aws"
if [ ! -x "$AWS" ]; then
    echo "installing awscli into .local/venv"
    [ -x .local/venv/bin/pip ] || python3 -m venv .local/venv
    .local/venv/bin/pip install -q awscli
fi

WORK="$(mktemp -d /tmp/bench-upload.XXXXXX)"
FILE="$WORK/upload.bin"
AWS_KEYS=()
VIDCTL_UPLOADS=()
cleanup() {
    set +e
    for key in "${AWS_KEYS[@]}"; do
        "$AWS" --endpoint-url "$ENDPOINT" s3 rm --only-show-errors "s3://$BUCKET/$key"
    done
    for upl in "${VIDCTL_UPLOADS[@]}"; do
        tenant="$(psql "$VID__DATABASE__URL" -Atc "SELECT tenant_id FROM uploads WHERE id = '$upl'" 2>/dev/null)"
        if [ -n "$tenant" ]; then
            "$AWS" --endpoint-url "$ENDPOINT" s3 rm --only-show-errors "s3://$BUCKET/tenants/$tenant/uploads/$upl/source"
        else
            echo "could not find the tenant of $upl; its source object is left in the bucket" >&2
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

export AWS_ACCESS_KEY_ID="$VID__S3__ACCESS_KEY_ID"
export AWS_SECRET_ACCESS_KEY="$VID__S3__SECRET_ACCESS_KEY"
export AWS_CONFIG_FILE="$WORK/aws-config"
export AWS_SHARED_CREDENTIALS_FILE="$WORK/aws-credentials"
unset AWS_PROFILE AWS_SESSION_TOKEN
: >"$AWS_SHARED_CREDENTIALS_FILE"
cat >"$AWS_CONFIG_FILE" <<EOF
[default]
region = $VID__S3__REGION
s3 =
    addressing_style = path
    multipart_threshold = ${CHUNK_MIB}MB
    multipart_chunksize = ${CHUNK_MIB}MB
    max_concurrent_requests = $PARALLEL
EOF
# vidctl keeps its resume state here, not in the user's cache.
export XDG_CACHE_HOME="$WORK/cache"

echo "generating a ${SIZE_MIB} MiB file in $WORK"
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom >"$FILE"
BYTES="$(stat -c %s "$FILE")"

now() { date +%s.%N; }
mibps() { python3 -c "import sys; print(f'{$BYTES / 1048576 / float(sys.argv[1]):.1f}')" "$1"; }

best_vidctl=""
best_aws=""
for run in $(seq 1 "$RUNS"); do
    key="bench/awscli-$(date +%s%N).bin"
    AWS_KEYS+=("$key")
    t0="$(now)"
    "$AWS" --endpoint-url "$ENDPOINT" s3 cp --only-show-errors "$FILE" "s3://$BUCKET/$key"
    t1="$(now)"
    aws_s="$(python3 -c "print($t1 - $t0)")"

    t0="$(now)"
    out="$("$VIDCTL" --api-url "$API_URL" --json upload --parallel "$PARALLEL" --content-type video/mp4 "$FILE")"
    t1="$(now)"
    vid_s="$(python3 -c "print($t1 - $t0)")"
    upl="$(jq -r .upload_id <<<"$out")"
    op="$(jq -r .operation_id <<<"$out")"
    VIDCTL_UPLOADS+=("$upl")
    # Random bytes are no video: stop the transcode from reading the source.
    "$VIDCTL" --api-url "$API_URL" operations cancel "$op" >/dev/null 2>&1 || true

    printf 'run %d: vidctl %.2f s (%s MiB/s), awscli %.2f s (%s MiB/s)\n' "$run" "$vid_s" "$(mibps "$vid_s")" "$aws_s" "$(mibps "$aws_s")"
    if [ -z "$best_vidctl" ] || python3 -c "import sys; sys.exit(0 if $vid_s < $best_vidctl else 1)"; then best_vidctl="$vid_s"; fi
    if [ -z "$best_aws" ] || python3 -c "import sys; sys.exit(0 if $aws_s < $best_aws else 1)"; then best_aws="$aws_s"; fi
done

echo "upload of ${SIZE_MIB} MiB, ${CHUNK_MIB} MiB parts, ${PARALLEL} at once (best of $RUNS):"
printf '  vidctl upload : %6.2f s  %8s MiB/s  (create + parts + complete through the api)\n' "$best_vidctl" "$(mibps "$best_vidctl")"
printf '  aws s3 cp     : %6.2f s  %8s MiB/s  (%s)\n' "$best_aws" "$(mibps "$best_aws")" "$("$AWS" --version 2>&1 | cut -d' ' -f1)"
python3 -c "print(f'  throughput ratio vidctl/awscli: {$best_aws / $best_vidctl:.2f} (goal >= 1.0)')"
