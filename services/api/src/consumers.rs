//! The api's RabbitMQ consumers: transcoder reports and dead-lettered jobs.
//!
//! Each message is applied in one database transaction and acked only after
//! that commit; a failure nacks it back to the queue. Reports are idempotent
//! (see [`crate::lifecycle`]), so redelivery is harmless.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use vid_core::messages::{ReportKind, TranscodeJob, TranscodeReport};
use vid_core::Problem;
use vid_infra::amqp::Topology;

use crate::lifecycle::{self, Applied, Outcome};
use crate::state::AppState;

/// Runs both consumers until the process exits, reconnecting as needed.
pub async fn run(state: AppState) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if let Err(e) = session(&state).await {
            tracing::warn!(error = %format!("{e:#}"), "report consumer interrupted; reconnecting");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn session(state: &AppState) -> anyhow::Result<()> {
    let conn = vid_infra::amqp::connect(&state.settings.amqp, Duration::from_secs(30)).await?;
    let ch = conn.create_channel().await?;
    state.topology.declare(&ch).await?;
    ch.basic_qos(32, BasicQosOptions::default()).await?;
    let mut reports = ch
        .basic_consume(&state.topology.transcode_reports(), "api-reports", BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let mut dead = ch
        .basic_consume(&state.topology.transcode_dead(), "api-dead-jobs", BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    tracing::info!("consuming transcoder reports");
    loop {
        tokio::select! {
            msg = reports.next() => {
                let Some(delivery) = msg else { anyhow::bail!("report consumer closed") };
                let delivery = delivery?;
                let outcome = match serde_json::from_slice::<TranscodeReport>(&delivery.data) {
                    Ok(report) => apply_report(state, &report).await,
                    Err(e) => {
                        tracing::error!(error = %e, "dropping malformed report");
                        Ok(())
                    }
                };
                settle(&delivery, outcome).await?;
            }
            msg = dead.next() => {
                let Some(delivery) = msg else { anyhow::bail!("dead-letter consumer closed") };
                let delivery = delivery?;
                let outcome = match serde_json::from_slice::<TranscodeJob>(&delivery.data) {
                    Ok(job) => fail_dead_job(state, &job).await,
                    Err(e) => {
                        tracing::error!(error = %e, "dropping malformed dead-lettered job");
                        Ok(())
                    }
                };
                settle(&delivery, outcome).await?;
            }
        }
    }
}

async fn settle(delivery: &lapin::message::Delivery, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
    match outcome {
        Ok(()) => delivery.acker.ack(BasicAckOptions::default()).await?,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "could not apply message; requeueing");
            tokio::time::sleep(Duration::from_millis(500)).await;
            delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
        }
    }
    Ok(())
}

/// Applies one transcoder report.
pub async fn apply_report(state: &AppState, report: &TranscodeReport) -> anyhow::Result<()> {
    let topo: &Topology = &state.topology;
    let applied = match &report.kind {
        ReportKind::Started => lifecycle::record_progress(&state.db, topo, &report.operation_id, None, 0).await?,
        ReportKind::Progress { phase, percent } => {
            lifecycle::record_progress(&state.db, topo, &report.operation_id, Some(*phase), *percent).await?
        }
        ReportKind::Scanned { outcome } => lifecycle::record_scan(&state.db, &report.operation_id, *outcome).await?,
        ReportKind::Succeeded { source, renditions, poster } => {
            let outcome = Outcome::Succeeded { source: source.clone(), renditions: renditions.clone(), poster: poster.clone() };
            let applied = lifecycle::finish(&state.db, topo, &report.operation_id, outcome).await?;
            if let Applied::AlreadyTerminal(status) = &applied {
                // Cancel won the race: the outputs must not outlive it.
                tracing::info!(operation = %report.operation_id, status = status.as_str(), "deleting outputs of a finished-after-cancel job");
                let mut keys: Vec<String> = renditions.iter().map(|r| r.storage_key.clone()).collect();
                keys.extend(poster.iter().map(|p| p.storage_key.clone()));
                for key in keys {
                    let _ = state.s3.delete_object().bucket(&state.settings.s3.bucket).key(key).send().await;
                }
            }
            applied
        }
        ReportKind::Failed { error, source } => {
            let outcome = Outcome::Failed { error: error.clone(), source: source.clone() };
            lifecycle::finish(&state.db, topo, &report.operation_id, outcome).await?
        }
    };
    if applied != Applied::Ignored {
        // Changed: an event to relay; AlreadyTerminal on a progress report: a cancel to re-send.
        state.outbox_notify.notify_one();
    }
    Ok(())
}

async fn fail_dead_job(state: &AppState, job: &TranscodeJob) -> anyhow::Result<()> {
    let error = Problem::new(500, "transcode_retries_exhausted", "Transcode failed repeatedly").with_detail(format!(
        "the job was handed to a worker {} times without an outcome (crashes or unavailable storage)",
        vid_infra::amqp::TRANSCODE_DELIVERY_LIMIT
    ));
    let applied = lifecycle::finish(&state.db, &state.topology, &job.operation_id, Outcome::Failed { error, source: None }).await?;
    if applied == Applied::Changed {
        state.outbox_notify.notify_one();
    }
    Ok(())
}
