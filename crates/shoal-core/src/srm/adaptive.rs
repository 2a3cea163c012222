//! SRM's timer constants, fixed or adapted (Floyd et al. §VII; ns-2
//! `srm-adaptive.tcl`, summarised in the reading notes' Appendix A).
//!
//! Adaptive rules, applied before each new request (repair) timer:
//! - average duplicates ≥ target: C1 += 0.1, C2 += 0.5 (spread out more);
//! - average duplicates < target − eps: if the average delay is above its
//!   target, C2 −= 0.1; if duplicates are below 1/4, C1 −= 0.05;
//! - otherwise C1 += 0.05.
//!
//! A member that sends a request (it was the closest requester) lowers C2 by
//! 0.1; the same rules drive D1 and D2 from repair duplicates and delays.
//! Bounds: C1 ∈ [0.5, 2], C2 ∈ [1, G], D1 ∈ [0.5, log10 G], D2 ∈ [1, G].

use super::config::{Adaptive, Config};

#[derive(Debug, Clone)]
pub(super) struct Tuner {
    c: [f64; 2],
    d: [f64; 2],
    rules: Option<Adaptive>,
    group_size: f64,
    request: Averages,
    repair: Averages,
}

/// EWMAs of duplicates per loss and delay (in distances).
#[derive(Debug, Clone, Copy, Default)]
struct Averages {
    dups: f64,
    delay: f64,
}

impl Tuner {
    pub fn new(config: &Config, group_size: usize) -> Tuner {
        Tuner {
            c: [config.c1, config.c2],
            d: [config.d1, config.d2],
            rules: config.adaptive.clone(),
            group_size: group_size.max(2) as f64,
            request: Averages::default(),
            repair: Averages::default(),
        }
    }

    /// [C1, C2, D1, D2].
    pub fn constants(&self) -> [f64; 4] {
        [self.c[0], self.c[1], self.d[0], self.d[1]]
    }

    pub fn before_request_timer(&mut self) {
        if let Some(rules) = &self.rules {
            adjust(&mut self.c, self.request, rules);
            self.clamp();
        }
    }

    pub fn before_repair_timer(&mut self) {
        if let Some(rules) = &self.rules {
            adjust(&mut self.d, self.repair, rules);
            self.clamp();
        }
    }

    pub fn sent_request(&mut self) {
        if self.rules.is_some() {
            self.c[1] -= 0.1;
            self.clamp();
        }
    }

    pub fn sent_repair(&mut self) {
        if self.rules.is_some() {
            self.d[1] -= 0.1;
            self.clamp();
        }
    }

    /// A loss was repaired after `requests_seen` requests (sent or heard),
    /// the first `delay_distances` after detection.
    pub fn request_done(&mut self, requests_seen: u32, delay_distances: f64) {
        let alpha = self.alpha();
        let dups = f64::from(requests_seen.saturating_sub(1));
        self.request.dups += alpha * (dups - self.request.dups);
        self.request.delay += alpha * (delay_distances - self.request.delay);
    }

    pub fn repair_delay(&mut self, delay_distances: f64) {
        let alpha = self.alpha();
        self.repair.delay += alpha * (delay_distances - self.repair.delay);
    }

    /// A repair's hold-down ended having seen `repairs_seen` repairs.
    pub fn repair_done(&mut self, repairs_seen: u32) {
        let alpha = self.alpha();
        let dups = f64::from(repairs_seen.saturating_sub(1));
        self.repair.dups += alpha * (dups - self.repair.dups);
    }

    fn alpha(&self) -> f64 {
        self.rules.as_ref().map_or(0.25, |r| r.alpha)
    }

    fn clamp(&mut self) {
        let Some(rules) = &self.rules else { return };
        let g = self.group_size;
        self.c[0] = self.c[0].clamp(rules.c1_min, rules.c1_max);
        self.c[1] = self.c[1].clamp(rules.c2_min, g.max(rules.c2_min));
        let log_g = g.log10().max(rules.d1_min);
        self.d[0] = self.d[0].clamp(rules.d1_min, log_g);
        self.d[1] = self.d[1].clamp(rules.d2_min, g.max(rules.d2_min));
    }
}

/// One adjustment of (first, second) constants from the averages.
fn adjust(k: &mut [f64; 2], averages: Averages, rules: &Adaptive) {
    if averages.dups >= rules.ave_dups {
        k[0] += 0.1;
        k[1] += 0.5;
    } else if averages.dups < rules.ave_dups - rules.eps {
        if averages.delay > rules.ave_delay {
            k[1] -= 0.1;
        }
        if averages.dups < 0.25 {
            k[0] -= 0.05;
        }
    } else {
        k[0] += 0.05;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_duplicates_spread_the_timers_out_within_bounds() {
        let mut tuner = Tuner::new(&Config::adaptive(10), 10);
        for _ in 0..100 {
            tuner.request_done(5, 1.0);
            tuner.before_request_timer();
        }
        let [c1, c2, _, _] = tuner.constants();
        assert_eq!(c1, 2.0, "C1 is capped at 2");
        assert_eq!(c2, 10.0, "C2 is capped at G");
    }

    #[test]
    fn few_duplicates_and_long_delays_tighten_the_timers() {
        let mut tuner = Tuner::new(&Config::adaptive(10), 10);
        for _ in 0..100 {
            tuner.request_done(1, 3.0);
            tuner.before_request_timer();
        }
        let [c1, c2, _, _] = tuner.constants();
        assert_eq!(c1, 0.5);
        assert_eq!(c2, 1.0);
    }

    #[test]
    fn fixed_timers_never_move() {
        let mut tuner = Tuner::new(&Config::default(), 50);
        tuner.request_done(9, 9.0);
        tuner.before_request_timer();
        tuner.sent_request();
        assert_eq!(tuner.constants(), [2.0, 2.0, 1.0, 1.0]);
    }
}
