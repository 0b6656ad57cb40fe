//! The `airlock` command line. Thin: parse, call the library, print.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
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
    runtime.block_on(cli::run(args))
}
