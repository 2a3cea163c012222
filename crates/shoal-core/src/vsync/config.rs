//! Settings of the vsync-over-pbcast engine (P000 §5.2, §6), each with the
//! paper's value where it gives one.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pbcast;

/// Settings of one vsync member. [`Config::validate`] runs once, at creation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The dissemination layer underneath (P000 Fig 5). The default turns
    /// pbcast's FIFO ordering and flow control off: vsync orders by global
    /// sequence number and bounds the sender with `gseq_window`.
    pub pbcast: pbcast::Config,
    /// k, members of the leader committee (P000 §5.2). §6 uses 1; Table 2
    /// measures 1 to 4. Tolerates k-1 committee crashes.
    pub committee_size: NonZeroU32,
    /// Period of view changes (P000 §5.2, §6: 20 s). Joins and leaves start
    /// one sooner (`change_delay`).
    #[serde(with = "crate::serde_ms")]
    pub view_period: Duration,
    /// How long the committee waits for AckPrefreshview (P000 §6: 1 s).
    #[serde(with = "crate::serde_ms")]
    pub ack_wait: Duration,
    /// Members defer AckPrefreshview by a uniform random delay in
    /// `[0, ack_defer_max]` to avoid ack implosion (P000 §5.2 names the
    /// deferral, not its distribution). Default 250 ms: a quarter of
    /// `ack_wait`, leaving room for one retry.
    #[serde(with = "crate::serde_ms")]
    pub ack_defer_max: Duration,
    /// A member sends its AckPrefreshview again after this long while the
    /// Newview has not arrived, `ack_retries` times (Shoal's addition: one
    /// lost unicast ack should not evict a healthy member). Default 400 ms.
    #[serde(with = "crate::serde_ms")]
    pub ack_retry_after: Duration,
    /// See `ack_retry_after`. Default 1; 0 is the paper's single ack.
    pub ack_retries: u32,
    /// A join or leave request starts a view change this soon, batching
    /// requests that arrive together (P000 §5.2: "on demand"). Default 100 ms.
    #[serde(with = "crate::serde_ms")]
    pub change_delay: Duration,
    /// Messages a sender may have waiting for Gseq acks (P000 §6.5: a
    /// constant-size buffer whose size is not given). Default 64.
    pub gseq_window: NonZeroU32,
    /// A Gseq Req without an ack is sent again after this; every second retry
    /// goes to the next committee member. Default 200 ms.
    #[serde(with = "crate::serde_ms")]
    pub gseq_retry: Duration,
    /// Repair timeout bounds (P000 §5.2: "from a minimum of 10 ms, when a
    /// high rate of multicasts is being received, to a maximum of 1 s").
    #[serde(with = "crate::serde_ms")]
    pub repair_timeout_min: Duration,
    /// See `repair_timeout_min`.
    #[serde(with = "crate::serde_ms")]
    pub repair_timeout_max: Duration,
    /// The repair timeout is this many mean inter-arrival gaps (an EWMA with
    /// weight 1/8), clamped to the bounds above. Default 4.
    pub repair_gap_factor: NonZeroU32,
    /// With nothing missing, a member asks the committee for news this often,
    /// so a lost tail is found (P000 §6.4: once per second).
    #[serde(with = "crate::serde_ms")]
    pub idle_solicit_interval: Duration,
    /// Entries in one repair answer, at most. Default 256.
    pub repair_batch_max: NonZeroU32,
    /// The primary heartbeats its backups (and resends unacknowledged
    /// replication) this often. Default 50 ms.
    #[serde(with = "crate::serde_ms")]
    pub committee_heartbeat: Duration,
    /// A committee member silent this long is taken as crashed (P000 §6 uses
    /// 1 s for its ack timeout). The i-th backup takes over after i times this.
    #[serde(with = "crate::serde_ms")]
    pub committee_timeout: Duration,
    /// Entries sent to a backup beyond what it acknowledged. Default 1024.
    pub replicate_window: NonZeroU32,
    /// A joiner repeats its join request this often until welcomed. Default 500 ms.
    #[serde(with = "crate::serde_ms")]
    pub join_retry: Duration,
    /// Entries buffered ahead of the next one to deliver, at most (bounds
    /// memory a forged sequence number can claim). Default 65,536.
    pub pending_max: u64,
    /// A member reports how far it delivered to its primary this often while
    /// its delivery advances (`Message::Progress`), and the primary collects
    /// whatever every member of its view has delivered, at once rather than
    /// at the next view change. Shoal's addition: P000 §5.2 collects at the
    /// view checkpoint only, so a committee member holds every record of up
    /// to `view_period` (at 100,000 1 KB messages/s, 2 GB). 0 (the default,
    /// the paper's behaviour, kept by the simulator's figures) turns it off;
    /// the daemon uses 100 ms.
    #[serde(with = "crate::serde_ms")]
    pub progress_interval: Duration,
    /// Committee members deliver records from their own stores as soon as
    /// the records are committed: each backup also sends its ReplicaAck to
    /// the other backups (`PeerAck`), so that it knows, without waiting for
    /// its primary, when every backup holds a record; and a sender whose
    /// whole view is on the committee does not pbcast its message, since
    /// every member already holds it. Shoal's addition (P000 leaves the
    /// intra-committee protocol open): an ordered message then reaches a
    /// committee member 3 hops after it leaves its sender (Gseq Req,
    /// Replicate, PeerAck) instead of 5 (..., ReplicaAck, Gseq Ack, pbcast).
    /// Off by default (the simulator's figures keep the paper's path); the
    /// daemon turns it on.
    pub committee_delivery: bool,
    /// The end of a repair answer (REPAIR_DONE, which tells the member to
    /// ask again at once for what is still missing) goes in a datagram of
    /// its own rather than packed after the last entries. A daemon's
    /// datagrams beyond loopback are 16 KB sent in 1,472-byte fragments,
    /// one lost fragment losing the whole datagram: packed, the signal was
    /// lost with 43% of answers at 5% loss per fragment, and the member
    /// waited out a backed-off repair timeout each time (in the swarm's
    /// harshest shape, 27 of 50 seeds ended with a daemon still repairing;
    /// 1 with this on). Off by default (the simulator's figures keep their
    /// datagrams); the daemon turns it on where its engines' datagrams go
    /// in fragments (beyond loopback by default).
    pub repair_done_apart: bool,
    /// At a view change's deadline, a member of the old view that has not
    /// acknowledged but was heard from during the change (any datagram:
    /// gossip, a progress report) is alive, and its acknowledgements were
    /// lost: the primary asks it once more, directly, and decides one
    /// `ack_wait` later instead of dropping it. A crashed member is not
    /// heard, so its detection time is unchanged. Shoal's addition (P000
    /// §5.2 drops every member that did not acknowledge). Off by default
    /// (the simulator's figures keep the paper's rule); the daemon turns it
    /// on: at 5% loss per fragment, losing an ack and its one retry evicted
    /// a live daemon in about 1 of 400 periodic view changes (swarm seed
    /// 209, harshest shape).
    pub ask_heard_again: bool,
}

