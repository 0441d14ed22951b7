#!/usr/bin/env bash
# `make up`, after the infrastructure is running and the binaries are built:
# migrate, configure the bucket, make sure a development tenant and key exist,
# start the three services. Idempotent.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env
export VID_PROFILE=development
API=target/debug/api

$API migrate
$API storage-setup
if [ ! -s .local/api-key ]; then
    $API create-tenant --name development > .local/api-key.tmp
    mv .local/api-key.tmp .local/api-key
    chmod 600 .local/api-key
    echo "created a development tenant; its API key is in .local/api-key"
else
    echo "development API key: .local/api-key"
fi
scripts/services.sh start debug
