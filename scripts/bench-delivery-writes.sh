#!/usr/bin/env bash
# The database's share of one webhook delivery, by table layout (issue 22):
# what the writes alone cost in PostgreSQL, for the layout in force and for
# alternatives, each as a ratio to the layout in force measured in the same
# run. No HTTP, no broker, no dispatcher: pgbench runs, for each batch of 64
# deliveries, the writes a delivery goes through in the bench's burst:
#
#   current    the tables as migrated (webhook_deliveries with its five
#              indexes, two statement triggers and foreign keys;
#              webhook_attempts): the fan-in's insert (pending), the claim's
#              lease (an UPDATE of locked_until), and the recording (the
#              UPDATE to succeeded and the attempt rows, one transaction);
#              three commits
#   floor      the same layout, leased in the insert (claim at fan-in): two
#              commits; what the dispatcher pays when it needs no claim (its
#              insert also leaves out the due notification, which only an
#              unleased, due row sends)
#   narrow     the layout in force with the payload left out of the delivery
#              row (as if it were read from `events` at send time; that
#              read is not in the writes measured here)
#   queue      the lease out of the delivery row: a narrow queue table
#              (delivery id, endpoint, due time, lease) holds what is
#              pending and is leased and deleted; the delivery row loses the
#              two partial indexes and is updated once, at the outcome
#   no_unique  the tables in force without UNIQUE (event_id, endpoint_id)
#              (as if the delivery id were derived from the pair, so the
#              primary key alone made the fan-in idempotent)
#   hot_lease  the claimable index without the lease in its predicate and
#              no leased index, fillfactor 40 (HOT_FILLFACTOR): the claim's
#              UPDATE touches no indexed column and can be a HOT update (a
#              claim would then skip leased rows in the heap; not how the
#              claim works today). HOT_FILLFACTOR=100 keeps the same indexes
#              with (nearly) no HOT update: what dropping the index alone gives
#
# Each variant gets its own copy of the tables (CREATE TABLE … LIKE the
# migrated ones, with the same indexes, triggers and foreign keys), so the
# statements are the same shape; what differs is only the layout. These are
# plain statements of the dispatcher's writes (its inserts' ON CONFLICT DO
# NOTHING, its lease's columns), not its functions: the functions' reads,
# locks and bound checks come on top (scripts/bench-dispatch.sh measures the
# whole). Each round runs every variant once, in an order shuffled anew; the
# ratio of each round is to `current` of the same round, and the median of
# the rounds is printed. Afterwards each variant's tables are checked: every
# delivery settled with one attempt, and as many updates as its statements
# make (pg_stat_user_tables); hot_lease's HOT updates are counted.
#
# Usage: scripts/bench-delivery-writes.sh
#   ROUNDS (3), SECONDS_EACH (8), CLIENTS (2: one per core), HOT_FILLFACTOR
#   (40), API_BIN (target/release/api, built if missing; for `api migrate`
#   of the scratch database)
# Needs: .local/stack.env (scripts/stack.sh infra-up), pgbench (postgresql's
# client package; installed with apt-get if missing).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
die() { echo "bench-delivery-writes: $*" >&2; exit 1; }
if [ -z "${VID__DATABASE__URL:-}" ]; then
    [ -f .local/stack.env ] || die "no VID__DATABASE__URL and no .local/stack.env: run scripts/stack.sh infra-up first"
    # shellcheck disable=SC1091
    source .local/stack.env
fi
ROUNDS="${ROUNDS:-3}"
SECONDS_EACH="${SECONDS_EACH:-8}"
CLIENTS="${CLIENTS:-2}"
HOT_FILLFACTOR="${HOT_FILLFACTOR:-40}"
for v in ROUNDS SECONDS_EACH CLIENTS; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ "$HOT_FILLFACTOR" =~ ^[0-9]+$ ]] && [ "$HOT_FILLFACTOR" -ge 10 ] && [ "$HOT_FILLFACTOR" -le 100 ] \
    || die "HOT_FILLFACTOR must be an integer from 10 to 100 (got '$HOT_FILLFACTOR')"
