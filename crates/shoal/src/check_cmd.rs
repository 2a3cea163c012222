//! `shoal check FILE...`: judges JSON-lines histories with the history
//! checker (`crates/shoal-check/README.md` defines what it checks).

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// JSON-lines files, one record per line (`-` reads stdin). Together
    /// they are one history: typically one file per client, or one for all;
    /// each client's records must be in its own order.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

/// Prints the report. Exit status 0 when clean, 1 on violations, 2 when a
/// file cannot be read.
pub fn run(args: CheckArgs) -> ExitCode {
    match judge(&args.files) {
        Ok(report) => {
            print!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn judge(files: &[PathBuf]) -> anyhow::Result<shoal_check::Report> {
    let mut checker = shoal_check::Checker::new();
    for path in files {
        let records = if path.as_os_str() == "-" {
            shoal_check::read_jsonl(std::io::stdin().lock())
        } else {
            let file =
                std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
            shoal_check::read_jsonl(BufReader::new(file))
        }
        .with_context(|| format!("read {}", path.display()))?;
        checker.extend(records);
    }
    Ok(checker.finish())
}
