# shellcheck shell=bash
# Shared parts of the HTTP benchmarks against the playback service
# (scripts/bench-playback.sh, scripts/bench-thumbnails.sh; bench_db alone also
# by scripts/bench-delivery-writes.sh): sourced, not run.
#
#   bench_init NAME          die(), wrk + nginx (apt if missing), $NGINX, $WORK (a temp dir,
#                            removed on exit with every process in PIDS and the scratch database)
#   free_port / wait_http URL
#   bench_db NAME            a scratch database migrated by $API_BIN; exports VID__DATABASE__URL
#   seed_ready_video T V PREFIX PB STREAM_JSON   tenant, upload, ready video with `stream`, public PB
#   s3_put FILE KEY          PUT a file into the media bucket (curl --aws-sigv4)
#   start_playback           $BIN_DIR/playback on a free port: sets PB_PORT, PLAY_ORIGIN
#   start_nginx ROOT TYPES [LOCATION]   nginx serving ROOT: sets NGINX_PORT, STATIC_ORIGIN
#   wrk_stats URL            "<req/s> <p50 ms> <p99 ms>"; dies on any non-2xx answer
# Expects: $BIN_DIR, $API_BIN, $DURATION, $CONNECTIONS, $THREADS, .local/stack.env sourced.

bench_init() {
    BENCH_NAME="$1"
    die() { echo "$BENCH_NAME: $*" >&2; exit 1; }
    local tool
    for tool in wrk nginx; do
        command -v "$tool" >/dev/null || command -v "/usr/sbin/$tool" >/dev/null || {
            echo "$BENCH_NAME: installing $tool (apt)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$([ "$tool" = nginx ] && echo nginx-light || echo wrk)" >/dev/null
        }
    done
    NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
    [ -x "$BIN_DIR/playback" ] || die "$BIN_DIR/playback missing (cargo build --release --bins)"
    [ -x "$API_BIN" ] || die "$API_BIN missing (cargo build --release --bins)"
    WORK="$(mktemp -d "/tmp/vid-$BENCH_NAME.XXXXXX")"
    chmod 755 "$WORK"   # nginx workers (nobody when started by root) read files here
    PIDS=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${DB:-}" ] && psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { local i; for i in $(seq 1 300); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; die "$1 never answered"; }

bench_db() {
    SERVER="${VID__DATABASE__URL%/*}"
    DB="vidbench_$1_$$"
    psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
    export VID__DATABASE__URL="$SERVER/$DB" VID_PROFILE=development
    "$API_BIN" migrate >/dev/null
}

seed_ready_video() {   # TENANT VIDEO PREFIX PB STREAM_JSON
    psql -q "$VID__DATABASE__URL" >/dev/null <<SQL
INSERT INTO tenants (id, name) VALUES ('$1', 'bench');
INSERT INTO uploads (id, tenant_id, status, size_bytes, content_type, part_size, part_count, storage_key, s3_upload_id, video_id, expires_at)
  VALUES ('upl_bench', '$1', 'completed', 1, 'video/mp4', 1, 1, 'k', 'x', '$2', now() + interval '1 day');
INSERT INTO videos (id, tenant_id, upload_id, operation_id, status, content_type, source_key, stream)
  VALUES ('$2', '$1', 'upl_bench', 'op_bench', 'ready', 'video/mp4', 'k', '$5');
INSERT INTO playback_ids (id, tenant_id, video_id, policy) VALUES ('$4', '$1', '$2', 'public');
SQL
}

s3_put() {   # FILE KEY
    curl -fsS -o /dev/null --aws-sigv4 "aws:amz:$VID__S3__REGION:s3" --user "$VID__S3__ACCESS_KEY_ID:$VID__S3__SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -T "$1" "$VID__S3__ENDPOINT/$VID__S3__BUCKET/$2" || die "PUT $2 to Garage failed"
}

start_playback() {
    PB_PORT="$(free_port)"
    VID__PLAYBACK__LISTEN="127.0.0.1:$PB_PORT" VID__TELEMETRY__LEVEL=warn "$BIN_DIR/playback" >"$WORK/playback.log" 2>&1 &
    PIDS+=($!)
    PLAY_ORIGIN="http://127.0.0.1:$PB_PORT"
    wait_http "$PLAY_ORIGIN/healthz"
}

start_nginx() {   # ROOT TYPES [LOCATION]: as many workers as cores, access log off
    NGINX_PORT="$(free_port)"
    mkdir -p "$WORK/nginx"
    cat >"$WORK/nginx/nginx.conf" <<NGINX
worker_processes $(nproc);
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    types { $2 }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        root $1;
        ${3:-}
    }
}
NGINX
    "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' &
    PIDS+=($!)
    STATIC_ORIGIN="http://127.0.0.1:$NGINX_PORT"
}

wrk_stats() {   # URL: "<req/s> <p50 ms> <p99 ms>"
    local out
    out="$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency "$1")"
    grep -q "Non-2xx" <<<"$out" && die "wrk got non-2xx answers from $1: $out"
    awk 'function ms(v) { if (v ~ /us$/) {sub(/us$/,"",v); return v/1000} if (v ~ /ms$/) {sub(/ms$/,"",v); return v} sub(/s$/,"",v); return v*1000 }
         /^Requests\/sec:/ {r=$2} $1 == "50%" {p50=ms($2)} $1 == "99%" {p99=ms($2)} END {printf "%s %.3f %.3f", r, p50, p99}' <<<"$out"
}
