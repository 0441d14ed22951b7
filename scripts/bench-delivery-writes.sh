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
#   floor      the same tables, leased in the insert (claim at fan-in): two
#              commits; what the dispatcher pays when it needs no claim
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
#              no leased index, fillfactor 40 (HOT_FILLFACTOR): the claim's UPDATE touches no
#              indexed column and can be a HOT update (a claim would then
#              skip leased rows in the heap; not how the claim works today)
#
# Each variant gets its own copy of the tables (CREATE TABLE … LIKE the
# migrated ones, with the same indexes, triggers and foreign keys), so the
# statements are the same shape; what differs is only the layout. These are
# plain statements, not the dispatcher's functions: the functions' reads,
# locks and bound checks come on top (scripts/bench-dispatch.sh measures the
# whole). Each round runs every variant once, starting one variant later
# than the round before; the ratio of each round is to `current` of the same
# round, and the median of the rounds is printed.
#
# Usage: scripts/bench-delivery-writes.sh
#   ROUNDS (3), SECONDS_EACH (8), CLIENTS (2: one per core), API_BIN
#   (target/release/api, for `api migrate` of the scratch database)
# Needs: .local/stack.env (scripts/stack.sh infra-up), pgbench (postgresql's
# client package; installed with apt-get if missing).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
[ -n "${VID__DATABASE__URL:-}" ] || source .local/stack.env
ROUNDS="${ROUNDS:-3}"
SECONDS_EACH="${SECONDS_EACH:-8}"
CLIENTS="${CLIENTS:-2}"
API_BIN="${API_BIN:-target/release/api}"
PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1 || true)"
if [ -z "$PGBENCH" ]; then
    echo "bench-delivery-writes: installing pgbench (apt-get install postgresql-client)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-client >/dev/null
    PGBENCH="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)"
fi
[ -x "$API_BIN" ] || cargo build --release -q -p vid-api --bin api

SERVER="${VID__DATABASE__URL%/*}"
DB="vidbench_writes_$$"
WORK="$(mktemp -d /tmp/vid-bench-writes.XXXXXX)"
cleanup() { psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
URL="$SERVER/$DB"
VID__DATABASE__URL="$URL" VID_PROFILE=development "$API_BIN" migrate >/dev/null
EP="ep_01jbenchwrites000000000000"

# One copy of the tables per variant. `a` (current, floor), `n` (narrow), `q` (queue), `u` (no_unique), `h` (hot_lease).
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
SELECT bench_copy('a', 100), bench_copy('n', 100), bench_copy('q', 100), bench_copy('u', 100), bench_copy('h', ${HOT_FILLFACTOR:-40});
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
  FROM unnest(bench_ids('dlv_', :b)) d;"
}
lease() { echo "UPDATE $1 SET locked_until = now() + interval '1 minute' WHERE $2 = ANY(bench_ids('dlv_', :b));"; }
record() { # record DELIVERIES ATTEMPTS CLEAR_LEASE
    echo "BEGIN;
UPDATE $1 SET status = 'succeeded',${3:+ locked_until = NULL,} next_attempt_at = NULL, attempt_count = attempt_count + 1,
  last_attempt_at = now(), updated_at = now() WHERE id = ANY(bench_ids('dlv_', :b));
INSERT INTO $2 (id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, response_status)
  SELECT 'att_' || substr(d, 5), d, '$EP', 1, now(), 1, 200 FROM unnest(bench_ids('dlv_', :b)) d;
COMMIT;"
}
next='SELECT nextval('"'batches'"') AS b \gset'
{ echo "$next"; insert a_deliveries NULL; lease a_deliveries id; record a_deliveries a_attempts y; } >"$WORK/current.sql"
{ echo "$next"; insert a_deliveries "now() + interval '1 minute'"; record a_deliveries a_attempts y; } >"$WORK/floor.sql"
{ echo "$next"; insert n_deliveries NULL | sed "s/repeat('x', 193)/''/"; lease n_deliveries id; record n_deliveries n_attempts y; } >"$WORK/narrow.sql"
{ echo "$next"; echo "BEGIN;"; insert q_deliveries NULL
  echo "INSERT INTO q_queue (delivery_id, endpoint_id, next_attempt_at) SELECT d, '$EP', now() FROM unnest(bench_ids('dlv_', :b)) d;"
  echo "COMMIT;"; lease q_queue delivery_id
  echo "BEGIN;"; echo "DELETE FROM q_queue WHERE delivery_id = ANY(bench_ids('dlv_', :b));"
  record q_deliveries q_attempts "" | sed '1d'; } >"$WORK/queue.sql"
{ echo "$next"; insert u_deliveries NULL; lease u_deliveries id; record u_deliveries u_attempts y; } >"$WORK/no_unique.sql"
# hot_lease keeps the lease until the outcome clears it (the outcome's UPDATE changes status: not HOT anyway).
{ echo "$next"; insert h_deliveries NULL; lease h_deliveries id; record h_deliveries h_attempts y; } >"$WORK/hot_lease.sql"

