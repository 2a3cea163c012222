//! A model of TCP as an overlay link: the baseline P-Spread §3.1 and §4.3
//! compare Hop with (one TCP connection per overlay link, messages
//! forwarded hop by hop). The paper gives no TCP settings; this models the
//! behaviour its argument rests on, as a sans-IO engine with the same
//! [`LinkProtocol`] interface as Hop, so the simulator runs both over the
//! same links:
//!
//! - a byte stream delivered **in order only**: a loss holds back every
//!   later message until it is repaired, then releases them in a burst
//!   ("micro-delays and micro-bursts");
//! - Reno/NewReno congestion control: slow start from `initial_cwnd`
//!   segments, additive increase, fast retransmit after `dupack_threshold`
//!   duplicate ACKs with the window halved, NewReno partial ACKs, and a
//!   retransmission timeout (RFC 6298 estimator, floor `rto_min`,
//!   exponential backoff) after which the window restarts at one segment
//!   and the sender goes back to the first unacknowledged byte (no SACK);
//! - delayed ACKs (every second full segment or `delayed_ack`), an
//!   immediate ACK for out-of-order data, and Nagle's algorithm (a short
//!   segment waits while data is unacknowledged), which together delay a
//!   message just over one segment long by up to a delayed-ACK time;
//! - a receive window of `receive_window_bytes`.
//!
//! Not modelled: SACK, timestamps, window scaling, path MTU discovery,
//! slow-start restart after idle. A segment's encoding is this model's own
//! (tag, seq, ack, length, bytes: 19 bytes standing in for TCP's 20-byte
//! header). In the simulator it never leaves a simulation; between real
//! site daemons (`sites`, a link set to TCP) it travels in UDP datagrams
//! like Hop's, so the decoder drops malformed segments without panicking
//! (the fuzz target `hop_handle_datagram` feeds it).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{Event, LinkProtocol, SendError};
use crate::Instant;

/// Settings of the TCP model. Defaults are Linux's where the paper's era
/// and today's agree, and the paper's era's where they do not (stated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// Maximum segment size: 1448 (1500-byte MTU, IP, TCP, timestamps).
    pub mss: usize,
    /// Initial congestion window in segments: 2 (RFC 2581, the paper's
    /// era; Linux today starts at 10).
    pub initial_cwnd: u32,
    /// Retransmission timeout floor: 200 ms (Linux; RFC 6298 says 1 s).
    #[serde(with = "crate::serde_ms")]
    pub rto_min: Duration,
    /// Timeout before any round trip was measured: 1 s (RFC 6298).
    #[serde(with = "crate::serde_ms")]
    pub rto_initial: Duration,
    /// Timeout ceiling after backoff: 60 s.
    #[serde(with = "crate::serde_ms")]
    pub rto_max: Duration,
    /// Delayed ACK timer: 40 ms (Linux's minimum; Solaris then used 50-100 ms).
    #[serde(with = "crate::serde_ms")]
    pub delayed_ack: Duration,
    /// Nagle's algorithm on (the socket default; the paper does not say
    /// whether Spread set TCP_NODELAY).
    pub nagle: bool,
    /// Receive window: 64 KiB (no window scaling).
    pub receive_window_bytes: u32,
    /// Duplicate ACKs that trigger fast retransmit: 3.
    pub dupack_threshold: u32,
    /// Messages accepted and not yet sent once, at most (the socket buffer).
    pub send_queue_max: usize,
}

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        TcpConfig {
            mss: 1448,
            initial_cwnd: 2,
            rto_min: Duration::from_millis(200),
            rto_initial: Duration::from_secs(1),
            rto_max: Duration::from_secs(60),
            delayed_ack: Duration::from_millis(40),
            nagle: true,
            receive_window_bytes: 65_535,
            dupack_threshold: 3,
            send_queue_max: 4096,
        }
    }
}

const SEGMENT_HEADER: usize = 19;
/// Largest message the model carries (its stream frames lengths as u32;
/// the simulations send far less).
const MAX_MESSAGE: usize = 1 << 20;

