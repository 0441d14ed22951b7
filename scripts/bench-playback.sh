#!/usr/bin/env bash
# Playback service throughput (issue 19): wrk against the master playlist and
# a media playlist served by `playback`, and against nginx serving the same
# stored bytes from disk on loopback, in the same run; prints req/s, p99 and
# the ratio playback/nginx (goal >= 50 %); the signed master playlist
# (?token=, issue 20) against the public one: p50, p99 and their ratio. Plus one media segment through
# both, and the proxy-vs-redirect figure: a segment proxied by playback
# against the same object fetched straight from Garage (what a redirect to a
# presigned URL would cost after its extra round trip). No time is asserted.
#
#   scripts/bench-playback.sh            (make bench runs it; needs .local/stack.env)
# Knobs: DURATION (wrk seconds per URL, 10), CONNECTIONS (32), THREADS (2),
#        BIN_DIR (target/release), API_BIN ($BIN_DIR/api, for `api migrate`),
#        SEGMENTS_CURL (sequential fetches, 200).
# Needs: wrk and nginx (apt-get install wrk nginx-light; installed here if missing),
#        ffmpeg, psql, openssl, curl >= 7.75 (--aws-sigv4); vidctl (VIDCTL, $BIN_DIR/vidctl
#        else target/debug/vidctl) mints the token.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env
DURATION="${DURATION:-10}"
CONNECTIONS="${CONNECTIONS:-32}"
THREADS="${THREADS:-2}"
BIN_DIR="${BIN_DIR:-target/release}"
SEGMENTS_CURL="${SEGMENTS_CURL:-200}"
API_BIN="${API_BIN:-$BIN_DIR/api}"   # only for `api migrate` of the scratch database
# shellcheck source=scripts/lib/bench-http.sh
source scripts/lib/bench-http.sh
bench_init bench-playback

# 1. A real stream in the transcoder's layout: 60 s, 2 rungs + audio, 4 s CMAF segments.
STREAM="$WORK/stream"
mkdir -p "$STREAM"/{360p,180p,audio}
hls() {   # hls TRACK INPUT...
    local track="$1"; shift
    (cd "$STREAM" && ffmpeg -hide_banner -loglevel error -y "$@" -f hls -hls_time 4 -hls_playlist_type vod \
        -hls_segment_type fmp4 -hls_fmp4_init_filename init.mp4 -start_number 1 \
        -hls_segment_filename "$track/seg-%05d.m4s" "$track/index.m3u8")
}
hls 360p -f lavfi -i testsrc2=size=640x360:rate=25 -t 60 -an -c:v libx264 -preset veryfast -g 100 -keyint_min 100 -sc_threshold 0 -b:v 800k
hls 180p -f lavfi -i testsrc2=size=320x180:rate=25 -t 60 -an -c:v libx264 -preset veryfast -g 100 -keyint_min 100 -sc_threshold 0 -b:v 250k
hls audio -f lavfi -i sine=frequency=440:sample_rate=48000 -t 60 -c:a aac -b:a 64k
cat >"$STREAM/master.m3u8" <<'M3U8'
#EXTM3U
#EXT-X-VERSION:7
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="audio",NAME="Audio",DEFAULT=YES,AUTOSELECT=YES,CHANNELS="1",URI="audio/index.m3u8"
#EXT-X-STREAM-INF:BANDWIDTH=950000,AVERAGE-BANDWIDTH=880000,CODECS="avc1.64001e,mp4a.40.2",RESOLUTION=640x360,FRAME-RATE=25.000,AUDIO="audio"
360p/index.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=350000,AVERAGE-BANDWIDTH=320000,CODECS="avc1.64000d,mp4a.40.2",RESOLUTION=320x180,FRAME-RATE=25.000,AUDIO="audio"
180p/index.m3u8
M3U8
SEGMENT=360p/seg-00005.m4s
echo "stream: $(find "$STREAM" -type f | wc -l) objects, media playlist $(wc -c <"$STREAM/360p/index.m3u8") B, master $(wc -c <"$STREAM/master.m3u8") B, segment $(wc -c <"$STREAM/$SEGMENT") B"

# 2. A scratch database (migrated by the api binary) and the objects in Garage.
bench_db playback
TENANT="ten_bench$(date +%s)"
VIDEO="vid_01jbench0000000000000000$((RANDOM % 10))"
PREFIX="bench/playback-$$/stream/"
PB="pb_01jd8x4m3v0k2q6s7t9w1y5zab"
S3="$VID__S3__ENDPOINT/$VID__S3__BUCKET"
while IFS= read -r f; do s3_put "$f" "$PREFIX${f#"$STREAM"/}"; done < <(find "$STREAM" -type f)
seed_ready_video "$TENANT" "$VIDEO" "$PREFIX" "$PB" \
    "{\"prefix\": \"$PREFIX\", \"hls_master_key\": \"${PREFIX}master.m3u8\", \"dash_manifest_key\": \"${PREFIX}manifest.mpd\", \"segment_duration_ms\": 4000, \"objects\": 0, \"size_bytes\": 0}"
