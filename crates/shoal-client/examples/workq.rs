//! A work queue: submitters multicast jobs to a group of workers, and each
//! job is done by one worker. Jobs, completions and the workers' views are
//! all in the group's agreed order, so every worker computes the same
//! assignment without asking anyone: a job goes to the worker that a hash
//! of its id picks among the group's members at that point of the order.
//! When a worker leaves, the jobs it had not reported done go, in the same
//! way, to the workers that remain; a worker that joins later gets the
//! list of jobs not yet done by state transfer (`shoal_client::state`).
//!
//! ```text
//! shoal daemon &
//! cargo run -p shoal-client --example workq -- worker jobs w1    # workers
//! cargo run -p shoal-client --example workq -- worker jobs w2
//! cargo run -p shoal-client --example workq -- submit jobs boss  # one job a line on stdin
//! ```
//!
//! A worker prints `ready` once it is in the group and holds the list of
//! jobs, then `did ID PAYLOAD` for each job it does (here: nothing more
//! than printing), and runs until stdin ends. A job is done once while
//! its worker stays; a worker that fails after doing a job and before its
//! completion is ordered leaves that job to be done again (at least once).
//! The daemon's socket is the default one, or `$SHOAL_SOCKET`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use shoal_client::state::{Replica, StateTransfer};
use shoal_client::{Client, ClientError, Endpoint, Membership, Message, SendOptions, Service};

/// Message types (below `state::RESERVED_TYPES`).
const JOB: u16 = 1;
const DONE: u16 = 2;

#[allow(dead_code)]
fn main() -> Result<(), ClientError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let endpoint = match std::env::var_os("SHOAL_SOCKET") {
        Some(path) => Endpoint::Unix(path.into()),
        None => Endpoint::default(),
    };
    let (role, group, name) = match &args[..] {
        [role, group, name] => (role.as_str(), group.as_str(), name.as_str()),
        _ => {
            eprintln!("usage: workq worker|submit GROUP NAME");
            std::process::exit(2);
        }
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
    match role {
        "worker" => work(&endpoint, group, name, input, std::io::stdout()),
        "submit" => submit(&endpoint, group, name, input),
        _ => {
            eprintln!("usage: workq worker|submit GROUP NAME");
            std::process::exit(2);
        }
    }
}

/// Sends each line of `input` as a job (the submitter need not be a
/// member of the group).
pub fn submit(
    endpoint: &Endpoint,
    group: &str,
    name: &str,
    input: mpsc::Receiver<String>,
) -> Result<(), ClientError> {
    let mut client = Client::connect_to(endpoint, name)?;
    let job = SendOptions {
        self_discard: false,
        mess_type: JOB,
    };
    for (seq, line) in input.iter().enumerate() {
        // The id: this submitter's address and a sequence number.
        let payload = format!("{}/{seq} {line}", client.private_group());
        client.multicast_with(Service::Agreed, &[group], payload.as_bytes(), job)?;
    }
    client.disconnect()
}

/// FNV-1a: the same on every worker, whatever its platform.
fn hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What every worker holds alike: the jobs not done yet, and whose each is.
#[derive(Default)]
struct Queue {
    me: String,
    members: Vec<String>,
    /// id → (worker, payload).
    pending: BTreeMap<String, (String, String)>,
    /// Jobs this worker has to do now (it does them outside the replica).
    todo: Vec<(String, String)>,
}

impl Queue {
    fn assign(&self, id: &str) -> String {
        let n = self.members.len().max(1) as u64;
        self.members
            .get((hash(id) % n) as usize)
            .cloned()
            .unwrap_or_default()
    }

    fn give(&mut self, id: String, payload: String) {
        let worker = self.assign(&id);
        if worker == self.me {
            self.todo.push((id.clone(), payload.clone()));
        }
        self.pending.insert(id, (worker, payload));
    }
}

impl Replica for Queue {
    fn apply(&mut self, m: &Message) {
        let text = String::from_utf8_lossy(&m.payload).into_owned();
        match m.mess_type {
            JOB => {
                let (id, payload) = text.split_once(' ').unwrap_or((&text, ""));
                self.give(id.to_string(), payload.to_string());
            }
            DONE => {
                self.pending.remove(&text);
            }
            _ => {}
        }
    }

    fn view(&mut self, view: &Membership) {
        self.members.clone_from(&view.members);
        // The jobs of workers gone go to those that remain.
        let orphans: Vec<(String, String)> = self
            .pending
            .iter()
            .filter(|(_, (w, _))| !self.members.contains(w))
            .map(|(id, (_, p))| (id.clone(), p.clone()))
            .collect();
        for (id, payload) in orphans {
            self.give(id, payload);
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = String::new();
        for (id, (w, p)) in &self.pending {
            out.push_str(&format!("{id}\t{w}\t{p}\n"));
        }
        out.into_bytes()
    }

    fn restore(&mut self, snapshot: &[u8]) {
        self.pending.clear();
        for line in String::from_utf8_lossy(snapshot).lines() {
            let mut f = line.splitn(3, '\t');
            if let (Some(id), Some(w), Some(p)) = (f.next(), f.next(), f.next()) {
                if w == self.me {
                    self.todo.push((id.to_string(), p.to_string()));
                }
                self.pending
                    .insert(id.to_string(), (w.to_string(), p.to_string()));
            }
        }
    }
}

/// Runs one worker until `input` ends; `did ID PAYLOAD` lines to `out`.
pub fn work(
    endpoint: &Endpoint,
    group: &str,
    name: &str,
    input: mpsc::Receiver<String>,
    mut out: impl Write,
) -> Result<(), ClientError> {
    let mut client = Client::connect_to(endpoint, name)?;
    let mut state = StateTransfer::new(group, client.private_group());
    let mut queue = Queue {
        me: client.private_group().to_string(),
        ..Queue::default()
    };
    client.join(group)?;
    let done = SendOptions {
        self_discard: false,
        mess_type: DONE,
    };
    let mut said_ready = false;
    loop {
        if let Some(event) = client.receive_timeout(Duration::from_millis(20))? {
            let _ = state.handle(&mut queue, event);
            client.send_pending(&mut state)?;
        }
        if state.is_ready() && !said_ready {
            said_ready = true;
            writeln!(out, "ready").map_err(ClientError::Io)?;
        }
        for (id, payload) in std::mem::take(&mut queue.todo) {
            writeln!(out, "did {id} {payload}").map_err(ClientError::Io)?;
            out.flush().map_err(ClientError::Io)?;
            client.multicast_with(Service::Agreed, &[group], id.as_bytes(), done)?;
        }
        if let Err(mpsc::TryRecvError::Disconnected) = input.try_recv() {
            return client.disconnect();
        }
    }
}
