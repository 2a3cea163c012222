//! Fault injection: drop, duplicate and delay datagrams, from a seeded
//! generator.
//!
//! Applied mainly to **received** datagrams, before the engine sees them: a drop
//! models loss anywhere on the path to this member, and each member draws
//! independently (as on a real LAN, where one multicast reaches some
//! receivers and not others). The unit is a datagram, which may carry many
//! packed messages, just as a real network loses whole datagrams.
//!
//! Sent datagrams can be dropped or duplicated too (`send_*`), before they
//! reach the socket: a dropped IP multicast is then lost for every
//! receiver at once (correlated loss, as at a sender's NIC). Sends are never
//! delayed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::{Instant, NodeId};

/// What to inject. The default injects nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Probability in [0, 1) that a received datagram is dropped.
    pub drop_probability: f64,
    /// Probability in [0, 1) that a received datagram is handed over twice
    /// (each copy then dropped or delayed on its own draw, so with jitter
    /// the copies may arrive apart and out of order).
    pub duplicate_probability: f64,
    /// Added to every received datagram's arrival time.
    pub delay: Duration,
    /// A further uniform random delay in [0, jitter] per datagram (datagrams
    /// may then be reordered).
    pub jitter: Duration,
    /// Probability in [0, 1) that a datagram this node sends is dropped.
    pub send_drop_probability: f64,
    /// Probability in [0, 1) that a datagram this node sends goes twice.
    pub send_duplicate_probability: f64,
    /// Seeds the generator; give each node its own.
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            drop_probability: 0.0,
            duplicate_probability: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            send_drop_probability: 0.0,
            send_duplicate_probability: 0.0,
            seed: 0,
        }
    }
}

impl FaultConfig {
    /// Whether any fault is configured (the runtime skips the layer if not).
    pub fn is_active(&self) -> bool {
        self.drop_probability > 0.0
            || self.duplicate_probability > 0.0
            || !self.delay.is_zero()
            || !self.jitter.is_zero()
            || self.send_drop_probability > 0.0
            || self.send_duplicate_probability > 0.0
    }
}

/// What happens to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Deliver,
    Drop,
    /// Hand it to the engine at this time.
    DelayUntil(Instant),
}

/// The fault layer of one node: its generator and its held datagrams.
#[derive(Debug)]
pub struct Faults {
    config: FaultConfig,
    rng: Xoshiro256PlusPlus,
    held: BinaryHeap<Reverse<Held>>,
    next_order: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    due: Instant,
    /// Arrival order: equal due times keep arrival order.
    order: u64,
    from: NodeId,
    datagram: Vec<u8>,
}

impl Faults {
    pub fn new(config: FaultConfig) -> Faults {
        Faults {
            rng: Xoshiro256PlusPlus::seed_from_u64(config.seed),
            config,
            held: BinaryHeap::new(),
            next_order: 0,
        }
    }

    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// How many copies of a datagram that arrived to judge: 2 with
    /// `duplicate_probability`, else 1. Draws nothing when duplication is off,
    /// so a seed gives the same drops and delays as without it.
    pub fn copies(&mut self) -> usize {
        if self.config.duplicate_probability > 0.0
            && self.rng.random::<f64>() < self.config.duplicate_probability
        {
            2
        } else {
            1
        }
    }

    /// How many copies of a datagram this node sends go to the socket: 0
    /// (dropped), 1, or 2 (duplicated). Draws nothing for a probability of 0.
    pub fn sent_copies(&mut self) -> usize {
        let c = self.config;
        if c.send_drop_probability > 0.0 && self.rng.random::<f64>() < c.send_drop_probability {
            return 0;
        }
        if c.send_duplicate_probability > 0.0
            && self.rng.random::<f64>() < c.send_duplicate_probability
        {
            return 2;
        }
        1
    }

    /// Decides the fate of a datagram (or a copy) that arrived at `now`.
    pub fn judge(&mut self, now: Instant) -> Verdict {
        if self.config.drop_probability > 0.0
            && self.rng.random::<f64>() < self.config.drop_probability
        {
            return Verdict::Drop;
        }
        let mut delay = self.config.delay;
        if !self.config.jitter.is_zero() {
            delay += self.config.jitter.mul_f64(self.rng.random::<f64>());
        }
        if delay.is_zero() {
            Verdict::Deliver
        } else {
            Verdict::DelayUntil(now + delay)
        }
    }

