//! `api`: the HTTP API server and its admin commands.

use anyhow::Context;
use clap::{Parser, Subcommand};
use vid_api::{Application, Settings};
use vid_infra::ExposeSecret;

#[derive(Parser)]
#[command(name = "api", version, about = "Video platform API server and admin commands")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTP (the default).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Create a tenant and print its first API key (shown once; only its hash is stored).
    CreateTenant {
        /// Display name of the tenant.
        #[arg(long)]
        name: String,
    },
    /// Configure the media bucket: CORS exposing ETag to browsers, and a lifecycle
    /// rule that aborts incomplete multipart uploads after a day.
    StorageSetup,
}

/// A configuration or start-up error ends the process with one line (its
/// chain of causes), never a backtrace: see `vid_infra::exit`.
fn main() -> std::process::ExitCode {
    vid_infra::exit::exit_code("api", run())
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings: Settings = vid_infra::settings::load().context("loading settings")?;
    let command = cli.command.unwrap_or(Command::Serve);
    if matches!(command, Command::Serve) {
        vid_infra::telemetry::init(&settings.telemetry);
        vid_infra::metrics::install();
    } else {
        // Admin commands print their result on stdout (`create-tenant`'s key
        // is captured by scripts): logs must not mix into it.
        vid_infra::telemetry::init_stderr(&settings.telemetry);
    }
    match command {
        Command::Serve => {
            tracing::info!(profile = %vid_infra::settings::profile(), settings = ?settings, "starting api");
            migrate_when_reachable(&settings).await?;
            let app = Application::build(settings)?;
            tracing::info!(port = app.port(), "listening");
            app.run().await
        }
        Command::Migrate => {
            let applied = migrate_when_reachable(&settings).await?;
            println!("applied {} migration(s): {}", applied.len(), applied.join(", "));
            Ok(())
        }
        Command::CreateTenant { name } => {
            vid_db::migrate(settings.database.url.expose_secret()).await?;
            let pool = vid_db::pool(&settings.database)?;
            let (tenant, key) = vid_api::auth::create_tenant(&pool, &name).await?;
            eprintln!("created tenant {tenant} ({name})");
            println!("{key}");
            Ok(())
        }
        Command::StorageSetup => storage_setup(&settings).await,
    }
}

/// Applies pending migrations, retrying for `database.startup_wait_seconds`
/// while PostgreSQL is unreachable (a container may start before its database).
async fn migrate_when_reachable(settings: &Settings) -> anyhow::Result<Vec<String>> {
    let limit = std::time::Duration::from_secs(settings.database.startup_wait_seconds);
    vid_infra::startup::wait_for("PostgreSQL", limit, || vid_db::migrate(settings.database.url.expose_secret())).await
}

async fn storage_setup(settings: &Settings) -> anyhow::Result<()> {
    use aws_sdk_s3::types::{
        AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, CorsConfiguration, CorsRule, ExpirationStatus, LifecycleRule,
        LifecycleRuleFilter,
    };
    let s3 = vid_infra::storage::client(&settings.s3);
    let bucket = &settings.s3.bucket;
    let cors = CorsConfiguration::builder()
        .cors_rules(
            CorsRule::builder()
                .allowed_origins("*")
                .allowed_methods("PUT")
                .allowed_methods("GET")
                .allowed_methods("HEAD")
                .allowed_headers("*")
                .expose_headers("ETag")
                .max_age_seconds(3600)
                .build()?,
        )
        .build()?;
    s3.put_bucket_cors().bucket(bucket).cors_configuration(cors).send().await.context("PutBucketCors")?;
    println!("bucket {bucket}: CORS set (PUT/GET/HEAD from any origin, ETag exposed)");
    let lifecycle = BucketLifecycleConfiguration::builder()
        .rules(
            LifecycleRule::builder()
                .id("abort-incomplete-multipart-uploads")
                .status(ExpirationStatus::Enabled)
                .filter(LifecycleRuleFilter::builder().prefix("tenants/").build())
                .abort_incomplete_multipart_upload(AbortIncompleteMultipartUpload::builder().days_after_initiation(1).build())
                .build()?,
        )
        .build()?;
    match s3.put_bucket_lifecycle_configuration().bucket(bucket).lifecycle_configuration(lifecycle).send().await {
        Ok(_) => println!("bucket {bucket}: lifecycle rule aborts incomplete multipart uploads after 1 day"),
        Err(e) => println!(
            "bucket {bucket}: the store refused the lifecycle rule ({}); the api janitor still aborts expired uploads",
            aws_sdk_s3::error::DisplayErrorContext(e)
        ),
    }
    Ok(())
}
