//! The `shoal` command as a user meets it, against real daemons on
//! loopback: readiness, retries, error texts, status, signals. Time bounds
//! are generous; nothing depends on this machine's speed except how long
//! the test takes.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shoal_client::{Client, ClientError, Endpoint, Received, Service};

const PATIENCE: Duration = Duration::from_secs(40);

fn shoal() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shoal"));
    c.env_remove("SHOAL_SOCKET").env_remove("NOTIFY_SOCKET");
    c
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A configuration of one daemon alone; `extra` is appended.
fn solo_config(dir: &Path, extra: &str) -> (PathBuf, PathBuf) {
    let socket = dir.join("solo.sock");
    let config = dir.join("solo.toml");
    let text = format!(
        "node = \"solo\"\nsocket = \"{}\"\nlisten = \"{}\"\n{extra}",
        socket.display(),
        free_udp_port(),
    );
    std::fs::write(&config, text).unwrap();
    (config, socket)
}

/// A daemon process, killed on drop.
struct Daemon(Child);

impl Daemon {
    fn start(config: &Path, stdout: Stdio, env: &[(&str, &Path)]) -> Daemon {
        let mut c = shoal();
        c.args(["daemon", "--log", "warn", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        Daemon(c.spawn().expect("start shoal daemon"))
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `shoal status --wait` against `socket`; its output.
fn status_wait(socket: &Path, extra: &[&str]) -> Output {
    shoal()
        .args(["status", "--wait", "--timeout", "40", "--socket"])
        .arg(socket)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn configuration_errors_name_the_file_and_say_things_once() {
    let dir = temp_dir("config");
    let missing = dir.join("missing.toml");
    let o = shoal()
        .args(["daemon", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    let cause = "No such file or directory (os error 2)";
    assert_eq!(line.matches(cause).count(), 1, "{line}");

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "nodes = \"x\"\n").unwrap();
    let o = shoal()
        .args(["daemon", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(err.contains("nodes"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_address_in_use_is_named() {
    let dir = temp_dir("inuse");
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = dir.join("c.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nlisten = \"{addr}\"\n",
            dir.join("c.sock").display()
        ),
    )
    .unwrap();
    let o = shoal()
        .args(["daemon", "--log", "error", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(line.contains(&addr.to_string()), "{line}");
    assert!(line.to_lowercase().contains("in use"), "{line}");
    assert_eq!(line.matches("(os error").count(), 1, "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ready_fd_and_notify_socket_say_when_clients_are_accepted() {
    let dir = temp_dir("ready");
    let (config, socket) = solo_config(&dir, "");
    let notify_path = dir.join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(PATIENCE)).unwrap();
    // Descriptor 1 is the daemon's stdout, a pipe to this test.
    let mut c = shoal();
    c.args(["daemon", "--log", "warn", "--ready-fd", "1", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut daemon = Daemon(c.spawn().unwrap());
    let mut line = String::new();
    BufReader::new(daemon.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let mut buf = [0u8; 64];
    let n = notify.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means ready: a client connects at once, without a retry.
    let client = Client::connect_to(&Endpoint::Unix(socket.clone()), "first").unwrap();
    client.disconnect().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn send_right_after_start_waits_for_the_daemon_instead_of_failing() {
    let dir = temp_dir("early");
    // A slow start: the daemon looks for peers for 3 s before it forms a
    // cluster alone.
    let (config, socket) = solo_config(&dir, "\n[cluster]\nfound_after = 3000\n");
    let _daemon = Daemon::start(&config, Stdio::null(), &[]);
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(10));
    }
    // Without waiting, the daemon refuses (code 10).
    let o = shoal()
        .args(["send", "g", "hi", "--wait", "0", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("code 10"), "{}", stderr(&o));
    // With the default wait, it succeeds once the daemon has joined.
    let o = shoal()
        .args(["send", "g", "hi", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn status_waits_honours_shoal_socket_and_speaks_json() {
    let dir = temp_dir("status");
    let (config, socket) = solo_config(&dir, "");
    let daemon = Daemon::start(&config, Stdio::null(), &[]);
    let o = shoal()
        .args(["status", "--wait", "--timeout", "40", "--json"])
        .env("SHOAL_SOCKET", &socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["fields"]["node"], "solo");
    assert!(v["fields"]["slots"]
        .as_str()
        .unwrap()
        .contains("(this daemon)"));
    let daemons = v["daemons"].as_array().unwrap();
    assert_eq!(daemons.len(), 1, "{v}");
    assert_eq!(daemons[0]["this"], true);
    assert_eq!(daemons[0]["id"], v["fields"]["id"]);
    assert!(daemons[0]["address"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));

    // SIGHUP is logged and ignored: the daemon serves on.
    daemon.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let o = status_wait(&socket, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("node: solo"), "{text}");
    // The daemon's id comes with its address.
    let id = text.lines().find(|l| l.starts_with("id: ")).unwrap();
    assert!(id.contains(" at 127.0.0.1:"), "{id}");

    // `send` and `listen` take the socket from SHOAL_SOCKET too.
    let o = shoal()
        .args(["send", "g", "hi"])
        .env("SHOAL_SOCKET", &socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn status_wait_gives_up_on_a_missing_daemon() {
    let dir = temp_dir("nowait");
    let o = shoal()
        .args(["status", "--wait", "--timeout", "0.3", "--socket"])
        .arg(dir.join("none.sock"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did not accept clients within 0.3 s"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn listen_to_a_private_group_exits_with_the_refusal() {
    let dir = temp_dir("listen");
    let (config, socket) = solo_config(&dir, "");
    let _daemon = Daemon::start(&config, Stdio::null(), &[]);
    assert!(status_wait(&socket, &[]).status.success());
    let mut child = shoal()
        .args(["listen", "#x", "--socket"])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("shoal listen '#x' kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.starts_with("error:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_with_a_missing_socket_fails_fast() {
    let dir = temp_dir("bench");
    let missing = dir.join("none.sock");
    let start = Instant::now();
    let o = shoal()
        .args(["bench", "--sockets"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("no daemon at {}", missing.display())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_message_over_message_size_is_refused_with_limit_and_the_connection_goes_on() {
    let dir = temp_dir("limit");
    let (config, socket) = solo_config(&dir, "\n[limits]\nmessage_size = 1000\n");
    let _daemon = Daemon::start(&config, Stdio::null(), &[]);
    assert!(status_wait(&socket, &[]).status.success());
    let mut c = Client::connect_to(&Endpoint::Unix(socket.clone()), "big").unwrap();
    c.join("g").unwrap();
    c.multicast(Service::Fifo, &["g"], &[1u8; 2000]).unwrap();
    c.multicast(Service::Fifo, &["g"], b"small").unwrap();
    let mut refused = false;
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(
            Instant::now() < deadline,
            "no delivery of the small message"
        );
        match c.receive_timeout(Duration::from_secs(1)) {
            Err(ClientError::Daemon { code, .. }) => {
                assert_eq!(code, shoal_client::code::LIMIT);
                refused = true;
            }
            Ok(Some(Received::Message(m))) => {
                assert_eq!(m.payload, b"small", "only the small one is delivered");
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused, "the big one was refused with LIMIT");
    c.disconnect().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_license_file_is_the_one_cargo_toml_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"Apache-2.0\""));
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    assert!(license.contains("Apache License\n                        Version 2.0, January 2004"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
}

#[test]
fn monitor_once_shows_the_groups_members_and_clients_and_speaks_json() {
    let dir = temp_dir("monitor");
    let (config, socket) = solo_config(&dir, "");
    let _daemon = Daemon::start(&config, Stdio::null(), &[]);
    assert!(status_wait(&socket, &[]).status.success());
    let endpoint = Endpoint::Unix(socket.clone());
    let mut alice = Client::connect_to(&endpoint, "alice").unwrap();
    alice.join("chat").unwrap();
    // Its own view says the join is done.
    loop {
        if let Received::Membership(v) = alice.receive().unwrap() {
            if v.group == "chat" {
                break;
            }
        }
    }
    let o = shoal()
        .args(["monitor", "--once", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["daemons"][0];
    assert_eq!(d["status"]["fields"]["node"], "solo");
    assert_eq!(d["status"]["quorum"], true);
    assert_eq!(
        d["status"]["groups"],
        serde_json::json!([{ "name": "chat", "members": ["#alice#solo"] }])
    );
    assert_eq!(d["status"]["clients"][0]["name"], "#alice#solo");
    assert_eq!(d["rates"], serde_json::Value::Null, "one sample: no rates");

    // The text view, once, without colours (not a terminal).
    let o = shoal()
        .args(["monitor", "--once", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.starts_with("daemon solo ("), "{text}");
    assert!(text.contains("quorum held"), "{text}");
    assert!(
        text.contains("    chat                 #alice#solo\n"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "{text}");

    // Two refreshes in JSON: the second has rates.
    let mut child = shoal()
        .args(["monitor", "--json", "--interval", "0.2", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let _first = lines.next().unwrap().unwrap();
    let second: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        second["daemons"][0]["rates"]["messages_sent"].is_number(),
        "{second}"
    );

    // A socket nobody serves: --once fails and says so.
    let o = shoal()
        .args(["monitor", "--once", "--socket"])
        .arg(dir.join("nobody.sock"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("no daemon at"),
        "{o:?}"
    );
    alice.disconnect().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