# A signed playback ID of the same video, a signing key of the tenant (openssl
# makes the pair; the table gets the public half, as POST /signing-keys does)
# and a token minted by vidctl (issue 20).
PB_SIGNED="pb_01jd8x4m3v0k2q6s7t9w1y5zac"
KID="sk_01jd8x4m3v0k2q6s7t9w1y5zab"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/signing.pem" 2>/dev/null
PUBLIC_PEM="$(openssl pkey -in "$WORK/signing.pem" -pubout)"
psql -q "$VID__DATABASE__URL" -v pem="$PUBLIC_PEM" >/dev/null <<SQL
INSERT INTO playback_ids (id, tenant_id, video_id, policy) VALUES ('$PB_SIGNED', '$TENANT', '$VIDEO', 'signed');
INSERT INTO signing_keys (id, tenant_id, public_key) VALUES ('$KID', '$TENANT', :'pem');
SQL
VIDCTL="${VIDCTL:-$BIN_DIR/vidctl}"
[ -x "$VIDCTL" ] || VIDCTL=target/debug/vidctl
[ -x "$VIDCTL" ] || die "vidctl missing (cargo build -p vid-client)"
TOKEN="$("$VIDCTL" playback sign --key-file "$WORK/signing.pem" --key-id "$KID" --playback-id "$PB_SIGNED" --audience v --expires-in 1h)"

# 3. The playback service (release, as many workers as cores) and nginx (as
#    many workers, access log off) on loopback.
start_playback
start_nginx "$STREAM" "application/vnd.apple.mpegurl m3u8; video/mp4 m4s mp4;" \
    'location / { add_header Access-Control-Allow-Origin "*"; add_header Cache-Control "public, max-age=10"; }'
PLAY="$PLAY_ORIGIN/play"
STATIC="$STATIC_ORIGIN"
wait_http "$STATIC/master.m3u8"
curl -fsS "$PLAY/$PB.m3u8" | grep -q "^$PB/360p/index.m3u8" || die "the master playlist is not served rewritten"
cmp -s <(curl -fsS "$PLAY/$PB/360p/index.m3u8") "$STREAM/360p/index.m3u8" || die "the media playlist differs from the stored one"

printf '\n%-16s %12s %10s %12s %10s %8s\n' "url" "playback r/s" "p99 ms" "nginx r/s" "p99 ms" "ratio"
row() {   # row NAME PLAYBACK_URL STATIC_URL
    local a b
    read -r a_rps _ a_p99 <<<"$(wrk_stats "$2")"
    read -r b_rps _ b_p99 <<<"$(wrk_stats "$3")"
    printf '%-16s %12.0f %10s %12.0f %10s %7.0f%%\n' "$1" "$a_rps" "$a_p99" "$b_rps" "$b_p99" "$(awk -v a="$a_rps" -v b="$b_rps" 'BEGIN {print 100 * a / b}')"
}
row "master" "$PLAY/$PB.m3u8" "$STATIC/master.m3u8"
row "media playlist" "$PLAY/$PB/360p/index.m3u8" "$STATIC/360p/index.m3u8"
row "segment" "$PLAY/$PB/$SEGMENT" "$STATIC/$SEGMENT"

# 4. Token validation cost (issue 20): the master playlist of the signed ID
#    (token parsed, the key read from PostgreSQL, RS256 verified, the token
#    appended to every URI) against the public one, same run: p50, p99, ratio.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$PLAY/$PB_SIGNED.m3u8")" = 403 ] || die "the signed ID plays without a token"
curl -fsS "$PLAY/$PB_SIGNED.m3u8?token=$TOKEN" | grep -q "index.m3u8?token=$TOKEN" || die "the signed master playlist does not carry the token on"
read -r pub_rps pub_p50 pub_p99 <<<"$(wrk_stats "$PLAY/$PB.m3u8")"
read -r sig_rps sig_p50 sig_p99 <<<"$(wrk_stats "$PLAY/$PB_SIGNED.m3u8?token=$TOKEN")"
printf '
%-22s %10s %10s %10s
' "master playlist" "r/s" "p50 ms" "p99 ms"
printf '%-22s %10.0f %10s %10s
' "public" "$pub_rps" "$pub_p50" "$pub_p99" "signed (?token=)" "$sig_rps" "$sig_p50" "$sig_p99"
awk -v a="$sig_p50" -v b="$pub_p50" -v c="$sig_p99" -v d="$pub_p99" -v e="$sig_rps" -v f="$pub_rps" \
    'BEGIN {printf "%-22s %9.0f%% %9.2fx %9.2fx   (signed / public)\n", "ratio", 100 * e / f, a / b, c / d}'

# 5. Proxy vs redirect: mean time of one segment, sequential (one viewer).
mean_ms() {   # mean_ms CURL_ARGS... : mean time_total over SEGMENTS_CURL fetches
    local i total=0 t
    for i in $(seq 1 "$SEGMENTS_CURL"); do
        t="$(curl -fsS -o /dev/null -w '%{time_total}' "$@")"
        total="$(awk -v a="$total" -v b="$t" 'BEGIN {print a + b}')"
    done
    awk -v t="$total" -v n="$SEGMENTS_CURL" 'BEGIN {printf "%.2f", 1000 * t / n}'
}
proxied="$(mean_ms "$PLAY/$PB/$SEGMENT")"
direct="$(mean_ms --aws-sigv4 "aws:amz:$VID__S3__REGION:s3" --user "$VID__S3__ACCESS_KEY_ID:$VID__S3__SECRET_ACCESS_KEY" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" "$S3/$PREFIX$SEGMENT")"
lookup="$(mean_ms "$PLAY/$PB/360p/index.m3u8")"
printf '\nsegment (%s B), one at a time, mean of %s:\n' "$(wc -c <"$STREAM/$SEGMENT")" "$SEGMENTS_CURL"
printf '  proxied by playback            %6s ms\n' "$proxied"
printf '  straight from Garage (signed)  %6s ms  (a redirect adds a playback round trip first, ~%s ms: ~%s ms)\n' \
    "$direct" "$lookup" "$(awk -v a="$direct" -v b="$lookup" 'BEGIN {printf "%.2f", a + b}')"
