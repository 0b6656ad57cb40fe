//! The `airlock` command line. Thin: parse, call the library, print.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // A compile child (see `airlock::sandbox::Compiler`) does only that.
    if let Some(code) = airlock::sandbox::compile_child_main() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // The OCI client logs what registries' token endpoints answer (the
    // tokens) at debug level: its logs stay at warn, whatever RUST_LOG asks.
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    for quiet in ["oci_client=warn", "oci_client::client=warn"] {
        if let Ok(directive) = quiet.parse() {
            filter = filter.add_directive(directive);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into a log file or pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let args = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
