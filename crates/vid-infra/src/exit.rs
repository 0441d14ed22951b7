//! How a service's `main` ends. A configuration or start-up error (a missing
//! sealing key, an unreachable database at start) is the operator's mistake,
//! not a bug: it is printed as its chain of causes on one line, e.g.
//! `api: loading settings: missing field `sealing_key``, whatever
//! `RUST_BACKTRACE` says (anyhow's `Debug` would add a backtrace when it is
//! set, as it is on many machines and container bases). Panics are bugs and
//! keep Rust's default hook, backtrace included.

use std::process::ExitCode;

/// The one line printed for `error`: `<program>: <error>: <cause>: …`.
pub fn error_line(program: &str, error: &anyhow::Error) -> String {
    format!("{program}: {error:#}")
}

/// Ends `main` with `result`: success for `Ok`; for `Err`, its
/// [`error_line`] on stderr and exit status 1. Use as
/// `fn main() -> ExitCode { vid_infra::exit::exit_code("api", run()) }`.
pub fn exit_code(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", error_line(program, &e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn the_chain_is_one_line_without_a_backtrace() {
        // What this machine and many container bases set; anyhow then captures a backtrace.
        std::env::set_var("RUST_LIB_BACKTRACE", "1");
        let e = Err::<(), _>(std::io::Error::other("no sealing key in production"))
            .context("reading [api] settings")
            .context("loading settings")
            .unwrap_err();
        assert!(format!("{e:?}").lines().count() > 1, "anyhow's Debug is several lines: {e:?}");
        let line = error_line("api", &e);
        assert_eq!(line, "api: loading settings: reading [api] settings: no sealing key in production");
    }
}
