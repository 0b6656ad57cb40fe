//! The `airlock` command line. Thin: parse, call the library, print.

mod cli;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // A compile child (see `airlock::sandbox::Compiler`) does only that.
    if let Some(code) = airlock::sandbox::compile_child_main() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into a log file or pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    raise_descriptor_limit();
    let args = cli::Cli::parse_with_help();
    let mut builder = if args.one_thread() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            cli::print_error(&format!("cannot start the async runtime: {e}"));
            return ExitCode::from(cli::EXIT_INTERNAL);
        }
    };
    let code = runtime.block_on(cli::run(args));
    // Everything the command waited for has ended. What may remain are
    // blocking threads stuck in work nobody waits for (a DNS lookup that
    // never answers): exit without joining them.
    runtime.shutdown_background();
    code
}

/// Raises this process's soft limit on open descriptors to its hard limit,
/// as Go's runtime does at start. The soft limit is often 1,024: fewer than
/// an HTTP server's connections and its tools' files at once, while the
/// hard limit is the operator's word on what the process may hold. A
/// failure leaves the limit as it was.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Rlimit {
        current: Some(soft),
        maximum: Some(hard),
    } = getrlimit(Resource::Nofile)
    else {
        return;
    };
    if soft >= hard {
        return;
    }
    let raised = Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        tracing::debug!(error = %e, soft, hard, "cannot raise the open-descriptor limit");
    }
}

/// The log filter `RUST_LOG` asks for. A bare level (`RUST_LOG=debug`) is
/// Airlock's own: the libraries under it (wasmtime, Cranelift, hyper) stay
/// at `warn`, where their internals do not drown what Airlock says, but
/// for rmcp's service loop, at `error`: it warns of every error answer a
/// client gets and every client gone before its answer, which are the
/// client's to see (it is told), not the operator's, and would let any
/// client fill the server's log. Anything with a target
/// (`RUST_LOG=wasmtime=debug`, `warn,airlock=trace`) is taken as written;
/// nothing, or nothing valid, is the default.
fn log_filter(asked: Option<&str>) -> EnvFilter {
    const LIBRARIES: &str = "warn,rmcp::service=error";
    let asked = asked.map(str::trim).filter(|a| !a.is_empty());
    let levels = ["error", "warn", "info", "debug", "trace", "off"];
    let directives = match asked {
        Some(level) if levels.contains(&level.to_ascii_lowercase().as_str()) => {
            format!("{LIBRARIES},airlock={level}")
        }
        Some(other) => other.to_owned(),
        None => LIBRARIES.to_owned(),
    };
    EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new(LIBRARIES))
}
