//! Gossip-style failure detection (van Renesse, Minsky, Hayden, Middleware
//! '98; cited by P000 §5.2 as the scalable alternative to all-to-all
//! heartbeats).
//!
//! Every member keeps a table of heartbeat counters. Each round it bumps its
//! own counter and sends its table to one member chosen at random. A receiver
//! keeps, per member, the higher (incarnation, heartbeat) and notes when it
//! last rose. A member whose counter has not risen for `fail_after` is
//! suspected; after `cleanup_after` it is forgotten. `cleanup_after` must be
//! well above `fail_after`, or a stale gossip could bring a forgotten member
//! back (the paper's T_cleanup ≥ 2·T_fail rule).
//!
//! Per-member load does not grow with the group: one datagram per round, of
//! at most `entries_per_gossip_max` entries. In a group larger than that, each
//! gossip carries this member's own entry and a rotating window of the rest,
//! so information spreads a little more slowly but the cost stays flat
//! (DESIGN.md: no mechanism whose cost grows with group size).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};
use shoal_wire::{HeartbeatEntry, Packet};

use crate::engine::{Destination, NodeId, Transmit};
use crate::time::Instant;

/// Failure-detector settings. The papers give none (P000 leaves gossip
/// failure detection to future work); the defaults match pbcast's round and
/// give about 50 rounds of slack before a suspicion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    #[serde(with = "crate::serde_ms")]
    pub gossip_interval: Duration,
    /// T_fail: no rise in a member's heartbeat for this long makes it suspected.
    #[serde(with = "crate::serde_ms")]
    pub fail_after: Duration,
    /// T_cleanup: a member is forgotten this long after its last rise.
    #[serde(with = "crate::serde_ms")]
    pub cleanup_after: Duration,
    /// Entries in one gossip, at most (keeps it in one 1500-byte frame).
    pub entries_per_gossip_max: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gossip_interval: Duration::from_millis(100),
            fail_after: Duration::from_secs(5),
            cleanup_after: Duration::from_secs(10),
            entries_per_gossip_max: 80,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("gossip_interval must be positive")]
    GossipIntervalZero,
    #[error("cleanup_after ({cleanup:?}) must exceed fail_after ({fail:?})")]
    CleanupBeforeFail { fail: Duration, cleanup: Duration },
    #[error("entries_per_gossip_max must be at least 1")]
    NoEntries,
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gossip_interval.is_zero() {
            return Err(ConfigError::GossipIntervalZero);
        }
        if self.cleanup_after <= self.fail_after {
            return Err(ConfigError::CleanupBeforeFail {
                fail: self.fail_after,
                cleanup: self.cleanup_after,
            });
        }
        if self.entries_per_gossip_max == 0 {
            return Err(ConfigError::NoEntries);
        }
        Ok(())
    }
}

/// What the detector reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdEvent {
    /// A member was heard of for the first time, or again after a suspicion.
    Alive(NodeId),
    /// Its heartbeat has not risen for `fail_after`.
    Suspected(NodeId),
    /// Dropped from the table after `cleanup_after`.
    Forgotten(NodeId),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    incarnation: u32,
    heartbeat: u64,
    updated: Instant,
    suspected: bool,
}

/// One member's failure detector.
pub struct FailureDetector {
    me: NodeId,
    incarnation: u32,
    heartbeat: u64,
    config: Config,
    rng: Xoshiro256PlusPlus,
    table: BTreeMap<NodeId, Entry>,
    rotation: usize,
    next_round: Instant,
    outbox: VecDeque<Transmit>,
    events: VecDeque<FdEvent>,
    last_now: Instant,
    stats: Stats,
}

/// What one detector sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub rounds: u64,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
}

