//! Settings of the pbcast engine, each with the papers' default where a paper
//! gives one (P001 = Ozkasap/Xiao/Birman, P000 = Gupta/Birman/van Renesse).

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a member reacts to a digest (P000 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GossipMode {
    /// Solicit what the gossiper holds and I lack (P001 §B describes pull only).
    Pull,
    /// Send the gossiper young messages it lacks.
    Push,
    /// Both: push young messages, pull the rest (P000 §3, the default).
    PushPull,
}

/// Order in which messages reach the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Per sender, in sequence order; a message after a gap waits for the
    /// repair or for the gap to be declared lost (P000 §3, P001 §C).
    Fifo,
    /// As messages arrive ("pbcast without fifo", P001 Figs 3, 7).
    Unordered,
}

/// When retransmissions go by IP multicast instead of unicast (P001 §B, §C:
/// the pbcast variants). Needs `ip_multicast`; ignored without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MulticastRepair {
    /// Plain pbcast: every retransmission is unicast.
    Off,
    /// pbcast-IPMC: a member that receives `multicast_repair_threshold`
    /// solicitations for the same message within a window multicasts it
    /// (Spinglass: "seeing multiple retransmission requests").
    Ipmc,
    /// pbcast-grb ("gossip about repair bits"): as `Ipmc`, and members gossip
    /// which messages were recently retransmitted by unicast; a member that
    /// learned someone else already unicast a repair of a message multicasts
    /// its own retransmission of it.
    Grb,
}

