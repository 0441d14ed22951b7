//! `vidctl signing-keys …` (the tenant's keys for signed playback) and
//! `vidctl playback sign` (a playback token, offline: it needs the private
//! key file, not the API).

use anyhow::Context as _;
use serde_json::json;
use vid_client::Client;

use crate::cli::{PlaybackCmd, SigningKeyCmd};
use crate::output::Output;
use crate::view::{fields, time};

/// `vidctl signing-keys …`.
pub(crate) async fn signing_keys(client: &Client, cmd: SigningKeyCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        SigningKeyCmd::Create { out: file } => {
            let key = client.create_signing_key().await?;
            match file {
                Some(path) => {
                    write_private(&path, &key.private_key)?;
                    out.show_with(
                        || json!({ "id": key.id, "created_at": key.created_at, "private_key_file": path }),
                        || println!("created {} (private key written to {})", key.id, path.display()),
                    );
                }
                None => out.show(&key, |k| {
                    fields(&[("signing key", k.id.to_string()), ("created", time(&k.created_at))]);
                    println!("\n{}", k.private_key.trim_end());
                    eprintln!("\nthe private key is shown this once: keep it on your server");
                }),
            }
        }
        SigningKeyCmd::List { page } => {
            let mut p = client.list_signing_keys(page.cursor.as_deref()).await?;
            // --all: follow `next_cursor` to the last page.
            if page.all {
                while let Some(c) = p.next_cursor.take() {
                    let next = client.list_signing_keys(Some(&c)).await?;
                    p.data.extend(next.data);
                    p.next_cursor = next.next_cursor;
                }
            }
            out.page(&p, &["SIGNING KEY", "CREATED"], |k| vec![k.id.to_string(), time(&k.created_at)]);
        }
        SigningKeyCmd::Delete { id } => {
            client.delete_signing_key(&id).await?;
            out.show_with(|| json!({ "deleted": id }), || println!("deleted {id}"));
        }
    }
    Ok(())
}

/// `vidctl playback …`.
pub(crate) fn playback(cmd: PlaybackCmd, out: Output) -> anyhow::Result<()> {
    let PlaybackCmd::Sign { key_file, key_id, playback_id, audience, expires_in } = cmd;
    let pem = std::fs::read_to_string(&key_file).with_context(|| format!("reading --key-file {}", key_file.display()))?;
    let token = vid_client::sign_playback_token(&pem, &key_id, &playback_id, audience, expires_in)?;
    out.show_with(|| json!({ "token": token }), || println!("{token}"));
    Ok(())
}

/// Creates `path` (refusing an existing file) readable by its owner only.
fn write_private(path: &std::path::Path, pem: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).with_context(|| format!("creating --out {}", path.display()))?;
    f.write_all(pem.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use std::time::Duration;

    use vid_core::playback::Audience;
    use vid_core::{PlaybackId, SigningKeyId};

    use crate::cli::parse_duration;
    use crate::cli::{Cli, Command};

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "0", "0h", "1w", "h", "-1h", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn playback_sign_takes_the_key_the_id_the_audience_and_a_lifetime() {
        let (kid, pb) = (SigningKeyId::generate().to_string(), PlaybackId::generate().to_string());
        let args = ["vidctl", "playback", "sign", "--key-file", "k.pem", "--key-id", &kid, "--playback-id", &pb];
        let cli = Cli::try_parse_from(args.iter().chain(&["--audience", "t", "--expires-in", "1h"])).unwrap();
        match cli.command {
            Command::Playback(PlaybackCmd::Sign { audience, expires_in, .. }) => {
                assert_eq!((audience, expires_in), (Audience::Thumbnail, Duration::from_secs(3600)))
            }
            _ => panic!("not playback sign"),
        }
        assert!(Cli::try_parse_from(args.iter().chain(&["--audience", "x"])).is_err());
        assert!(Cli::try_parse_from(["vidctl", "playback", "sign", "--key-file", "k.pem", "--key-id", &pb, "--playback-id", &pb]).is_err());
    }
}
