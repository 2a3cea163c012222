//! The records a history is made of: what one client did and saw, in the
//! order it saw it, one JSON object per line.

use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A message's identity: the sending client's private-group name (as the
/// daemon reports it in `Message.sender` and in membership lists, e.g.
/// `"#c3#d1"`) and a per-sender sequence number from 1, increasing in send
/// order. Workloads put both in the payload.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MsgId {
    /// The sender's private-group name.
    pub sender: String,
    /// From 1, strictly increasing in the sender's send order (gaps allowed).
    pub seq: u64,
}

impl std::fmt::Display for MsgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.sender, self.seq)
    }
}

/// A message's service type, weakest first (the order of
/// `shoal_wire::client::Service`); `>=` compares strength.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Service {
    /// No guarantee.
    Unreliable,
    /// pbcast's bimodal guarantee: no membership agreement.
    Probabilistic,
    /// Delivered to every member that stays (virtual synchrony), any order.
    Reliable,
    /// Reliable, and in send order per sender.
    Fifo,
    /// FIFO, and in causal order.
    Causal,
    /// Causal, and in one total order at every receiver.
    Agreed,
    /// Agreed, and delivered in a regular view only once every member holds it.
    Safe,
}

impl Service {
    /// Every service, weakest first.
    pub const ALL: [Service; 7] = [
        Service::Unreliable,
        Service::Probabilistic,
        Service::Reliable,
        Service::Fifo,
        Service::Causal,
        Service::Agreed,
        Service::Safe,
    ];

    /// The name used in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Service::Unreliable => "unreliable",
            Service::Probabilistic => "probabilistic",
            Service::Reliable => "reliable",
            Service::Fifo => "fifo",
            Service::Causal => "causal",
            Service::Agreed => "agreed",
            Service::Safe => "safe",
        }
    }
}