/// One end of a TCP connection used as an overlay link.
#[derive(Debug)]
pub struct TcpLink {
    config: TcpConfig,
    now: Instant,
    // Sender.
    /// Bytes from `snd_una` on: sent and unacknowledged, then unsent.
    buffer: VecDeque<u8>,
    /// Stream offsets where each buffered message ends.
    message_ends: VecDeque<u64>,
    snd_una: u64,
    snd_nxt: u64,
    snd_max: u64,
    cwnd: f64,
    ssthresh: f64,
    dupacks: u32,
    recover: Option<u64>,
    retransmit_now: bool,
    srtt: Option<f64>,
    rttvar: f64,
    rto: Duration,
    rto_deadline: Option<Instant>,
    timed: Option<(u64, Instant)>,
    // Receiver.
    rcv_nxt: u64,
    out_of_order: BTreeMap<u64, Vec<u8>>,
    stream: Vec<u8>,
    unacked_segments: u32,
    ack_now: bool,
    delack_deadline: Option<Instant>,
    events: VecDeque<Event>,
    /// Retransmitted segments (fast or after a timeout).
    pub retransmissions: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
}

impl TcpLink {
    pub fn new(config: TcpConfig, now: Instant) -> TcpLink {
        TcpLink {
            cwnd: f64::from(config.initial_cwnd.max(1)),
            ssthresh: f64::from(config.receive_window_bytes) / config.mss as f64,
            rto: config.rto_initial,
            config,
            now,
            buffer: VecDeque::new(),
            message_ends: VecDeque::new(),
            snd_una: 0,
            snd_nxt: 0,
            snd_max: 0,
            dupacks: 0,
            recover: None,
            retransmit_now: false,
            srtt: None,
            rttvar: 0.0,
            rto_deadline: None,
            timed: None,
            rcv_nxt: 0,
            out_of_order: BTreeMap::new(),
            stream: Vec::new(),
            unacked_segments: 0,
            ack_now: false,
            delack_deadline: None,
            events: VecDeque::new(),
            retransmissions: 0,
            timeouts: 0,
        }
    }

    /// The congestion window, in segments.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The stream offset where the last message [`LinkProtocol::send`]
    /// accepted ends: a ticket the layer above can hold against
    /// [`TcpLink::acknowledged`] (as Hop's `accepted`).
    pub fn accepted(&self) -> u64 {
        self.snd_una + self.buffer.len() as u64
    }

