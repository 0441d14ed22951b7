//! `vidctl endpoints …`: webhook endpoints and their deliveries.

use serde_json::json;
use vid_client::{Client, DeliveryFilter, EndpointChanges};
use vid_core::endpoint::{CreateEndpoint, EndpointSummary, SignatureFormat};
use vid_core::event::EventType;
use vid_core::EndpointId;

use crate::cli::EndpointCmd;
use crate::output::Output;
use crate::view::{delivery_row, endpoint_status, event_types, fields, health_line, print_endpoint, vstr};

/// Runs one `endpoints` subcommand.
pub(crate) async fn endpoints(client: &Client, cmd: EndpointCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        EndpointCmd::Create { url, description, event_types, signature_format } => {
            let event_types = if event_types.is_empty() { None } else { Some(event_types) };
            let created = client.create_endpoint(&CreateEndpoint { url, description, event_types, signature_format }).await?;
            out.show(&created, |c| {
                print_endpoint(&c.endpoint);
                println!("secret       {}", c.secret);
                println!("(the secret is shown only now: store it to verify deliveries)");
            });
        }
        EndpointCmd::List => {
            let p = client.list_endpoints().await?;
            out.list(&p, &["ENDPOINT", "STATUS", "SUCCESS", "SIGNATURE", "EVENTS", "URL"], endpoint_row);
        }
        EndpointCmd::Get { id } => out.show(&client.get_endpoint(&id).await?, |e| {
            print_endpoint(&e.endpoint);
            fields(&[("health", health_line(&e.health))]);
        }),
        EndpointCmd::Update { id, url, description, clear_description, event_types, all_event_types, signature_format } => {
            let update = Update { url, description, clear_description, event_types, all_event_types, signature_format };
            update.update(client, &id, out).await?;
        }
        EndpointCmd::Delete { id } => {
            client.delete_endpoint(&id).await?;
            out.show_with(|| json!({ "deleted": id }), || println!("deleted {id}"));
        }
        EndpointCmd::RotateSecret { id } => out.show(&client.rotate_endpoint_secret(&id).await?, |r| {
            fields(&[
                ("endpoint", vstr(r, "id")),
                ("secret", vstr(r, "secret")),
                ("old secret valid until", vstr(r, "previous_secret_expires_at")),
            ]);
            println!("(the new secret is shown only now; deliveries carry both signatures until the old one expires)");
        }),
        EndpointCmd::Enable { id } => out.show(&client.enable_endpoint(&id).await?, print_endpoint),
        EndpointCmd::Deliveries { id, status, event_type, limit, cursor } => {
            let filter = DeliveryFilter { status: status.as_deref(), event_type: event_type.as_deref(), limit, cursor: cursor.as_deref() };
            let p = client.list_deliveries(&id, &filter).await?;
            out.page(&p, &["DELIVERY", "EVENT", "TYPE", "STATUS", "ATTEMPTS", "LAST", "NEXT ATTEMPT"], delivery_row);
        }
        EndpointCmd::Retry { id, delivery_id } => out.show(&client.retry_delivery(&id, &delivery_id).await?, |d| {
            println!("retry queued: {} is {} (attempts so far: {})", vstr(d, "id"), vstr(d, "status"), vstr(d, "attempt_count"))
        }),
    }
    Ok(())
}

/// One row of the endpoints table.
fn endpoint_row(s: &EndpointSummary) -> Vec<String> {
    let e = &s.endpoint;
    let success = s.health.success_rate.map_or_else(|| "-".into(), |r| format!("{:.0} %", r * 100.0));
    vec![e.id.to_string(), endpoint_status(e), success, e.signature_format.as_str().into(), event_types(e), e.url.clone()]
}

/// The flags of `endpoints update`.
struct Update {
    url: Option<String>,
    description: Option<String>,
    clear_description: bool,
    event_types: Vec<EventType>,
    all_event_types: bool,
    signature_format: Option<SignatureFormat>,
}

impl Update {
    /// Sends the changes (at least one flag must be given) and shows the endpoint.
    async fn update(self, client: &Client, id: &EndpointId, out: Output) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.url.is_some()
                || self.description.is_some()
                || self.clear_description
                || !self.event_types.is_empty()
                || self.all_event_types
                || self.signature_format.is_some(),
            "nothing to change: give --url, --description, --clear-description, --event-type, --all-event-types or --signature-format"
        );
        let changes = EndpointChanges {
            url: self.url.as_deref(),
            description: self.description.as_deref(),
            event_types: if self.event_types.is_empty() { None } else { Some(&self.event_types) },
            signature_format: self.signature_format,
            clear_description: self.clear_description,
            all_event_types: self.all_event_types,
        };
        out.show(&client.update_endpoint(id, &changes).await?, print_endpoint);
        Ok(())
    }
}
