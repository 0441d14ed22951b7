//! One broker session: connect and set up the consumers ([`Worker::open`]),
//! run each job delivery in its own task, route cancels to the jobs that hold
//! the operation, and on shutdown stop consuming and drain.
//!
//! Invariants: a session that fails aborts its job tasks (children killed,
//! work dirs removed: the broker redelivers the jobs); a graceful shutdown
//! gives running jobs `shutdown_grace_seconds`, then stops them with
//! [`Stop::Shutdown`] (they are handed back, see [`super::delivery`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vid_core::messages::CancelTranscode;
use vid_core::OperationId;
use vid_infra::amqp::Publisher;

use super::metrics::consumed;
use super::Worker;
use crate::child::Stop;

/// Running jobs by delivery tag: operation, run id and the stop switch of its child.
pub(super) type Active = Arc<Mutex<HashMap<u64, Running>>>;

/// One running job delivery, as a cancel sees it.
pub(super) struct Running {
    /// The operation it works on.
    pub(super) operation_id: OperationId,
    /// The run id minted for this delivery (see `TranscodeReport::run_id`).
    pub(super) run_id: String,
    /// Stops its steps and child.
    pub(super) stop: watch::Sender<Option<Stop>>,
}

impl Running {
    /// Whether `cancel` is meant for this run: same operation, and either no
    /// run named (every run) or this run named.
    pub(super) fn is_target_of(&self, cancel: &CancelTranscode) -> bool {
        self.operation_id == cancel.operation_id && cancel.run_id.as_ref().is_none_or(|r| *r == self.run_id)
    }
}

/// A session's broker side, as [`Worker::open`] leaves it.
struct Opened {
    conn: lapin::Connection,
    /// Confirm-mode channel: reports and shutdown republishes.
    publisher: Publisher,
    /// The jobs channel (prefetch = concurrency).
    ch: lapin::Channel,
    /// Consumer tag of the jobs consumer.
    tag: String,
    jobs: lapin::Consumer,
    /// Kept open for `cancels`.
    ctl: lapin::Channel,
    cancels: lapin::Consumer,
}

impl Worker {
    /// One session: `Ok` after a graceful shutdown (also one that comes while
    /// connecting), `Err` when the broker side failed (the caller reconnects).
    pub(super) async fn session(&self, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
        // During a broker outage `open` retries for up to 30 s: a shutdown does not wait for it.
        let opened = tokio::select! {
            o = self.open() => o?,
            _ = shutdown.wait_for(|s| *s) => {
                tracing::info!("shutting down while connecting to RabbitMQ");
                return Ok(());
            }
        };
        let Opened { conn, publisher, ch, tag, mut jobs, ctl: _ctl, mut cancels } = opened;
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!(queue = %self.topology.transcode_jobs(), concurrency = self.settings.transcoder.concurrency.max(1), "consuming transcode jobs");

        let active: Active = Arc::default();
        let mut tasks = JoinSet::new();
        let result: anyhow::Result<()> = loop {
            tokio::select! {
                d = jobs.next() => match d {
                    Some(Ok(delivery)) => self.spawn_job(&mut tasks, delivery, &publisher, &active),
                    Some(Err(e)) => break Err(anyhow!(e).context("the job consumer failed")),
                    None => break Err(anyhow!("the job consumer was closed by the broker")),
                },
                c = cancels.next() => match c {
                    Some(Ok(d)) => self.on_cancel(&d, &active),
                    Some(Err(e)) => break Err(anyhow!(e).context("the control consumer failed")),
                    None => break Err(anyhow!("the control consumer was closed")),
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = shutdown.wait_for(|s| *s) => break Ok(()),
            }
        };
        if let Err(e) = result {
            tasks.abort_all(); // kills the children (kill_on_drop) and cleans the work dirs (guards)
            return Err(e);
        }
        self.drain(&ch, &tag, tasks, &active).await;
        self.ready.store(false, Ordering::SeqCst);
        let _ = conn.close(200, "transcoder shutting down").await;
        Ok(())
    }

    /// Runs one job delivery in its own task, with its own stop switch.
    fn spawn_job(&self, tasks: &mut JoinSet<()>, delivery: Delivery, publisher: &Publisher, active: &Active) {
        let (tx, rx) = watch::channel(None);
        let this = self.clone();
        let publisher = publisher.clone();
        let active = active.clone();
        tasks.spawn(async move { this.handle(delivery, publisher, active, tx, rx).await });
    }

    /// A `CancelTranscode` from the control fan-out (auto-acked: a cancel is a
    /// broadcast hint): stops every job here that holds the operation, or,
    /// when the cancel names a run, only that run (issue 24's protocol).
    fn on_cancel(&self, d: &Delivery, active: &Active) {
        // The metric label of the exclusive, server-named control queue: its exchange (stable).
        consumed(&self.topology.control_exchange(), "ack");
        let correlation_id = vid_infra::amqp::correlation_id(&d.properties).unwrap_or_default();
        let span = tracing::info_span!("cancel", correlation_id = %correlation_id);
        let _g = span.enter();
        match serde_json::from_slice::<CancelTranscode>(&d.data) {
            Ok(c) => {
                let (mut held, mut stopped) = (0, 0);
                for run in active.lock().unwrap().values().filter(|r| r.operation_id == c.operation_id) {
                    held += 1;
                    if run.is_target_of(&c) {
                        let _ = run.stop.send(Some(Stop::Cancel));
                        stopped += 1;
                    }
                }
                tracing::info!(operation_id = %c.operation_id, run_id = c.run_id.as_deref().unwrap_or("*"), held, stopped, "cancel received");
            }
            Err(e) => tracing::warn!(error = %e, "malformed cancel message ignored"),
        }
    }

    /// Graceful shutdown: no new jobs; the running ones get the grace period,
    /// then are stopped ([`Stop::Shutdown`]) and get 10 s more before their
    /// tasks are aborted.
    async fn drain(&self, ch: &lapin::Channel, tag: &str, mut tasks: JoinSet<()>, active: &Active) {
        tracing::info!(running = tasks.len(), "shutting down: consumer cancelled");
        if let Err(e) = ch.basic_cancel(tag, BasicCancelOptions::default()).await {
            tracing::warn!(error = %e, "basic.cancel failed");
        }
        let grace = Duration::from_secs(self.settings.transcoder.shutdown_grace_seconds);
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(running = tasks.len(), "grace period over: killing and requeueing the running jobs");
            for run in active.lock().unwrap().values() {
                let _ = run.stop.send(Some(Stop::Shutdown));
            }
            if tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await.is_err() {
                tasks.abort_all();
            }
        }
    }

