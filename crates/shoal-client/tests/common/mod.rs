//! A tiny fake daemon for the client tests: a thread that accepts one
//! connection on a Unix socket (or TCP) and runs a script speaking frames.
//! Its assertions run on its thread; `FakeDaemon::finish` re-raises a
//! failure there in the test. Timeouts here only bound a failing test.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use shoal_wire::client::{decode, Frame, Limits};

/// How long the fake daemon waits for the client before failing the test.
pub const BOUND: Duration = Duration::from_secs(20);

pub trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// The daemon's side of one connection.
pub struct Peer {
    stream: Box<dyn Conn>,
    buf: Vec<u8>,
}

impl Peer {
    /// The next frame the client sent; panics on EOF, garbage or timeout.
    pub fn read_frame(&mut self) -> Frame {
        self.try_read_frame()
            .expect("the client closed the connection")
    }

    /// The next frame, or `None` at EOF.
    pub fn try_read_frame(&mut self) -> Option<Frame> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((frame, used)) = decode(&self.buf, &Limits::default()).unwrap() {
                self.buf.drain(..used);
                return Some(frame);
            }
            let n = self.stream.read(&mut chunk).expect("fake daemon read");
            if n == 0 {
                assert!(self.buf.is_empty(), "EOF inside a frame");
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads the client's `ConnectExt` (asking for membership deltas), answers `ConnectOk`, returns (name,
    /// token).
    pub fn accept(&mut self, private_group: &str) -> (String, String) {
        match self.read_frame() {
            Frame::ConnectExt {
                name,
                token,
                features,
            } => {
                assert_eq!(features, shoal_wire::client::features::MEMBERSHIP_DELTAS);
                self.send(&Frame::ConnectOk {
                    private_group: private_group.to_string(),
                });
                (name, token)
            }
            other => panic!("expected ConnectExt, got {other:?}"),
        }
    }

    pub fn send(&mut self, frame: &Frame) {
        self.send_raw(&frame.to_vec().unwrap());
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("fake daemon write");
        self.stream.flush().unwrap();
    }

    /// Writes `bytes` in pieces of `piece` bytes, each its own write.
    pub fn send_in_pieces(&mut self, bytes: &[u8], piece: usize, pause: Duration) {
        for p in bytes.chunks(piece) {
            self.send_raw(p);
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
    }
}

pub struct FakeDaemon {
    pub path: PathBuf,
    dir: PathBuf,
    thread: Option<JoinHandle<()>>,
}

fn temp_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "shoal-client-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl FakeDaemon {
    /// Listens on a Unix socket in a fresh directory under /tmp; the
    /// script runs on the first connection.
    pub fn unix(script: impl FnOnce(Peer) + Send + 'static) -> FakeDaemon {
        let dir = temp_dir();
        let path = dir.join("shoal.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(BOUND)).unwrap();
            stream.set_write_timeout(Some(BOUND)).unwrap();
            script(Peer {
                stream: Box::new(stream),
                buf: Vec::new(),
            });
        });
        FakeDaemon {
            path,
            dir,
            thread: Some(thread),
        }
    }

    /// Listens on TCP (loopback, a free port); returns the address too.
    pub fn tcp(script: impl FnOnce(Peer) + Send + 'static) -> (FakeDaemon, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(BOUND)).unwrap();
            script(Peer {
                stream: Box::new(stream),
                buf: Vec::new(),
            });
        });
        let daemon = FakeDaemon {
            path: PathBuf::new(),
            dir: PathBuf::new(),
            thread: Some(thread),
        };
        (daemon, addr)
    }

    pub fn endpoint(&self) -> shoal_client::Endpoint {
        shoal_client::Endpoint::Unix(self.path.clone())
    }

    /// Waits for the script to end; a failed assertion there fails here.
    pub fn finish(mut self) {
        if let Some(t) = self.thread.take() {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A message frame as the daemon would send it.
pub fn message(sender: &str, groups: &[&str], payload: &[u8]) -> Frame {
    Frame::Message {
        sender: sender.to_string(),
        service: shoal_wire::client::Service::Agreed,
        groups: groups.iter().map(|g| g.to_string()).collect(),
        payload: payload.to_vec(),
    }
}
