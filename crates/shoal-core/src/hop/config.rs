//! Settings of one Hop link end. P-Spread §3.2 names every one of these and
//! gives no value for any; each default below says why it was chosen and
//! what it costs (`docs/spread.md` has the measurements behind them).

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of one end of a Hop link. Build with [`Config::default`] and
/// adjust; [`Config::validate`] runs once when a link is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Leaky bucket: average sending rate of data (new and retransmitted
    /// packets), in bits per second of Hop datagram bytes. §3.2: "a leaky
    /// bucket (max burst + average rate)", settable per link and able to
    /// use a bandwidth reservation. Default 10 Mbit/s, a link budget, not a
    /// measurement: set it to the capacity the link may use (the paper's
    /// experiments had 1-2 Mbit/s links; the simulations set it so).
    pub rate_bps: u64,
    /// Leaky bucket: bytes that may leave at once after an idle period.
    /// Default 16 KiB (about ten full datagrams): an echo or a short burst
    /// of messages leaves without waiting for the bucket, so flow control
    /// adds no latency at low load (Fig 11). At least `max_datagram_size`.
    pub burst_bytes: u32,
    /// Packets sent and not yet acknowledged cumulatively, at most; new
    /// data waits beyond it, retransmissions do not (§3.2: the window makes
    /// the reliability protocol terminate; retransmits bypass it so a
    /// packet's crossing time is bounded). Default 1024: at 20% loss the
    /// cumulative ACK stalls for a few round trips behind each loss, and
    /// the window must cover rate × that stall or the link idles (Table 3
    /// measures it). Memory: that many datagrams buffered at the sender.
    pub window_packets: NonZeroU32,
    /// How long a gap waits before its first NACK: §3.2 "a short delay",
    /// "fixed", chosen to avoid false losses of about 1% (reordering)
    /// while recovery finishes before the window fills. Default 10 ms:
    /// longer than the reordering of a path's load-balanced routes (a few
    /// ms) and small against a WAN round trip.
    #[serde(with = "crate::serde_ms")]
    pub nack_delay: Duration,
    /// How long a NACKed packet waits before it is NACKed again (§3.2:
    /// repeated "until they are recovered"). It must exceed the link's
    /// round trip or every NACK draws a duplicate retransmission. Default
    /// 250 ms: above the paper's longest link (104 ms round trip) with room
    /// for queueing.
    #[serde(with = "crate::serde_ms")]
    pub nack_repeat: Duration,
    /// The sender's ACK timer (Fig. 3): while packets are unacknowledged
    /// and no data has left for this long, the sender sends its highest
    /// sequence number so the receiver learns of a lost tail. Default
    /// 30 ms: a lost last packet is found within 30 ms plus half a round
    /// trip, at a cost of one 13-byte item per 30 ms while data is in
    /// flight.
    #[serde(with = "crate::serde_ms")]
    pub ack_timer: Duration,
    /// When nothing more waits to be sent, the first sender ACK goes out
    /// this soon after the last data packet (a tail probe); later ones
    /// every `ack_timer`. A
    /// lost last packet (a lone echo, the end of a burst) is then found
    /// half a round trip after it was sent, not `ack_timer` later: on a
    /// 104 ms link at 2% loss this took Hop's echo overhead over ping from
    /// 6.4% to the figure in `docs/spread.md`. Cost: one 13-byte item per
    /// burst. Default 2 ms. Ours: the paper's ACK timer is "based on time
    /// and number of packets sent and received" with no rule given.
    #[serde(with = "crate::serde_ms")]
    pub tail_probe: Duration,
    /// The receiver's cumulative ACK goes out after this many data packets
    /// (§3.2 `MaxPacketsBetweenAck`) or after `ack_period`, whichever is
    /// sooner. Default 16: under 1% of the reverse bandwidth, and the
    /// sender's buffer is freed 16 packets behind.
    pub max_packets_between_ack: NonZeroU32,
    /// The receiver's periodic cumulative ACK while data arrives. Default
    /// 20 ms.
    #[serde(with = "crate::serde_ms")]
    pub ack_period: Duration,
    /// NACKs for one packet beyond which the link is declared failed to
    /// membership (Fig. 2 `MaxNACKS`). Default 50: at 20% loss each way a
    /// retransmission round succeeds with probability 0.64, so 50 rounds
    /// fail with probability 0.36^50 ≈ 1e-22; with `nack_repeat` that is
    /// 12.5 s of a link that carries nothing.
    pub max_nacks: NonZeroU32,
    /// Largest datagram this link sends, Hop preamble and items included
    /// (1472: a 1500-byte Ethernet MTU less IP and UDP headers).
    pub max_datagram_size: usize,
    /// Messages accepted and not yet sent once, at most; [`super::Hop::send`]
    /// refuses more (the layer above holds them: Spread's global window).
    pub send_queue_max: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            rate_bps: 10_000_000,
            burst_bytes: 16 * 1024,
            window_packets: NonZeroU32::new(1024).expect("non-zero"),
            nack_delay: Duration::from_millis(10),
            nack_repeat: Duration::from_millis(250),
            ack_timer: Duration::from_millis(30),
            tail_probe: Duration::from_millis(2),
            max_packets_between_ack: NonZeroU32::new(16).expect("non-zero"),
            ack_period: Duration::from_millis(20),
            max_nacks: NonZeroU32::new(50).expect("non-zero"),
            max_datagram_size: 1472,
            send_queue_max: 4096,
        }
    }
}

/// Why a configuration was refused. No link was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("rate_bps must be positive")]
    ZeroRate,
    #[error("burst_bytes {burst} is below max_datagram_size {datagram}: a full datagram could never leave")]
    BurstBelowDatagram { burst: u32, datagram: usize },
    #[error("max_datagram_size {0} leaves no room for data (at least 64)")]
    DatagramTooSmall(usize),
    #[error("{0} must be positive")]
    ZeroDuration(&'static str),
}

impl Config {
    /// Checks the settings once, when a link is created.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.rate_bps == 0 {
            return Err(ConfigError::ZeroRate);
        }
        if !(64..=65_507).contains(&self.max_datagram_size) {
            return Err(ConfigError::DatagramTooSmall(self.max_datagram_size));
        }
        if (self.burst_bytes as usize) < self.max_datagram_size {
            return Err(ConfigError::BurstBelowDatagram {
                burst: self.burst_bytes,
                datagram: self.max_datagram_size,
            });
        }
        for (name, d) in [
            ("nack_repeat", self.nack_repeat),
            ("ack_timer", self.ack_timer),
            ("ack_period", self.ack_period),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        Ok(())
    }

    /// The largest message payload one datagram carries.
    pub fn max_payload(&self) -> usize {
        self.max_datagram_size - shoal_wire::hop::PREAMBLE_LEN - shoal_wire::hop::DATA_OVERHEAD
    }
}