VARIANTS=(current floor narrow queue no_unique hot_lease)
declare -A RATE RATIOS
echo "bench-delivery-writes: $ROUNDS rounds of ${SECONDS_EACH}s per variant, $CLIENTS clients, batches of 64 deliveries (pgbench $("$PGBENCH" --version | awk '{print $3}'))"
for r in $(seq 1 "$ROUNDS"); do
    line="round $r:"
    # Each round starts one variant later, so none always runs first (or right after another).
    n=${#VARIANTS[@]}
    for i in $(seq 0 $((n - 1))); do
        v="${VARIANTS[$(((i + r - 1) % n))]}"
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
# Every variant wrote what it was meant to: 64 succeeded deliveries and 64 attempts a batch, no lease left.
checked="$(psql -Atq "$URL" -c "SELECT (SELECT count(*) FROM a_deliveries WHERE status <> 'succeeded' OR locked_until IS NOT NULL)
  + (SELECT count(*) FROM q_queue) + (SELECT count(*) FROM q_deliveries WHERE status <> 'succeeded')
  + (SELECT count(*) FROM n_deliveries WHERE status <> 'succeeded') + (SELECT count(*) FROM u_deliveries WHERE status <> 'succeeded') + (SELECT count(*) FROM h_deliveries WHERE status <> 'succeeded'),
  (SELECT count(*) FROM a_attempts) + (SELECT count(*) FROM n_attempts) + (SELECT count(*) FROM q_attempts) + (SELECT count(*) FROM u_attempts) + (SELECT count(*) FROM h_attempts),
  (SELECT count(*) FROM a_deliveries) + (SELECT count(*) FROM n_deliveries) + (SELECT count(*) FROM q_deliveries) + (SELECT count(*) FROM u_deliveries) + (SELECT count(*) FROM h_deliveries)")"
IFS='|' read -r unsettled attempts deliveries <<<"$checked"
[ "$unsettled" = 0 ] && [ "$attempts" = "$deliveries" ] \
    || { echo "bench-delivery-writes: $unsettled deliveries unsettled, $attempts attempts for $deliveries deliveries" >&2; exit 1; }
hot="$(psql -Atq "$URL" -c "SELECT n_tup_hot_upd || ' of ' || n_tup_upd FROM pg_stat_user_tables WHERE relname = 'h_deliveries'")"
echo "checked: $deliveries deliveries settled, one attempt each; hot_lease's HOT updates: $hot (the lease's half of them at most)"
for v in "${VARIANTS[@]}"; do
    # shellcheck disable=SC2086
    median="$(printf '%s\n' ${RATIOS[$v]} | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')"
    printf '%-10s ratio to current, median of %s: %s (rounds: %s)\n' "$v" "$ROUNDS" "$median" "${RATIOS[$v]% }"
done
