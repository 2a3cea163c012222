//! Settings of the traditional stack. P000 §2.1 gives none of them (its
//! Horus-class stack had "a fixed sender buffer", size not given); the
//! defaults are ours and each says why.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// W: a sender's messages not yet held by every view member, at most.
    /// P000 §2.1 gives no size ("a fixed amount of buffering space at the
    /// sender"; notes §2 E0-1: "size not given"), so the default, 64, is
    /// ours, sized from Fig 1's own numbers: at its 200 msg/s, 64 messages
    /// are 320 ms of traffic, enough for one 100 ms sleep (20 messages) plus
    /// one `retransmit_timeout` (20 more), so the unperturbed group at p = 0
    /// is not window-bound, while runs of sleeps fill it. Fig 1's collapse
    /// comes from the bound being fixed, whatever its value.
    pub window: NonZeroU32,
    /// A receiver reports a source's progress after this many new messages…
    pub ack_every: NonZeroU32,
    /// …or this long after the first unreported one. Default 10 ms.
    #[serde(with = "crate::serde_ms")]
    pub ack_delay: Duration,
    /// Every member reports all streams at least this often; it is also the
    /// failure detector's heartbeat. Default 100 ms.
    #[serde(with = "crate::serde_ms")]
    pub heartbeat_interval: Duration,
    /// A lagging peer gets retransmissions after this long without
    /// progress. Default 100 ms.
    #[serde(with = "crate::serde_ms")]
    pub retransmit_timeout: Duration,
    /// Retransmissions per peer and stream per timeout, at most.
    pub retransmit_burst: NonZeroU32,
    /// A member silent this long is suspected and flushed out. Default 1 s
    /// (longer than P000 Fig 1's 100 ms sleeps, so a perturbed member slows
    /// the group rather than leaving it).
    #[serde(with = "crate::serde_ms")]
    pub fail_timeout: Duration,
    pub ip_multicast: bool,
    pub max_datagram_size: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: NonZeroU32::new(64).expect("non-zero"),
            ack_every: NonZeroU32::new(8).expect("non-zero"),
            ack_delay: Duration::from_millis(10),
            heartbeat_interval: Duration::from_millis(100),
            retransmit_timeout: Duration::from_millis(100),
            retransmit_burst: NonZeroU32::new(64).expect("non-zero"),
            fail_timeout: Duration::from_secs(1),
            ip_multicast: true,
            max_datagram_size: 1472,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("member {0} is not in its own member list")]
    NotAMember(u32),
    #[error("{0} must be positive")]
    ZeroDuration(&'static str),
    #[error("fail_timeout must exceed heartbeat_interval")]
    FailTimeoutTooShort,
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, d) in [
            ("ack_delay", self.ack_delay),
            ("heartbeat_interval", self.heartbeat_interval),
            ("retransmit_timeout", self.retransmit_timeout),
            ("fail_timeout", self.fail_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        if self.fail_timeout <= self.heartbeat_interval {
            return Err(ConfigError::FailTimeoutTooShort);
        }
        Ok(())
    }
}
