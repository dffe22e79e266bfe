//! The `emp` command. Each subcommand group lives in its own module; this
//! file only parses the command line and reports errors as `emp: <message>`
//! with exit status 1.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod fw;

/// EMP: OS-bypass messaging on an emulated programmable NIC.
#[derive(Parser, Debug)]
#[command(name = "emp", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Firmware images: signing keys, packing, signing, inspection.
    Fw {
        #[command(subcommand)]
        cmd: fw::FwCmd,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Fw { cmd } => fw::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("emp: {msg}");
            ExitCode::FAILURE
        }
    }
}