# The scratch database lives on the same server: bench_db replaces the URL's database part.
[[ "$VID__DATABASE__URL" =~ ^(postgres(ql)?://[^/?]+)/[^/?]+$ ]] \
    || die "VID__DATABASE__URL must look like postgres://user@host:port/database, without parameters (got '$VID__DATABASE__URL')"
PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1 || true)"
if [ -z "$PGBENCH" ]; then
    echo "bench-delivery-writes: installing pgbench (apt-get install postgresql-client)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-client >/dev/null
    PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)"
fi
if [ -z "${API_BIN:-}" ]; then
    API_BIN=target/release/api
    [ -x "$API_BIN" ] || cargo build --release -q -p vid-api --bin api
fi
[ -x "$API_BIN" ] || die "API_BIN=$API_BIN is not an executable (leave API_BIN unset to build target/release/api)"

# shellcheck source=scripts/lib/bench-http.sh
source scripts/lib/bench-http.sh   # bench_db: the scratch database, migrated by $API_BIN
DB=""
WORK="$(mktemp -d /tmp/vid-bench-writes.XXXXXX)"
cleanup() {
    if [ -n "$DB" ]; then
        psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null \
            || echo "bench-delivery-writes: could not drop the scratch database $DB; drop it by hand" >&2
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
bench_db writes
URL="$VID__DATABASE__URL"
EP="ep_01jbenchwrites000000000000"

# One copy of the tables per variant: `a` (current), `f` (floor), `n` (narrow), `q` (queue), `u` (no_unique), `h` (hot_lease).
psql -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
INSERT INTO tenants (id, name) VALUES ('ten_bench', 'bench');
INSERT INTO webhook_endpoints (id, tenant_id, url, signature_format, status, secret_sealed)
  VALUES ('$EP', 'ten_bench', 'https://example.invalid/hook', 'webhook-signature', 'enabled', '\\x00');
CREATE SEQUENCE batches;
CREATE FUNCTION bench_ids(prefix text, b bigint) RETURNS text[] LANGUAGE sql IMMUTABLE
  AS \$\$ SELECT array_agg(prefix || lpad(b::text, 12, '0') || lpad(g::text, 14, '0') ORDER BY g) FROM generate_series(1, 64) g \$\$;
CREATE FUNCTION bench_copy(p text, fillfactor int) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
  EXECUTE format('CREATE TABLE %I (LIKE webhook_deliveries INCLUDING ALL) WITH (fillfactor = %s)', p || '_deliveries', fillfactor);
  EXECUTE format('ALTER TABLE %I ADD FOREIGN KEY (endpoint_id) REFERENCES webhook_endpoints(id)', p || '_deliveries');
  EXECUTE format('CREATE TRIGGER due_on_insert AFTER INSERT ON %I REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION webhook_deliveries_due_notify()', p || '_deliveries');
  EXECUTE format('CREATE TRIGGER due_on_update AFTER UPDATE ON %I REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION webhook_deliveries_due_notify()', p || '_deliveries');
  EXECUTE format('CREATE TABLE %I (LIKE webhook_attempts INCLUDING ALL)', p || '_attempts');
  EXECUTE format('ALTER TABLE %I ADD FOREIGN KEY (delivery_id) REFERENCES %I(id)', p || '_attempts', p || '_deliveries');
END \$\$;
SELECT bench_copy('a', 100), bench_copy('f', 100), bench_copy('n', 100), bench_copy('q', 100), bench_copy('u', 100), bench_copy('h', $HOT_FILLFACTOR);
-- queue: the delivery row keeps the primary key, the pair and the log's index; the lease lives in q_queue.
DO \$\$ DECLARE i text; BEGIN
  FOR i IN SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'q_deliveries'::regclass AND indpred IS NOT NULL LOOP
    EXECUTE 'DROP INDEX ' || i; END LOOP;
  FOR i IN SELECT conname FROM pg_constraint WHERE conrelid = 'u_deliveries'::regclass AND contype = 'u' LOOP
    EXECUTE 'ALTER TABLE u_deliveries DROP CONSTRAINT ' || i; END LOOP;
  FOR i IN SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'h_deliveries'::regclass AND indpred IS NOT NULL LOOP
    EXECUTE 'DROP INDEX ' || i; END LOOP;
END \$\$;
CREATE TABLE q_queue (delivery_id text PRIMARY KEY REFERENCES q_deliveries(id), endpoint_id text NOT NULL,
                      next_attempt_at timestamptz NOT NULL, locked_until timestamptz);
CREATE INDEX ON q_queue (endpoint_id, next_attempt_at, delivery_id) WHERE locked_until IS NULL;
CREATE INDEX ON q_queue (endpoint_id, locked_until) WHERE locked_until IS NOT NULL;
CREATE INDEX ON h_deliveries (endpoint_id, next_attempt_at, id) WHERE status = 'pending';
SQL

# The statements, per variant (pgbench scripts: one batch of 64 deliveries each).
insert() { # insert TABLE LOCKED_UNTIL
    echo "INSERT INTO $1 (id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, locked_until)
  SELECT d, 'ten_bench', '$EP', 'evt_' || substr(d, 5), 'video.ready', repeat('x', 193), 'pending', now(), $2
  FROM unnest(bench_ids('dlv_', :b)) d ON CONFLICT DO NOTHING;"
}
lease() { # lease TABLE KEY [UPDATED_AT]
    echo "UPDATE $1 SET locked_until = now() + interval '1 minute'${3:+, updated_at = now()} WHERE $2 = ANY(bench_ids('dlv_', :b));"
}
record() { # record DELIVERIES ATTEMPTS CLEAR_LEASE
    echo "BEGIN;
UPDATE $1 SET status = 'succeeded',${3:+ locked_until = NULL,} next_attempt_at = NULL, attempt_count = attempt_count + 1,
  last_attempt_at = now(), updated_at = now() WHERE id = ANY(bench_ids('dlv_', :b));
INSERT INTO $2 (id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, response_status)
  SELECT 'att_' || substr(d, 5), d, '$EP', 1, now(), 1, 200 FROM unnest(bench_ids('dlv_', :b)) d
  ON CONFLICT DO NOTHING;
COMMIT;"
}
next='SELECT nextval('"'batches'"') AS b \gset'
{ echo "$next"; insert a_deliveries NULL; lease a_deliveries id y; record a_deliveries a_attempts y; } >"$WORK/current.sql"
{ echo "$next"; insert f_deliveries "now() + interval '1 minute'"; record f_deliveries f_attempts y; } >"$WORK/floor.sql"
{ echo "$next"; insert n_deliveries NULL | sed "s/repeat('x', 193)/''/"; lease n_deliveries id y; record n_deliveries n_attempts y; } >"$WORK/narrow.sql"
{ echo "$next"; echo "BEGIN;"; insert q_deliveries NULL
  echo "INSERT INTO q_queue (delivery_id, endpoint_id, next_attempt_at) SELECT d, '$EP', now() FROM unnest(bench_ids('dlv_', :b)) d;"
  echo "COMMIT;"; lease q_queue delivery_id
  echo "BEGIN;"; echo "DELETE FROM q_queue WHERE delivery_id = ANY(bench_ids('dlv_', :b));"
  record q_deliveries q_attempts "" | sed '1d'; } >"$WORK/queue.sql"
{ echo "$next"; insert u_deliveries NULL; lease u_deliveries id y; record u_deliveries u_attempts y; } >"$WORK/no_unique.sql"
# hot_lease keeps the lease until the outcome clears it (the outcome's UPDATE changes status: not HOT anyway).
{ echo "$next"; insert h_deliveries NULL; lease h_deliveries id y; record h_deliveries h_attempts y; } >"$WORK/hot_lease.sql"

VARIANTS=(current floor narrow queue no_unique hot_lease)
declare -A RATE RATIOS
echo "bench-delivery-writes: $ROUNDS rounds of ${SECONDS_EACH}s per variant, $CLIENTS clients, batches of 64 deliveries (pgbench $("$PGBENCH" --version | awk '{print $3}'))"
for r in $(seq 1 "$ROUNDS"); do
    line="round $r:"
    # A new order each round: no variant always runs first, or right after another.
    for v in $(printf '%s\n' "${VARIANTS[@]}" | shuf); do
        out="$("$PGBENCH" -n -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_EACH" -f "$WORK/$v.sql" "$URL" 2>&1)" \
            || { echo "$out" >&2; echo "bench-delivery-writes: pgbench failed on $v" >&2; exit 1; }
        tps="$(echo "$out" | awk '/^tps = /{print $3; exit}')"
        fails="$(echo "$out" | awk '/number of failed transactions/{print $5; exit}')"
        [ "${fails:-0}" = 0 ] || { echo "$out" >&2; echo "bench-delivery-writes: $v had failed transactions" >&2; exit 1; }
        RATE[$v,$r]="$(awk -v t="$tps" 'BEGIN{printf "%.0f", t * 64}')"
        line+=" $v ${RATE[$v,$r]}/s"
    done
    for v in "${VARIANTS[@]}"; do
        RATIOS[$v]+="$(awk -v a="${RATE[$v,$r]}" -v b="${RATE[current,$r]}" 'BEGIN{printf "%.3f", a / b}') "
    done
    echo "$line"
done
# Every variant wrote what it was meant to, in its own tables: each delivery
# succeeded, unleased, with one attempt, and updated as often as its
# statements update it (the lease and the outcome, or the outcome alone).
check() { # check VARIANT PREFIX UPDATES_A_DELIVERY
    local got
    got="$(psql -Atq -v ON_ERROR_STOP=1 "$URL" -c "SELECT (SELECT count(*) FROM $2_deliveries),
        (SELECT count(*) FROM $2_deliveries WHERE status <> 'succeeded' OR locked_until IS NOT NULL),
        (SELECT count(*) FROM $2_attempts),
        (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = '$2_deliveries')")"
    local rows unsettled attempts updates
    IFS='|' read -r rows unsettled attempts updates <<<"$got"
    [ "$rows" -gt 0 ] && [ "$unsettled" = 0 ] && [ "$attempts" = "$rows" ] && [ "$updates" = $(($3 * rows)) ] \
        || die "$1 did not write what it should: $rows deliveries, $unsettled unsettled, $attempts attempts, $updates updates (want $(($3 * rows)))"
    total=$((total + rows))
}
total=0
for spec in current:a:2 floor:f:1 narrow:n:2 queue:q:1 no_unique:u:2 hot_lease:h:2; do
    IFS=: read -r v prefix k <<<"$spec"
    check "$v" "$prefix" "$k"
done
queue_left="$(psql -Atq "$URL" -c "SELECT (SELECT count(*) FROM q_queue) || '|' || n_tup_upd || '|' || n_tup_del FROM pg_stat_user_tables WHERE relname = 'q_queue'")"
q_rows="$(psql -Atq "$URL" -c "SELECT count(*) FROM q_deliveries")"
[ "$queue_left" = "0|$q_rows|$q_rows" ] || die "queue: q_queue left|updated|deleted = $queue_left, want 0|$q_rows|$q_rows"
IFS='|' read -r hot_rows hot_upd <<<"$(psql -Atq "$URL" -c "SELECT (SELECT count(*) FROM h_deliveries) || '|' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'h_deliveries'")"
echo "checked: $total deliveries, each settled with one attempt and updated as its variant's statements say; hot_lease: $hot_upd of its $hot_rows leases were HOT updates (fillfactor $HOT_FILLFACTOR)"
[ $((hot_upd * 10)) -ge $((hot_rows * 9)) ] \
    || echo "bench-delivery-writes: warning: under 90 % of hot_lease's leases were HOT, so its ratio is mostly the dropped index (HOT_FILLFACTOR=$HOT_FILLFACTOR)"
for v in "${VARIANTS[@]}"; do
    # shellcheck disable=SC2086
    median="$(printf '%s\n' ${RATIOS[$v]} | sort -n | awk '{a[NR]=$1} END{if (NR % 2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2] + a[NR/2+1]) / 2}')"
    printf '%-10s ratio to current, median of %s: %s (rounds: %s)\n' "$v" "$ROUNDS" "$median" "${RATIOS[$v]% }"
done
