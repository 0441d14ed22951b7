DROP TABLE IF EXISTS webhook_reconcile_mark;