    /// The peer's cumulative ACK, a stream offset: every message ending
    /// at or below it arrived there. A message ending above it is still
    /// in this end's custody.
    pub fn acknowledged(&self) -> u64 {
        self.snd_una
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    fn flight(&self) -> u64 {
        self.snd_nxt - self.snd_una
    }

    fn on_rtt(&mut self, sample: f64) {
        let (srtt, rttvar) = match self.srtt {
            None => (sample, sample / 2.0),
            Some(s) => {
                let rttvar = 0.75 * self.rttvar + 0.25 * (s - sample).abs();
                (0.875 * s + 0.125 * sample, rttvar)
            }
        };
        self.srtt = Some(srtt);
        self.rttvar = rttvar;
        let rto = Duration::from_secs_f64(srtt + (4.0 * rttvar).max(0.001));
        self.rto = rto.clamp(self.config.rto_min, self.config.rto_max);
    }

    fn on_ack(&mut self, ack: u64, pure: bool) {
        if ack > self.snd_max {
            return;
        }
        if ack > self.snd_una {
            self.on_new_ack(ack);
        } else if ack == self.snd_una && pure && self.snd_max > self.snd_una {
            self.on_dupack();
        }
    }

    fn on_new_ack(&mut self, ack: u64) {
        let acked_segments = ((ack - self.snd_una) as f64 / self.config.mss as f64).ceil();
        if let Some((end, at)) = self.timed {
            if ack >= end {
                self.on_rtt((self.now - at).as_secs_f64());
                self.timed = None;
            }
        }
        match self.recover {
            Some(point) if ack >= point => {
                self.cwnd = self.ssthresh;
                self.recover = None;
            }
            Some(_) => {
                // NewReno partial ACK: the next hole is lost too.
                self.retransmit_now = true;
                self.cwnd = (self.cwnd - acked_segments + 1.0).max(1.0);
            }
            None if self.cwnd < self.ssthresh => self.cwnd += acked_segments,
            None => self.cwnd += acked_segments / self.cwnd,
        }
        self.buffer.drain(..(ack - self.snd_una) as usize);
        self.snd_una = ack;
        self.snd_nxt = self.snd_nxt.max(ack);
        while self.message_ends.front().is_some_and(|&e| e <= ack) {
            self.message_ends.pop_front();
        }
        self.dupacks = 0;
        self.rto_deadline = (self.snd_una < self.snd_max).then(|| self.now + self.rto);
    }

    fn on_dupack(&mut self) {
        self.dupacks += 1;
        if self.dupacks == self.config.dupack_threshold && self.recover.is_none() {
            let flight = (self.snd_max - self.snd_una) as f64 / self.config.mss as f64;
            self.ssthresh = (flight / 2.0).max(2.0);
            self.cwnd = self.ssthresh + f64::from(self.config.dupack_threshold);
            self.recover = Some(self.snd_max);
            self.retransmit_now = true;
        } else if self.dupacks > self.config.dupack_threshold && self.recover.is_some() {
            self.cwnd += 1.0;
        }
    }

    fn on_timeout(&mut self) {
        self.timeouts += 1;
        let flight = (self.snd_max - self.snd_una) as f64 / self.config.mss as f64;
        self.ssthresh = (flight / 2.0).max(2.0);
        self.cwnd = 1.0;
        self.snd_nxt = self.snd_una;
        self.recover = None;
        self.dupacks = 0;
        self.timed = None;
        self.rto = (self.rto * 2).min(self.config.rto_max);
        self.rto_deadline = Some(self.now + self.rto);
    }

    fn on_segment(&mut self, seq: u64, data: &[u8]) {
        // A segment past the end of the sequence space is forged: dropped.
        let Some(end) = seq.checked_add(data.len() as u64) else {
            return;
        };
        if data.is_empty() {
            return;
        }
        if end <= self.rcv_nxt {
            self.ack_now = true;
            return;
        }
        if seq > self.rcv_nxt {
            if seq - self.rcv_nxt < u64::from(self.config.receive_window_bytes) {
                self.out_of_order
                    .entry(seq)
                    .or_insert_with(|| data.to_vec());
            }
            self.ack_now = true;
            return;
        }
        let filled_hole = !self.out_of_order.is_empty();
        self.stream
            .extend_from_slice(&data[(self.rcv_nxt - seq) as usize..]);
        self.rcv_nxt = end;
        while let Some(entry) = self.out_of_order.first_entry() {
            let (s, d) = (*entry.key(), entry.get());
            if s > self.rcv_nxt {
                break;
            }
            let e = s + d.len() as u64;
            if e > self.rcv_nxt {
                let skip = (self.rcv_nxt - s) as usize;
                self.stream.extend_from_slice(&d[skip..]);
                self.rcv_nxt = e;
            }
            entry.remove();
        }
        self.deliver_stream();
        self.unacked_segments += 1;
        if filled_hole || self.unacked_segments >= 2 {
            self.ack_now = true;
        } else if self.delack_deadline.is_none() {
            self.delack_deadline = Some(self.now + self.config.delayed_ack);
        }
    }

    fn deliver_stream(&mut self) {
        let mut at = 0;
        while let Some(len) = self.stream.get(at..at + 4) {
            let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
            let Some(msg) = self.stream.get(at + 4..at + 4 + len) else {
                break;
            };
            self.events.push_back(Event::Deliver {
                payload: Bytes::copy_from_slice(msg),
                recovered: false,
            });
            at += 4 + len;
        }
        self.stream.drain(..at);
    }

    /// The segment to send now, if any: (seq, len, retransmission).
    fn next_segment(&mut self) -> Option<(u64, usize, bool)> {
        let end = self.snd_una + self.buffer.len() as u64;
        if self.retransmit_now {
            self.retransmit_now = false;
            let len = (self.snd_max - self.snd_una).min(self.config.mss as u64) as usize;
            if len > 0 {
                return Some((self.snd_una, len, true));
            }
        }
        let available = end - self.snd_nxt;
        if available == 0 {
            return None;
        }
        let len = available.min(self.config.mss as u64) as usize;
        let window =
            (self.cwnd * self.config.mss as f64).min(f64::from(self.config.receive_window_bytes));
        if self.flight() > 0 && (self.flight() + len as u64) as f64 > window {
            return None;
        }
        let resend = self.snd_nxt < self.snd_max;
        if self.config.nagle && len < self.config.mss && self.flight() > 0 && !resend {
            return None;
        }
        Some((self.snd_nxt, len, resend))
    }

    fn encode(&mut self, seq: u64, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(SEGMENT_HEADER + data.len());
        out.push(1);
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&self.rcv_nxt.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
        self.ack_now = false;
        self.unacked_segments = 0;
        self.delack_deadline = None;
        out
    }
}

impl LinkProtocol for TcpLink {
    fn send(&mut self, _now: Instant, payload: Bytes) -> Result<(), SendError> {
        if payload.len() > MAX_MESSAGE {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max: MAX_MESSAGE,
            });
        }
        if self.queued() >= self.config.send_queue_max {
            return Err(SendError::QueueFull);
        }
        self.buffer
            .extend((payload.len() as u32).to_be_bytes().iter().copied());
        self.buffer.extend(payload.iter().copied());
        self.message_ends
            .push_back(self.snd_una + self.buffer.len() as u64);
        Ok(())
    }

    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.advance(now);
        let Some((&[tag], rest)) = datagram.split_first_chunk::<1>() else {
            return;
        };
        let (Some(seq), Some(ack), Some(len)) = (rest.get(0..8), rest.get(8..16), rest.get(16..18))
        else {
            return;
        };
        let seq = u64::from_be_bytes(seq.try_into().expect("8 bytes"));
        let ack = u64::from_be_bytes(ack.try_into().expect("8 bytes"));
        let len = usize::from(u16::from_be_bytes(len.try_into().expect("2 bytes")));
        let Some(data) = rest.get(18..18 + len) else {
            return;
        };
        if tag != 1 {
            return;
        }
        self.on_ack(ack, data.is_empty());
        self.on_segment(seq, data);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        if self.rto_deadline.is_some_and(|d| d <= self.now) {
            self.on_timeout();
        }
        if self.delack_deadline.is_some_and(|d| d <= self.now) {
            self.delack_deadline = None;
            self.ack_now = true;
        }
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.advance(now);
        if let Some((seq, len, retransmission)) = self.next_segment() {
            let offset = (seq - self.snd_una) as usize;
            let data: Vec<u8> = self.buffer.range(offset..offset + len).copied().collect();
            if retransmission {
                self.retransmissions += 1;
                self.timed = None;
            } else if self.timed.is_none() {
                self.timed = Some((seq + len as u64, self.now));
            }
            if seq == self.snd_nxt {
                self.snd_nxt += len as u64;
            }
            self.snd_max = self.snd_max.max(seq + len as u64);
            if self.rto_deadline.is_none() {
                self.rto_deadline = Some(self.now + self.rto);
            }
            return Some(self.encode(seq, &data));
        }
        if self.ack_now {
            let seq = self.snd_nxt;
            return Some(self.encode(seq, &[]));
        }
        None
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [self.rto_deadline, self.delack_deadline]
            .into_iter()
            .flatten()
            .min()
    }

    fn queued(&self) -> usize {
        let sent = self.message_ends.partition_point(|&e| e <= self.snd_max);
        self.message_ends.len() - sent
    }

    fn max_message(&self) -> usize {
        MAX_MESSAGE
    }

    fn retransmissions(&self) -> u64 {
        self.retransmissions
    }
}