/// Settings of one pbcast member. Build with [`Config::default`] and adjust;
/// [`Config::validate`] runs once when an engine is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Length of a gossip round. P001 §B: 100 ms. Rounds are not synchronised:
    /// each member starts its first round at a random offset.
    #[serde(with = "crate::serde_ms")]
    pub gossip_interval: Duration,
    /// Members gossiped to per round. P000/P001: 1.
    pub gossip_fanout: NonZeroU32,
    /// A message is kept for this many rounds after it arrived, then collected.
    /// P001 §C: about 10 rounds = 1 s in Spinglass.
    pub gc_rounds: NonZeroU32,
    /// Pull, push or both.
    pub mode: GossipMode,
    /// A message is "young" (pushed to a gossiper that lacks it) while it has
    /// been held for less than this; older messages are only pulled. P000 §3
    /// names the rule but not the threshold. Default 1 s, the GC period:
    /// measured in the simulator (star, 50 members, 5% loss per link), a
    /// message lost on the sender's own link reaches only the sender, and
    /// with 200 or 500 ms about one member in 50,000 deliveries ran out of
    /// repair attempts; with 1 s none did in 60 seeds.
    #[serde(with = "crate::serde_ms")]
    pub push_age_max: Duration,
    /// The longest a member waits for a push its digest invited before its
    /// next digest invites it again (the gap is listed as awaited, and
    /// partners do not push it, meanwhile). The wait is the push round
    /// trip's timeout (srtt + 4 × rttvar over the times from a digest to
    /// the push it drew), capped here; zero turns the wait off (every
    /// digest invites every gap, as before 2026-11-25). Not in the papers:
    /// it bounds the pushes that a queue holding repairs for several rounds
    /// would otherwise multiply (P001 Fig 8, `docs/pbcast.md`). Default
    /// 200 ms, two rounds: a gap is offered to pushers at least every other
    /// round. Its cost is tail latency where a push invited is not coming
    /// (the partner lacks the message too): measured in P001 Fig 2, p99
    /// 699 → 858 ms (with 500 ms: 931 ms).
    #[serde(with = "crate::serde_ms")]
    pub push_hold_max: Duration,
    /// Retransmissions (solicited or pushed) one member sends per round, at
    /// most. Bounds recovery traffic. Not given in P000/P001 (it is in the TOCS
    /// paper, not in the input); default 500.
    pub retransmits_per_round_max: u32,
    /// Ranges of one source described in a digest, at most (keeps a digest in
    /// one datagram). Default 64.
    pub digest_ranges_max: u16,
    /// A missing message is asked for again no sooner than this after the last
    /// solicitation of it, when another digest offers it. Short, so that
    /// nearly every digest received is a repair attempt (a lost solicitation
    /// or retransmission otherwise costs a whole round of the ~10 a message is
    /// buffered); long enough to cover a LAN round trip. Default 20 ms.
    ///
    /// With `solicit_retry_max` above it, this is the floor: the retry
    /// stretches to the measured repair round trip (RFC 6298's srtt + 4 ×
    /// rttvar over the time from a solicitation to its repair), up to
    /// `solicit_retry_max`.
    #[serde(with = "crate::serde_ms")]
    pub solicit_retry: Duration,
    /// The longest the measured round trip may stretch `solicit_retry`.
    /// Default 20 ms, equal to `solicit_retry`: the retry is fixed. Where a
    /// repair takes longer than 20 ms to come back (a WAN), an ask repeated
    /// before its answer can arrive only buys a duplicate; 200 ms (two
    /// rounds) lets the retry follow the path. Not the default: in the
    /// simulator it cut P001 Fig 8's duplicates and kept pbcast-grb from
    /// collapsing at 100 members, but lost messages in the 5%-per-link
    /// star that the fixed retry delivers (`docs/pbcast.md`).
    #[serde(with = "crate::serde_ms")]
    pub solicit_retry_max: Duration,
    /// A gap is declared lost (an explicit `Lost` event) once it has been known
    /// for at least `lost_after_rounds` rounds and at least this many digests
    /// received since it opened showed the gossiper no longer holds it.
    pub lost_evidence_min: u32,
    /// See `lost_evidence_min`. Default 2 × `gc_rounds`: by then every copy
    /// made in the first phase has been collected.
    pub lost_after_rounds: NonZeroU32,
    /// FIFO per sender or unordered.
    pub delivery: Delivery,
    /// The transport offers IP multicast: the first phase uses it. Otherwise
    /// the first phase is a unicast fan-out to every member.
    pub ip_multicast: bool,
    /// Without IP multicast, the first phase goes down a unicast tree rooted
    /// at the source, each member passing a new message on to this many
    /// children (P000 §3 footnote ‖: pbcast "more often" runs over "a very
    /// lightweight unicast-based tree management and multicasting
    /// mechanism"). The tree is the member list rotated to start at the
    /// source, in heap order, so every member computes it alone; a group of
    /// at most `relay_fanout + 1` members is a flat fan-out. 0 is always the
    /// flat fan-out: the source sends every member a copy, O(n) datagrams per
    /// message, which caps throughput by the source's CPU and link as n grows
    /// (P000 Fig 10 in `docs/reproduction.md`). A member that misses a
    /// relayed message, or whose parent is asleep, recovers it by gossip or
    /// vsync repair like any other loss. Ignored with `ip_multicast`.
    /// Default 16 (Shoal's choice; the papers give no number).
    pub relay_fanout: u32,
    /// Plain pbcast, pbcast-IPMC or pbcast-grb.
    pub multicast_repair: MulticastRepair,
    /// Solicitations of one message within `multicast_repair_window_rounds`
    /// that turn its retransmission into a multicast. Not given in P001;
    /// default 2.
    pub multicast_repair_threshold: NonZeroU32,
    /// The window over which solicitations are counted, in rounds; a message
    /// multicast once is not multicast again within it. With one gossip
    /// target per round a holder hears at most about one solicitation per
    /// message per round, so a one-round window would almost never reach a
    /// threshold of 2. Default 5 rounds.
    pub multicast_repair_window_rounds: NonZeroU32,
    /// How long a member remembers that a message was retransmitted (grb's
    /// repair bits), in rounds. Not given in P001; default 5.
    pub repair_memory_rounds: NonZeroU32,
    /// Largest datagram to build; small messages are packed up to it.
    /// 1472 fits a 1500-byte Ethernet MTU; loopback allows 65,507.
    pub max_datagram_size: usize,
    /// Flow control (not in the papers; needed so a sender cannot outrun its
    /// receivers): a sender keeps at most this many of its messages beyond
    /// the lowest point every recently heard member reported. `None` turns
    /// flow control off (the papers' simulations send at a fixed rate).
    pub send_window: Option<NonZeroU32>,
    /// A receiver reports its progress to a source after this many new
    /// messages from it, or after `status_interval`, whichever comes first.
    pub status_every: NonZeroU32,
    /// See `status_every`.
    #[serde(with = "crate::serde_ms")]
    pub status_interval: Duration,
    /// Members silent (no status) for this long no longer hold the sender's
    /// window: a perturbed member must not stall the group (P000 §2.2).
    #[serde(with = "crate::serde_ms")]
    pub flow_silence_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gossip_interval: Duration::from_millis(100),
            gossip_fanout: NonZeroU32::MIN,
            gc_rounds: NonZeroU32::new(10).unwrap(),
            mode: GossipMode::PushPull,
            push_age_max: Duration::from_millis(1000),
            push_hold_max: Duration::from_millis(200),
            retransmits_per_round_max: 500,
            digest_ranges_max: 64,
            solicit_retry: Duration::from_millis(20),
            solicit_retry_max: Duration::from_millis(20),
            lost_evidence_min: 3,
            lost_after_rounds: NonZeroU32::new(20).unwrap(),
            delivery: Delivery::Fifo,
            ip_multicast: false,
            relay_fanout: 16,
            multicast_repair: MulticastRepair::Off,
            multicast_repair_threshold: NonZeroU32::new(2).unwrap(),
            multicast_repair_window_rounds: NonZeroU32::new(5).unwrap(),
            repair_memory_rounds: NonZeroU32::new(5).unwrap(),
            max_datagram_size: 1472,
            send_window: NonZeroU32::new(4096),
            status_every: NonZeroU32::new(512).unwrap(),
            status_interval: Duration::from_millis(10),
            flow_silence_timeout: Duration::from_secs(1),
        }
    }
}