    /// Keeps a copy of a delayed datagram until `due`.
    pub fn hold(&mut self, due: Instant, from: NodeId, datagram: &[u8]) {
        self.next_order += 1;
        self.held.push(Reverse(Held {
            due,
            order: self.next_order,
            from,
            datagram: datagram.to_vec(),
        }));
    }

    /// When the earliest held datagram is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|Reverse(h)| h.due)
    }

    /// The earliest held datagram if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(NodeId, Vec<u8>)> {
        if self.next_due()? > now {
            return None;
        }
        let Reverse(held) = self.held.pop()?;
        Some((held.from, held.datagram))
    }

    /// Datagrams currently held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_drops(p: f64, seed: u64, n: u32) -> u32 {
        let mut faults = Faults::new(FaultConfig {
            drop_probability: p,
            seed,
            ..FaultConfig::default()
        });
        (0..n)
            .filter(|_| faults.judge(Instant::ZERO) == Verdict::Drop)
            .count() as u32
    }

    #[test]
    fn drop_rate_within_bounds() {
        // 100,000 draws at p = 0.05: mean 5,000, sd ~69; ±500 is > 7 sd.
        for seed in [1, 2, 3, 42] {
            let drops = count_drops(0.05, seed, 100_000);
            assert!((4_500..=5_500).contains(&drops), "seed {seed}: {drops}");
        }
    }

    #[test]
    fn same_seed_same_drops() {
        assert_eq!(count_drops(0.3, 7, 10_000), count_drops(0.3, 7, 10_000));
    }

    #[test]
    fn no_faults_delivers_everything() {
        assert_eq!(count_drops(0.0, 9, 10_000), 0);
        assert!(!FaultConfig::default().is_active());
    }

    #[test]
    fn duplication_rate_within_bounds_and_off_by_default() {
        let mut faults = Faults::new(FaultConfig {
            duplicate_probability: 0.1,
            seed: 5,
            ..FaultConfig::default()
        });
        assert!(faults.config().is_active());
        // 100,000 draws at p = 0.1: mean 10,000, sd ~95; ±1,000 is > 10 sd.
        let doubled = (0..100_000).filter(|_| faults.copies() == 2).count();
        assert!((9_000..=11_000).contains(&doubled), "{doubled}");
        let mut off = Faults::new(FaultConfig::default());
        assert!((0..1000).all(|_| off.copies() == 1));
    }

    #[test]
    fn sent_datagrams_are_dropped_and_duplicated_at_the_configured_rates() {
        let mut faults = Faults::new(FaultConfig {
            send_drop_probability: 0.2,
            send_duplicate_probability: 0.1,
            seed: 11,
            ..FaultConfig::default()
        });
        assert!(faults.config().is_active());
        let mut counts = [0u32; 3];
        for _ in 0..100_000 {
            counts[faults.sent_copies()] += 1;
        }
        // Drops: mean 20,000 (sd ~126); duplicates: 10% of the 80,000
        // kept, mean 8,000 (sd ~85). Bounds are > 7 sd wide.
        assert!((19_000..=21_000).contains(&counts[0]), "{counts:?}");
        assert!((7_400..=8_600).contains(&counts[2]), "{counts:?}");
        let mut off = Faults::new(FaultConfig::default());
        assert!((0..1000).all(|_| off.sent_copies() == 1));
    }

    #[test]
    fn delay_and_jitter_bounds_and_release_order() {
        let mut faults = Faults::new(FaultConfig {
            delay: Duration::from_millis(5),
            jitter: Duration::from_millis(2),
            seed: 3,
            ..FaultConfig::default()
        });
        let now = Instant::from_nanos(1_000_000_000);
        for i in 0..100u8 {
            let Verdict::DelayUntil(due) = faults.judge(now) else {
                panic!("expected a delay");
            };
            let delay = due - now;
            assert!(delay >= Duration::from_millis(5) && delay <= Duration::from_millis(7));
            faults.hold(due, NodeId(1), &[i]);
        }
        assert_eq!(faults.pop_due(now), None);
        let mut last = Instant::ZERO;
        let mut released = 0;
        while let Some(due) = faults.next_due() {
            assert!(due >= last);
            last = due;
            assert!(faults.pop_due(due).is_some());
            released += 1;
        }
        assert_eq!(released, 100);
    }
}
