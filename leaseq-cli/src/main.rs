//! # leaseq, the command-line tool
//!
//! Inspects and manages leaseq queue files from a shell: counts and lists jobs, shows one,
//! lists and removes schedules, enqueues, requeues dead jobs, purges, prunes, compacts,
//! checks, and moves jobs between files as JSON lines (`export` / `import`), and watches a
//! running app's queues live (`watch`) and serves their web dashboard (`dashboard`).
//! `leaseq --help`
//! lists the commands, the exit codes (0 success, 1 a problem found, 2 a usage or runtime
//! error) and how queues are chosen; docs/cli.md documents the JSON-lines schema.
//!
//! The tool uses leaseq's public API only. Errors are one line on stderr starting with
//! `leaseq: `; progress bars appear only when stderr is a terminal; logs (`-v`, `-vv`) go to
//! stderr and nothing is logged without them.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

mod args;
mod dashboard;
mod duration;
mod fail;
mod files;
mod output;
mod read;
mod source;
mod transfer;
mod watch;
mod write;

use args::{Cli, Command};
use fail::{CliResult, one_line};

fn main() -> ExitCode {
    // A bug must still end as one line, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("leaseq: internal error (a bug): {}{at}", one_line(&message));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_tracing(cli.verbose);
    match std::panic::catch_unwind(|| run(&cli.command)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(f)) if f.quiet => ExitCode::SUCCESS,
        Ok(Err(f)) => {
            eprintln!("leaseq: {}", one_line(&f.message));
            ExitCode::from(f.code)
        }
        Err(_) => ExitCode::from(2),
    }
}

fn run(command: &Command) -> CliResult {
    match command {
        Command::Stats(a) => read::stats(a),
        Command::Ls(a) => read::ls(a),
        Command::Show(a) => read::show(a),
        Command::Queues(a) => read::queues(a),
        Command::Schedules(a) => read::schedules(a),
        Command::ScheduleRemove(a) => write::schedule(a, write::ScheduleOp::Remove),
        Command::SchedulePause(a) => write::schedule(a, write::ScheduleOp::Pause),
        Command::ScheduleResume(a) => write::schedule(a, write::ScheduleOp::Resume),
        Command::ScheduleTrigger(a) => write::schedule(a, write::ScheduleOp::Trigger),
        Command::Limit(a) => write::limit(a),
        Command::Check(a) => read::check(a),
        Command::Enqueue(a) => write::enqueue(a),
        Command::RequeueDead(a) => write::requeue_dead(a),
        Command::Pause(a) => write::pause(a),
        Command::Resume(a) => write::resume(a),
        Command::Cancel(a) => write::cancel(a),
        Command::Retry(a) => write::retry(a),
        Command::Promote(a) => write::promote(a),
        Command::Purge(a) => write::purge(a),
        Command::Prune(a) => write::prune(a),
        Command::Compact(a) => write::compact(a),
        Command::Export(a) => transfer::export(a),
        Command::Import(a) => transfer::import(a),
        Command::Watch(a) => watch::watch(a),
        Command::Dashboard(a) => dashboard::dashboard(a),
    }
}

/// Help and version go to stdout as clap writes them; every other parse error becomes one
/// line on stderr and exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return match e.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        eprintln!("leaseq: a command is required (see leaseq --help)");
        return ExitCode::from(2);
    }
    let rendered = e.render().to_string();
    let first: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .collect();
    let text = one_line(&first.join(" "));
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    eprintln!("leaseq: {text} (see leaseq --help)");
    ExitCode::from(2)
}

/// Logs to stderr only behind `-v` (info) and `-vv` (debug; `-vvv` trace).
fn init_tracing(verbose: u8) {
    use tracing_subscriber::filter::LevelFilter;
    let level = match verbose {
        0 => return,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
