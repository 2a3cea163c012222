//! Settings of the QSM region engine. [A] = Ostrowski, Birman, Phanishayee,
//! "QuickSilver Scalable Multicast"; [B] = Ostrowski, Birman, Dolev,
//! "Quicksilver Scalable Multicast". Where neither paper gives a value the
//! field says so and why Shoal picked its default.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of one QSM member. Build with [`Config::default`] and adjust;
/// [`Config::validate`] runs once when an engine is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Replication coefficient r: members per partition, each message cached
    /// by the r members of one partition. [A] §2.2: "typically 5"; [B] §6.2:
    /// "five nodes in each region cache each packet". Lower r makes recovery
    /// fall back on the sender more often; higher r buffers more per member
    /// ([B] Figs 25-26: memory grows linearly with it).
    pub replication: NonZeroU32,
    /// Interval between tokens the region leader issues. [B] §4, §6.1:
    /// tokens "circulate once a second"; above 1.25/s nothing is gained
    /// ([B] Fig 21). A member's delay to cleanup is about half of it plus the
    /// token's round trip.
    #[serde(with = "crate::serde_ms")]
    pub token_interval: Duration,
    /// Copies of the token each hop sends (the receiver ignores all but
    /// the first). A round is lost when any of its m + k + 1 hops is, and a
    /// lost round delays ACKs and garbage collection by a token interval;
    /// the papers do not say how QSM protects the token. 2 copies make a
    /// hop lost only when both are (at 1% loss, a 100-member round is lost
    /// 1% of the time instead of 70%), for one more small packet per member
    /// per round.
    pub token_copies: NonZeroU32,
    /// Ranges one ACK/NAK/pull list carries at most; recovery past the bound
    /// waits for a later token. [A] §2.2 bounds the lists (unbounded ones
    /// reached "tens of kilobytes" under massive loss) without giving the
    /// bound; 32 ranges keep a token record under 600 bytes.
    pub intervals_max: usize,
    /// How long a member waits after learning that a message exists before
    /// it declares it lost and asks for it. [A] §2.2: longer than GC and
    /// preemption pauses, "hundreds of milliseconds"; no value given.
    #[serde(with = "crate::serde_ms")]
    pub loss_suspicion: Duration,
    /// Messages a sender may have pending (multicast, not yet ACKed by the
    /// region). [A] §4: 100,000.
    pub send_window: NonZeroU32,
    /// After the window filled, the sender takes new messages again only
    /// once pending messages fall to this many. [A] §4 mentions a low
    /// watermark without its value; 3/4 of the window.
    pub send_window_low: u32,
    /// Messages the application may hand over that are not yet sent: pull
    /// sending takes data when the socket can send, so only "a little
    /// buffering remains" ([A] §3, no number). 64.
    pub send_buffer: NonZeroU32,
    /// New messages a sender multicasts per second at most; `None`: as fast
    /// as the driver pulls. [A] §3 and [B] §1 use an adaptive rate
    /// controller they do not describe; this is a fixed cap.
    pub send_rate_max: Option<NonZeroU32>,
    /// Repairs per second a member asks for in all its pulls together, and
    /// (times `token_interval`) the most it asks for per token visit; the
    /// members it asks pace their answers to share this rate. Recovery is
    /// rate-controlled ([B] §6.6, §7 4a) with no rate given: recovery
    /// traffic arriving on top of a full data stream overflows the
    /// receiver's link ([B] §6.3: "recovery traffic interferes with regular
    /// multicast"). 2,000/s fits beside [A]'s 8,000/s of data on 100 Mbit/s.
    pub recovery_rate: NonZeroU32,
    /// Ranges one pull request carries at most (a pull is a unicast, not
    /// part of the token, so it may list more than `intervals_max`; holes
    /// left by lost repairs are many and short). Not in the papers.
    pub pull_ranges_max: usize,
    /// Repairs (pushes, answers to pulls, sender retransmissions) a member
    /// sends per second at most: recovery is rate-controlled ([B] §6.6,
    /// §7 4a) with no rate given. 4,000/s is half of one sender's data rate
    /// in [A] (8,000/s).
    pub repair_rate: NonZeroU32,
    /// Repairs that may go back to back after an idle period (bucket size).
    pub repair_burst: NonZeroU32,
    /// Repairs waiting to be sent, at most; more are dropped and asked for
    /// again at a later token (not in the papers).
    pub repair_queue_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            replication: NonZeroU32::new(5).expect("non-zero"),
            token_interval: Duration::from_secs(1),
            token_copies: NonZeroU32::new(2).expect("non-zero"),
            intervals_max: 32,
            loss_suspicion: Duration::from_millis(300),
            send_window: NonZeroU32::new(100_000).expect("non-zero"),
            send_window_low: 75_000,
            send_buffer: NonZeroU32::new(64).expect("non-zero"),
            send_rate_max: None,
            recovery_rate: NonZeroU32::new(2_000).expect("non-zero"),
            pull_ranges_max: 512,
            repair_rate: NonZeroU32::new(4_000).expect("non-zero"),
            repair_burst: NonZeroU32::new(400).expect("non-zero"),
            repair_queue_max: 20_000,
        }
    }
}

/// A setting out of its range; nothing was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("token_interval must be positive")]
    ZeroTokenInterval,
    #[error("intervals_max and pull_ranges_max must be at least 1")]
    NoIntervals,
    #[error("send_window_low {low} must be below send_window {window}")]
    LowWatermark { low: u32, window: u32 },
}

impl Config {
    /// Checks the settings' ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.token_interval.is_zero() {
            return Err(ConfigError::ZeroTokenInterval);
        }
        if self.intervals_max == 0 || self.pull_ranges_max == 0 {
            return Err(ConfigError::NoIntervals);
        }
        if self.send_window_low >= self.send_window.get() {
            return Err(ConfigError::LowWatermark {
                low: self.send_window_low,
                window: self.send_window.get(),
            });
        }
        Ok(())
    }
}