/// A setting out of its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("gossip_interval must be at least 1 ms, got {0:?}")]
    GossipIntervalTooShort(Duration),
    #[error("max_datagram_size must be between {min} and 65507, got {got}")]
    DatagramSize { min: usize, got: usize },
    #[error("status_interval must be positive")]
    StatusIntervalZero,
    #[error("digest_ranges_max must be at least 1")]
    DigestRangesZero,
    #[error("solicit_retry_max ({max:?}) must be at least solicit_retry ({min:?})")]
    SolicitRetryRange { min: Duration, max: Duration },
    #[error("the member list must contain this member ({0})")]
    NotAMember(u32),
    #[error("gossip weight for {0} must be finite and non-negative")]
    BadWeight(u32),
    #[error("gossip tree: {0}")]
    BadTree(String),
}

/// Smallest datagram that still holds a header, a data packet's sequence
/// number and a useful payload.
pub const MIN_DATAGRAM_SIZE: usize = 128;

impl Config {
    /// Checks every setting once, at engine creation.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gossip_interval < Duration::from_millis(1) {
            return Err(ConfigError::GossipIntervalTooShort(self.gossip_interval));
        }
        if !(MIN_DATAGRAM_SIZE..=65_507).contains(&self.max_datagram_size) {
            return Err(ConfigError::DatagramSize {
                min: MIN_DATAGRAM_SIZE,
                got: self.max_datagram_size,
            });
        }
        if self.status_interval.is_zero() {
            return Err(ConfigError::StatusIntervalZero);
        }
        if self.digest_ranges_max == 0 {
            return Err(ConfigError::DigestRangesZero);
        }
        if self.solicit_retry_max < self.solicit_retry {
            return Err(ConfigError::SolicitRetryRange {
                min: self.solicit_retry,
                max: self.solicit_retry_max,
            });
        }
        Ok(())
    }

    /// How long a message stays buffered after it arrived.
    pub fn gc_period(&self) -> Duration {
        self.gossip_interval * self.gc_rounds.get()
    }

    /// Largest payload one message may carry (one retransmit packet per datagram).
    pub fn max_payload(&self) -> usize {
        self.max_datagram_size - shoal_wire::HEADER_LEN - 12
    }
}
