#!/usr/bin/env bash
# `make up`, after the infrastructure is running and the binaries are built:
# migrate, configure the bucket, start the four services, and make sure a
# development tenant and its API key (.local/api-key) exist. Idempotent.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env
export VID_PROFILE=development
API=target/debug/api
PORT="${VID_API_PORT:-8080}"

$API migrate
$API storage-setup
scripts/services.sh start debug

key_works() {
    [ -s .local/api-key ] &&
        curl -fsS -o /dev/null -H "Authorization: Bearer $(cat .local/api-key)" "http://127.0.0.1:$PORT/operations?limit=1"
}
if key_works; then
    echo "development API key: .local/api-key"
else
    $API create-tenant --name development > .local/api-key.tmp
    mv .local/api-key.tmp .local/api-key
    chmod 600 .local/api-key
    echo "created a development tenant; its API key is in .local/api-key"
fi
echo "api: http://127.0.0.1:$PORT   playback: http://127.0.0.1:${VID_PLAYBACK_PORT:-8090}/play/   logs: .local/logs/   stop with: make down"
