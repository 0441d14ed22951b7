//! The commands about operations, videos, playback IDs, uploads and events: each calls the
//! SDK once (or once per page) and hands the result to the [`Output`].

use std::time::Duration;

use serde_json::json;
use vid_client::{Client, ClientError, EventFilter, Page};

use crate::cli::{EventCmd, OperationCmd, PageArgs, PlaybackIdCmd, UploadCmd, VideoCmd};
use crate::exit::finish_operation;
use crate::output::Output;
use crate::upload::follow;
use crate::view::{
    dash, event_subject, fields, operation_row, operation_status_line, print_operation, print_playback_id, print_upload, print_video, time,
    unix_time,
};

/// `vidctl operations …`.
pub(crate) async fn operations(client: &Client, cmd: OperationCmd, out: Output, bars: bool) -> anyhow::Result<()> {
    match cmd {
        OperationCmd::Get { id } => out.show(&client.get_operation(&id).await?, print_operation),
        OperationCmd::List { status, page } => {
            let p = all_pages(&page, |c| {
                let status = status.clone();
                async move { client.list_operations(status.as_deref(), c.as_deref()).await }
            })
            .await?;
            out.page(&p, &["OPERATION", "STATUS", "PROGRESS", "PHASE", "VIDEO", "CREATED"], operation_row);
        }
        OperationCmd::Wait { id, timeout } => {
            let op = follow(client, &id, Duration::from_secs(timeout), bars).await?;
            out.show(&op, print_operation);
            finish_operation(&op)?;
        }
        OperationCmd::Cancel { id } => {
            let op = client.cancel_operation(&id).await?;
            out.show(&op, |op| println!("cancel requested: {} is {}", op.id, operation_status_line(op)));
        }
    }
    Ok(())
}

/// `vidctl videos …`.
pub(crate) async fn videos(client: &Client, cmd: VideoCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        VideoCmd::Get { id } => out.show(&client.get_video(&id).await?, print_video),
        VideoCmd::List { page } => {
            let p = all_pages(&page, |c| async move { client.list_videos(c.as_deref()).await }).await?;
            out.page(&p, &["VIDEO", "STATUS", "FILENAME", "RENDITIONS", "CREATED"], |v| {
                let names: Vec<&str> = v.renditions.iter().map(|r| r.name.as_str()).collect();
                vec![
                    v.id.to_string(),
                    v.status.as_str().into(),
                    dash(v.filename.as_ref()),
                    if names.is_empty() { "-".into() } else { names.join(",") },
                    time(&v.created_at),
                ]
            });
        }
    }
    Ok(())
}

/// `vidctl playback-ids …`.
pub(crate) async fn playback_ids(client: &Client, cmd: PlaybackIdCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        PlaybackIdCmd::Add { video, policy } => out.show(&client.create_playback_id(&video, policy).await?, print_playback_id),
        PlaybackIdCmd::Delete { video, playback_id } => {
            client.delete_playback_id(&video, &playback_id).await?;
            out.show_with(|| json!({ "deleted": playback_id, "video_id": video }), || println!("deleted {playback_id}"));
        }
    }
    Ok(())
}

/// `vidctl uploads …`.
pub(crate) async fn uploads(client: &Client, cmd: UploadCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        UploadCmd::Get { id } => out.show(&client.get_upload(&id).await?, print_upload),
        UploadCmd::Abort { id } => {
            client.abort_upload(&id).await?;
            out.show_with(|| json!({ "aborted": id }), || println!("aborted {id}"));
        }
    }
    Ok(())
}

/// `vidctl events …`.
pub(crate) async fn events(client: &Client, cmd: EventCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        EventCmd::Get { id } => out.show(&client.get_event(&id).await?, |e| {
            fields(&[
                ("event", e.id.to_string()),
                ("type", e.type_.as_str().into()),
                ("created", unix_time(e.created)),
                ("subject", event_subject(e)),
            ]);
            println!("\n{}", serde_json::to_string_pretty(e).expect("serialises"));
        }),
        EventCmd::List { type_, created_after, created_before, page } => {
            let p = all_pages(&page, |c| {
                let t = type_.clone();
                async move {
                    let filter = EventFilter { type_: t.as_deref(), created_after, created_before, limit: None, cursor: c.as_deref() };
                    client.list_events(&filter).await
                }
            })
            .await?;
            out.page(&p, &["EVENT", "TYPE", "CREATED", "SUBJECT"], |e| {
                vec![e.id.to_string(), e.type_.as_str().into(), unix_time(e.created), event_subject(e)]
            });
        }
    }
    Ok(())
}

/// The page at `--cursor` (or the first), or with `--all` every page joined
/// into one (its `next_cursor` then `None`).
async fn all_pages<T, F, Fut>(page: &PageArgs, mut fetch: F) -> Result<Page<T>, ClientError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T>, ClientError>>,
{
    let mut first = fetch(page.cursor.clone()).await?;
    if !page.all {
        return Ok(first);
    }
    while let Some(c) = first.next_cursor.take() {
        let next = fetch(Some(c)).await?;
        first.data.extend(next.data);
        first.next_cursor = next.next_cursor;
    }
    Ok(first)
}