impl FailureDetector {
    /// `contacts`: members to gossip with until others are heard of.
    /// `incarnation` must grow each time this member restarts.
    pub fn new(
        me: NodeId,
        incarnation: u32,
        contacts: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<FailureDetector, ConfigError> {
        config.validate()?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let next_round = now + config.gossip_interval.mul_f64(rng.random::<f64>());
        let table = contacts
            .iter()
            .filter(|c| **c != me)
            .map(|c| {
                let entry = Entry {
                    incarnation: 0,
                    heartbeat: 0,
                    updated: now,
                    suspected: false,
                };
                (*c, entry)
            })
            .collect();
        Ok(FailureDetector {
            me,
            incarnation,
            heartbeat: 0,
            config,
            rng,
            table,
            rotation: 0,
            next_round,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            last_now: now,
            stats: Stats::default(),
        })
    }

    /// Members believed alive, this one included, ascending.
    pub fn live_members(&self) -> Vec<NodeId> {
        let mut live: Vec<NodeId> = self
            .table
            .iter()
            .filter(|(_, e)| !e.suspected)
            .map(|(n, _)| *n)
            .collect();
        live.push(self.me);
        live.sort_unstable();
        live
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn is_suspected(&self, node: NodeId) -> bool {
        self.table.get(&node).is_some_and(|e| e.suspected)
    }

    pub fn handle_datagram(&mut self, now: Instant, _from: NodeId, datagram: &[u8]) {
        let now = self.clamp(now);
        for item in shoal_wire::packets(datagram) {
            match item {
                Ok((_, Packet::Heartbeat { entries })) => self.merge(now, &entries),
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    fn merge(&mut self, now: Instant, entries: &[HeartbeatEntry]) {
        for e in entries {
            let node = NodeId(e.member);
            if node == self.me {
                continue;
            }
            let fresh = Entry {
                incarnation: e.incarnation,
                heartbeat: e.heartbeat,
                updated: now,
                suspected: false,
            };
            match self.table.get_mut(&node) {
                None => {
                    self.table.insert(node, fresh);
                    self.events.push_back(FdEvent::Alive(node));
                }
                Some(old) if (e.incarnation, e.heartbeat) > (old.incarnation, old.heartbeat) => {
                    if old.suspected {
                        self.events.push_back(FdEvent::Alive(node));
                    }
                    *old = fresh;
                }
                Some(_) => {}
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clamp(now);
        if now < self.next_round {
            return;
        }
        self.next_round = (self.next_round + self.config.gossip_interval).max(now);
        if self.next_round == now {
            self.next_round = now + self.config.gossip_interval;
        }
        self.heartbeat += 1;
        self.stats.rounds += 1;
        self.age_entries(now);
        self.gossip();
    }

    fn age_entries(&mut self, now: Instant) {
        let (fail, cleanup) = (self.config.fail_after, self.config.cleanup_after);
        let mut forgotten = Vec::new();
        for (node, entry) in &mut self.table {
            if entry.updated + cleanup <= now {
                forgotten.push(*node);
            } else if !entry.suspected && entry.updated + fail <= now {
                entry.suspected = true;
                self.events.push_back(FdEvent::Suspected(*node));
            }
        }
        for node in forgotten {
            self.table.remove(&node);
            self.events.push_back(FdEvent::Forgotten(node));
        }
    }

    fn gossip(&mut self) {
        let Some(target) = self.random_target() else {
            return;
        };
        let packet = Packet::Heartbeat {
            entries: self.entries_to_send(),
        };
        if let Ok(bytes) = packet.to_vec(self.me.0) {
            self.stats.datagrams_sent += 1;
            self.stats.bytes_sent += bytes.len() as u64;
            self.outbox.push_back(Transmit {
                destination: Destination::Node(target),
                payload: Bytes::from(bytes),
            });
        }
    }

    /// A live member at random, or any known member if all are suspected.
    fn random_target(&mut self) -> Option<NodeId> {
        let live: Vec<NodeId> = self
            .table
            .iter()
            .filter(|(_, e)| !e.suspected)
            .map(|(n, _)| *n)
            .collect();
        let pool: Vec<NodeId> = if live.is_empty() {
            self.table.keys().copied().collect()
        } else {
            live
        };
        (!pool.is_empty()).then(|| pool[self.rng.random_range(0..pool.len())])
    }

    /// This member's entry, then a rotating window of the others.
    fn entries_to_send(&mut self) -> Vec<HeartbeatEntry> {
        let mut entries = vec![HeartbeatEntry {
            member: self.me.0,
            incarnation: self.incarnation,
            heartbeat: self.heartbeat,
        }];
        let others: Vec<(NodeId, Entry)> = self
            .table
            .iter()
            .filter(|(_, e)| !e.suspected)
            .map(|(n, e)| (*n, *e))
            .collect();
        let room = usize::from(self.config.entries_per_gossip_max) - 1;
        let take = others.len().min(room);
        for i in 0..take {
            let (node, e) = others[(self.rotation + i) % others.len()];
            entries.push(HeartbeatEntry {
                member: node.0,
                incarnation: e.incarnation,
                heartbeat: e.heartbeat,
            });
        }
        if !others.is_empty() {
            self.rotation = (self.rotation + take) % others.len();
        }
        entries
    }

    pub fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.outbox.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<FdEvent> {
        self.events.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next_round)
    }

    fn clamp(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }
}

#[cfg(test)]
mod tests;