    /// Connects (retrying for up to 30 s, see `vid_infra::amqp::connect`),
    /// declares the topology and starts both consumers: the jobs (prefetch =
    /// concurrency, manual ack) and this worker's exclusive control queue.
    /// Dropping the future midway closes whatever it had opened.
    async fn open(&self) -> anyhow::Result<Opened> {
        let conn = vid_infra::amqp::connect(&self.settings.amqp, Duration::from_secs(30)).await?;
        let publisher = Publisher::new(&conn).await.context("opening the publisher channel")?;
        self.topology.declare(publisher.channel()).await?;
        let ch = conn.create_channel().await?;
        let concurrency = self.settings.transcoder.concurrency.max(1);
        ch.basic_qos(concurrency, BasicQosOptions::default()).await?;
        let tag = format!("transcoder-{}", self.name);
        let jobs = ch
            .basic_consume(&self.topology.transcode_jobs(), &tag, BasicConsumeOptions::default(), FieldTable::default())
            .await
            .context("consuming transcode jobs")?;
        let ctl = conn.create_channel().await?;
        let q = ctl
            .queue_declare("", QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() }, FieldTable::default())
            .await?;
        ctl.queue_bind(q.name().as_str(), &self.topology.control_exchange(), "", QueueBindOptions::default(), FieldTable::default())
            .await?;
        let cancels = ctl
            .basic_consume(q.name().as_str(), "", BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default())
            .await?;
        Ok(Opened { conn, publisher, ch, tag, jobs, ctl, cancels })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_targets_its_run_or_every_run_of_its_operation() {
        let op = OperationId::generate();
        let run = Running { operation_id: op.clone(), run_id: "01JDQ8Z6V8W3K5N2P4R6T8X0YA".into(), stop: watch::channel(None).0 };
        let cancel = |operation_id: &OperationId, run_id: Option<&str>| CancelTranscode {
            operation_id: operation_id.clone(),
            run_id: run_id.map(str::to_owned),
        };
        assert!(run.is_target_of(&cancel(&op, None)), "no run named: every run");
        assert!(run.is_target_of(&cancel(&op, Some("01JDQ8Z6V8W3K5N2P4R6T8X0YA"))), "this run named");
        assert!(!run.is_target_of(&cancel(&op, Some("01JDQ8Z6V8W3K5N2P4R6T8X0YB"))), "another run named");
        assert!(!run.is_target_of(&cancel(&OperationId::generate(), None)), "another operation");
        assert!(!run.is_target_of(&cancel(&op, Some(""))), "the run \"\" is an old transcoder's, not this one");
    }
}
