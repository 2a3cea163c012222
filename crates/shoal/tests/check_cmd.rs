//! `shoal check`: exit status 0 on a clean history, 1 on violations (with
//! the report on stdout), 2 on an unreadable file.

use std::process::Command;

use shoal_check::{Record, Service};

fn write(dir: &std::path::Path, name: &str, records: &[Record]) -> std::path::PathBuf {
    let path = dir.join(name);
    let text: String = records.iter().map(|r| r.to_json() + "\n").collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn shoal_check(files: &[&std::path::Path]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .arg("check")
        .args(files)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn exit_status_says_clean_or_not() {
    let dir = std::env::temp_dir().join(format!("shoal-check-cmd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members = ["#a", "#b"];
    let a = write(
        &dir,
        "a.jsonl",
        &[
            Record::view("#a", "g", 1, &members),
            Record::send("#a", 1, Service::Agreed, &["g"]),
            Record::deliver("#a", "#a", 1, Service::Agreed, &["g"]),
        ],
    );
    let b = write(
        &dir,
        "b.jsonl",
        &[
            Record::view("#b", "g", 1, &members),
            Record::deliver("#b", "#a", 1, Service::Agreed, &["g"]),
        ],
    );
    let (code, out) = shoal_check(&[&a, &b]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("clean") && out.contains("from 2 clients"),
        "{out}"
    );

    let dup = write(
        &dir,
        "dup.jsonl",
        &[Record::deliver("#b", "#a", 1, Service::Agreed, &["g"])],
    );
    let (code, out) = shoal_check(&[&a, &b, &dup]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("duplicate: 1"), "{out}");

    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"type\":\"nonsense\"}\n").unwrap();
    let (code, _) = shoal_check(&[&bad]);
    assert_eq!(code, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