/// One thing one client did or saw. A history is every client's records;
/// within one client they are in the order that client did or saw them, and
/// nothing relates the records of two clients in time.
///
/// JSON: `{"type":"send","client":"#a#d1","msg":{"sender":"#a#d1","seq":1},
/// "service":"agreed","groups":["g"]}`; `at_ns` (a human hint, never used for
/// judging), `transitional` (default false) and `quorum` may be left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The client handed this multicast to its daemon.
    Send {
        /// The sender's private-group name (equal to `msg.sender`).
        client: String,
        /// The message.
        msg: MsgId,
        /// Its service.
        service: Service,
        /// Its destination groups (a set: order and repeats do not matter).
        groups: Vec<String>,
        /// When, in the recorder's clock (a hint for humans only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// Delivered to `client`.
    Deliver {
        /// The receiver's private-group name.
        client: String,
        /// The message.
        msg: MsgId,
        /// Its service as delivered.
        service: Service,
        /// Its groups as delivered.
        groups: Vec<String>,
        /// Delivered in a transitional configuration (EVS).
        #[serde(default)]
        transitional: bool,
        /// A hint for humans only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// A membership of `group` installed at `client`.
    View {
        /// The client's private-group name.
        client: String,
        /// The group.
        group: String,
        /// The view id every member of this view shares.
        view_id: u64,
        /// The members' private-group names (a set).
        members: Vec<String>,
        /// An EVS transitional view.
        #[serde(default)]
        transitional: bool,
        /// The quorum flag, when the daemon reports one (not judged).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quorum: Option<bool>,
        /// A hint for humans only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// The daemon told the client that its messages `first..=last` were not
    /// delivered.
    NotDelivered {
        /// The sender told.
        client: String,
        /// First sequence number not delivered.
        first: u64,
        /// Last sequence number not delivered.
        last: u64,
        /// A hint for humans only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// The client's session ended (disconnect, an error close, a broken
    /// connection, or its daemon crashed). Nothing more is expected of or at
    /// this client.
    Ended {
        /// The client.
        client: String,
        /// Why, in words.
        reason: String,
        /// A hint for humans only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
}

impl Record {
    /// The client whose stream this record belongs to.
    pub fn client(&self) -> &str {
        match self {
            Record::Send { client, .. }
            | Record::Deliver { client, .. }
            | Record::View { client, .. }
            | Record::NotDelivered { client, .. }
            | Record::Ended { client, .. } => client,
        }
    }

    /// The human time hint, if recorded.
    pub fn at_ns(&self) -> Option<u64> {
        match self {
            Record::Send { at_ns, .. }
            | Record::Deliver { at_ns, .. }
            | Record::View { at_ns, .. }
            | Record::NotDelivered { at_ns, .. }
            | Record::Ended { at_ns, .. } => *at_ns,
        }
    }

    /// A `Send` with no time hint.
    pub fn send(client: &str, seq: u64, service: Service, groups: &[&str]) -> Record {
        Record::Send {
            client: client.to_string(),
            msg: MsgId {
                sender: client.to_string(),
                seq,
            },
            service,
            groups: strings(groups),
            at_ns: None,
        }
    }

    /// A regular-configuration `Deliver` with no time hint.
    pub fn deliver(
        client: &str,
        sender: &str,
        seq: u64,
        service: Service,
        groups: &[&str],
    ) -> Record {
        Record::Deliver {
            client: client.to_string(),
            msg: MsgId {
                sender: sender.to_string(),
                seq,
            },
            service,
            groups: strings(groups),
            transitional: false,
            at_ns: None,
        }
    }

    /// A regular `View` with no quorum flag or time hint.
    pub fn view(client: &str, group: &str, view_id: u64, members: &[&str]) -> Record {
        Record::View {
            client: client.to_string(),
            group: group.to_string(),
            view_id,
            members: strings(members),
            transitional: false,
            quorum: None,
            at_ns: None,
        }
    }

    /// A view as a daemon announced it: transitional or regular, with its
    /// quorum flag.
    pub fn view_as_announced(
        client: &str,
        group: &str,
        view_id: u64,
        members: &[&str],
        transitional: bool,
        quorum: bool,
    ) -> Record {
        Record::View {
            client: client.to_string(),
            group: group.to_string(),
            view_id,
            members: strings(members),
            transitional,
            quorum: Some(quorum),
            at_ns: None,
        }
    }

    /// An `Ended` with no time hint.
    pub fn ended(client: &str, reason: &str) -> Record {
        Record::Ended {
            client: client.to_string(),
            reason: reason.to_string(),
            at_ns: None,
        }
    }

    /// A `NotDelivered` with no time hint.
    pub fn not_delivered(client: &str, first: u64, last: u64) -> Record {
        Record::NotDelivered {
            client: client.to_string(),
            first,
            last,
            at_ns: None,
        }
    }

    /// This record marked transitional (a `Deliver` or a `View`); others are
    /// returned unchanged.
    pub fn transitional(mut self) -> Record {
        match &mut self {
            Record::Deliver { transitional, .. } | Record::View { transitional, .. } => {
                *transitional = true
            }
            _ => {}
        }
        self
    }

    /// One JSON line (no newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a Record always serialises")
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Why a JSON-lines history could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// Reading failed (nothing after the failing line was read).
    Io(std::io::Error),
    /// A line is not a record; `line` counts from 1.
    Json {
        /// The line's number, from 1.
        line: usize,
        /// What serde_json said.
        error: serde_json::Error,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "read: {e}"),
            ReadError::Json { line, error } => write!(f, "line {line}: {error}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads a JSON-lines history: one [`Record`] per line, blank lines skipped.
pub fn read_jsonl(reader: impl BufRead) -> Result<Vec<Record>, ReadError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(ReadError::Io)?;
        if line.trim().is_empty() {
            continue;
        }
        let rec =
            serde_json::from_str(&line).map_err(|error| ReadError::Json { line: i + 1, error })?;
        out.push(rec);
    }
    Ok(out)
}

/// Reads a JSON-lines history from a file (see [`read_jsonl`]).
pub fn read_jsonl_file(path: impl AsRef<Path>) -> Result<Vec<Record>, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    read_jsonl(std::io::BufReader::new(file))
}
