-- webhook-dispatcher: the high-water mark of the event reconciliation
-- (issue 24; vid_deliveries::reconcile). One row: every event ordered at or
-- before (created_at, event_id) has its deliveries for every matching
-- endpoint (vid_deliveries::fanin::MATCH). Advanced only by a reconciliation
-- pass, in the transaction that created the missing deliveries of the events
-- it passes, and only past events older than the grace period. The row is
-- created by the first pass (at now() - lookback). Writer: the dispatcher.
CREATE TABLE webhook_reconcile_mark (
    singleton   BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    created_at  TIMESTAMPTZ NOT NULL,
    event_id    TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
