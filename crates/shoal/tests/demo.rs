//! `shoal demo` end to end: the built binary, four members on loopback, 5%
//! injected loss. Asserts the exit status and the printed table (every
//! member delivered every message, none lost). Nothing here depends on how
//! fast the machine is: a moderate rate, and a generous time limit.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TIME_LIMIT: Duration = Duration::from_secs(180);

fn run_demo(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .arg("demo")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoal starts");
    let pid = child.id();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    loop {
        if let Ok(output) = rx.recv_timeout(Duration::from_secs(1)) {
            return output.expect("shoal ran");
        }
        if started.elapsed() > TIME_LIMIT {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("shoal demo {args:?} did not finish within {TIME_LIMIT:?}");
        }
    }
}

/// The `sent:` count and the table's rows as (member, delivered, lost).
fn parse(stdout: &str) -> (u64, Vec<(String, u64, u64)>) {
    let sent = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sent: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("a `sent:` line");
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("member"));
    let header: Vec<&str> = lines
        .next()
        .expect("a table header")
        .split_whitespace()
        .collect();
    let column = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (delivered, lost) = (column("delivered"), column("lost"));
    let rows = lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            let number = |i: usize| cells[i].parse::<u64>().expect("a count");
            (cells[0].to_string(), number(delivered), number(lost))
        })
        .collect();
    (sent, rows)
}

#[test]
fn demo_with_loss_loses_nothing() {
    assert_all_delivered(&["--nodes", "4", "--loss", "0.05", "--duration", "2"]);
}

#[test]
fn demo_over_unicast_fan_out_loses_nothing() {
    assert_all_delivered(&[
        "--nodes",
        "4",
        "--loss",
        "0.05",
        "--duration",
        "2",
        "--transport",
        "unicast",
    ]);
}

fn assert_all_delivered(args: &[&str]) {
    let output = run_demo(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        output.status
    );
    let (sent, rows) = parse(&stdout);
    assert!(sent > 0, "{stdout}");
    assert_eq!(rows.len(), 4, "one row per member\n{stdout}");
    for (member, delivered, lost) in rows {
        assert_eq!(lost, 0, "{member} lost messages\n{stdout}");
        assert_eq!(
            delivered, sent,
            "{member} did not deliver everything\n{stdout}"
        );
    }
}

#[test]
fn demo_rejects_bad_arguments() {
    for args in [
        &["--nodes", "1"][..],
        &["--loss", "1"],
        &["--loss", "-0.1"],
        &["--size", "4"],
        &["--size", "70000"],
        &["--duration", "0"],
    ] {
        let output = run_demo(args);
        assert!(!output.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--"), "{args:?}: unclear error: {stderr}");
    }
}
