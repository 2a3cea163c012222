//! A replicated key-value store: every replica applies the updates in the
//! group's agreed order, and a replica that joins later gets the state from
//! a member (state transfer, `shoal_client::state`), then the updates after
//! it.
//!
//! ```text
//! shoal daemon &
//! cargo run -p shoal-client --example kv -- store r1     # one terminal
//! cargo run -p shoal-client --example kv -- store r2     # another, any time
//! ```
//!
//! Commands on stdin, one a line: `set KEY VALUE`, `del KEY`, `get KEY`
//! (prints `KEY=VALUE` or `KEY?`), `dump` (every pair sorted, then
//! `end`), `sync` (prints `synced` once every update this replica sent
//! before it has been applied here). Commands wait until the replica holds
//! the state. The daemon's socket is the default one, or `$SHOAL_SOCKET`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use shoal_client::state::{Replica, StateTransfer};
use shoal_client::{Client, ClientError, Endpoint, Membership, Message, SendOptions, Service};

/// Message types of the store (below `state::RESERVED_TYPES`).
const SET: u16 = 1;
const DEL: u16 = 2;
const SYNC: u16 = 3;

#[allow(dead_code)]
fn main() -> Result<(), ClientError> {
    let mut args = std::env::args().skip(1);
    let group = args.next().unwrap_or_else(|| "store".to_string());
    let name = args
        .next()
        .unwrap_or_else(|| format!("kv-{}", std::process::id()));
    let endpoint = match std::env::var_os("SHOAL_SOCKET") {
        Some(path) => Endpoint::Unix(path.into()),
        None => Endpoint::default(),
    };
    let (lines, input) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    run(&endpoint, &group, &name, input, std::io::stdout())
}

/// The store's state: the map, as every replica holds it.
#[derive(Default)]
struct Store {
    map: BTreeMap<String, String>,
    /// Sync markers of this replica delivered (to answer `sync`).
    synced: Vec<Vec<u8>>,
    me: String,
}

impl Replica for Store {
    fn apply(&mut self, m: &Message) {
        let text = String::from_utf8_lossy(&m.payload);
        match m.mess_type {
            SET => {
                if let Some((k, v)) = text.split_once(' ') {
                    self.map.insert(k.to_string(), v.to_string());
                }
            }
            DEL => {
                self.map.remove(text.as_ref());
            }
            SYNC if m.sender == self.me => self.synced.push(m.payload.clone()),
            _ => {}
        }
    }

    fn view(&mut self, _view: &Membership) {}

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in &self.map {
            for s in [k, v] {
                out.extend_from_slice(&(s.len() as u32).to_be_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
        out
    }

    fn restore(&mut self, mut snapshot: &[u8]) {
        self.map.clear();
        let mut take = || -> Option<String> {
            let len = u32::from_be_bytes(*snapshot.first_chunk::<4>()?) as usize;
            let s = String::from_utf8_lossy(snapshot.get(4..4 + len)?).into_owned();
            snapshot = &snapshot[4 + len..];
            Some(s)
        };
        while let (Some(k), Some(v)) = (take(), take()) {
            self.map.insert(k, v);
        }
    }
}

/// Runs one replica until `input` ends: commands from `input`, answers to
/// `out`.
pub fn run(
    endpoint: &Endpoint,
    group: &str,
    name: &str,
    input: mpsc::Receiver<String>,
    mut out: impl Write,
) -> Result<(), ClientError> {
    let mut client = Client::connect_to(endpoint, name)?;
    let mut state = StateTransfer::new(group, client.private_group());
    let mut store = Store {
        me: client.private_group().to_string(),
        ..Store::default()
    };
    client.join(group)?;
    let mut waiting: Vec<String> = Vec::new();
    let mut syncs = 0u64;
    let mut input_open = true;
    while input_open || !waiting.is_empty() {
        if let Some(event) = client.receive_timeout(Duration::from_millis(20))? {
            // Events of other groups: none here.
            let _ = state.handle(&mut store, event);
            client.send_pending(&mut state)?;
        }
        loop {
            match input.try_recv() {
                Ok(line) => waiting.push(line),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    input_open = false;
                    break;
                }
            }
        }
        if !state.is_ready() {
            continue;
        }
        for line in std::mem::take(&mut waiting) {
            let mut words = line.splitn(2, ' ');
            let (cmd, rest) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let update = |t| SendOptions {
                self_discard: false,
                mess_type: t,
            };
            match cmd {
                "set" => client.multicast_with(
                    Service::Agreed,
                    &[group],
                    rest.as_bytes(),
                    update(SET),
                )?,
                "del" => client.multicast_with(
                    Service::Agreed,
                    &[group],
                    rest.as_bytes(),
                    update(DEL),
                )?,
                "get" => match store.map.get(rest) {
                    Some(v) => writeln!(out, "{rest}={v}").map_err(ClientError::Io)?,
                    None => writeln!(out, "{rest}?").map_err(ClientError::Io)?,
                },
                "dump" => {
                    for (k, v) in &store.map {
                        writeln!(out, "{k}={v}").map_err(ClientError::Io)?;
                    }
                    writeln!(out, "end").map_err(ClientError::Io)?;
                }
                "sync" => {
                    syncs += 1;
                    let token = syncs.to_be_bytes();
                    client.multicast_with(Service::Agreed, &[group], &token, update(SYNC))?;
                    // Answered here: wait for the marker, applying what
                    // comes before it.
                    while !store.synced.iter().any(|t| t[..] == token) {
                        if let Some(event) = client.receive_timeout(Duration::from_millis(20))? {
                            let _ = state.handle(&mut store, event);
                            client.send_pending(&mut state)?;
                        }
                    }
                    writeln!(out, "synced").map_err(ClientError::Io)?;
                }
                "" => {}
                other => writeln!(out, "unknown command {other:?}").map_err(ClientError::Io)?,
            }
            out.flush().map_err(ClientError::Io)?;
        }
    }
    client.disconnect()
}