impl Default for Config {
    fn default() -> Self {
        let pbcast = pbcast::Config {
            delivery: pbcast::Delivery::Unordered,
            send_window: None,
            ..pbcast::Config::default()
        };
        Config {
            pbcast,
            committee_size: NonZeroU32::MIN,
            view_period: Duration::from_secs(20),
            ack_wait: Duration::from_secs(1),
            ack_defer_max: Duration::from_millis(250),
            ack_retry_after: Duration::from_millis(400),
            ack_retries: 1,
            change_delay: Duration::from_millis(100),
            gseq_window: NonZeroU32::new(64).unwrap(),
            gseq_retry: Duration::from_millis(200),
            repair_timeout_min: Duration::from_millis(10),
            repair_timeout_max: Duration::from_secs(1),
            repair_gap_factor: NonZeroU32::new(4).unwrap(),
            idle_solicit_interval: Duration::from_secs(1),
            repair_batch_max: NonZeroU32::new(256).unwrap(),
            committee_heartbeat: Duration::from_millis(50),
            committee_timeout: Duration::from_secs(1),
            replicate_window: NonZeroU32::new(1024).unwrap(),
            join_retry: Duration::from_millis(500),
            pending_max: 65_536,
            progress_interval: Duration::ZERO,
            committee_delivery: false,
            repair_done_apart: false,
            ask_heard_again: false,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("pbcast: {0}")]
    Pbcast(#[from] pbcast::ConfigError),
    #[error("{0} must be positive")]
    Zero(&'static str),
    #[error("repair_timeout_min must not exceed repair_timeout_max")]
    RepairBounds,
    #[error("ack_defer_max must be below ack_wait")]
    AckDefer,
    #[error("committee_heartbeat must be below committee_timeout")]
    Heartbeat,
    #[error("the member list must contain this member ({0})")]
    NotAMember(u32),
    #[error("the member list must not be empty")]
    NoMembers,
}

impl Config {
    /// Checks every setting once, at engine creation.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.pbcast.validate()?;
        let positive = [
            ("view_period", self.view_period),
            ("ack_wait", self.ack_wait),
            ("gseq_retry", self.gseq_retry),
            ("repair_timeout_min", self.repair_timeout_min),
            ("idle_solicit_interval", self.idle_solicit_interval),
            ("committee_heartbeat", self.committee_heartbeat),
            ("join_retry", self.join_retry),
            ("ack_retry_after", self.ack_retry_after),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(ConfigError::Zero(name));
        }
        if self.pending_max == 0 {
            return Err(ConfigError::Zero("pending_max"));
        }
        if self.repair_timeout_min > self.repair_timeout_max {
            return Err(ConfigError::RepairBounds);
        }
        if self.ack_defer_max >= self.ack_wait {
            return Err(ConfigError::AckDefer);
        }
        if self.committee_heartbeat >= self.committee_timeout {
            return Err(ConfigError::Heartbeat);
        }
        Ok(())
    }

    /// Largest application payload: a Gseq Req must fit one datagram.
    pub fn max_payload(&self) -> usize {
        self.pbcast.max_payload().saturating_sub(48)
    }
}
