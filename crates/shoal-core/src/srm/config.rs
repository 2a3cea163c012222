//! SRM settings. Neither paper gives SRM's constants (P001 §B, P000 §2.4 say
//! only "as recommended by SRM's developers"); the defaults are ns-2's
//! (`tcl/mcast/srm.tcl`, `srm-adaptive.tcl`), as listed in the reading notes'
//! Appendix A.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of one SRM member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Request timer: uniform in [C1·d, (C1+C2)·d], d = distance to the source.
    pub c1: f64,
    pub c2: f64,
    /// Repair timer: uniform in [D1·d, (D1+D2)·d], d = distance to the requester.
    pub d1: f64,
    pub d2: f64,
    /// The request interval is multiplied by `backoff_factor` per backoff
    /// (2 for fixed SRM, 3 for adaptive), at most `request_backoff_limit` times.
    pub backoff_factor: f64,
    pub request_backoff_limit: u32,
    /// After a repair, requests for the same data are ignored for this many
    /// distances to the requester (ns-2: 3).
    pub repair_holddown_distances: f64,
    /// Session messages every interval × U(1 − jitter, 1 + jitter).
    #[serde(with = "crate::serde_ms")]
    pub session_interval: Duration,
    pub session_jitter: f64,
    /// Peers whose timestamps one session message echoes, at most; a
    /// rotating subset keeps sessions small in large groups.
    pub session_echoes_max: usize,
    /// EWMA weight of a new distance sample.
    pub distance_alpha: f64,
    /// Distance assumed before the first estimate.
    #[serde(with = "crate::serde_ms")]
    pub initial_distance: Duration,
    /// Adaptive timers (Floyd et al.); `None` is SRM with fixed timers.
    pub adaptive: Option<Adaptive>,
}

/// The ns-2 base class's constants (`Agent/SRM`: C1 = C2 = 2, D1 = D2 = 1),
/// for a group of unknown size. P001 ran `Agent/SRM/Fixed`, which sets
/// D1 = D2 = log10 G: use [`Config::fixed`] for that.
impl Default for Config {
    fn default() -> Self {
        Config {
            c1: 2.0,
            c2: 2.0,
            d1: 1.0,
            d2: 1.0,
            backoff_factor: 2.0,
            request_backoff_limit: 5,
            repair_holddown_distances: 3.0,
            session_interval: Duration::from_secs(1),
            session_jitter: 0.1,
            session_echoes_max: 16,
            distance_alpha: 0.25,
            initial_distance: Duration::from_millis(100),
            adaptive: None,
        }
    }
}

/// Adaptive SRM's adjustment rules and bounds (notes, Appendix A). Upper
/// bounds that depend on the group size G are computed from the member list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Adaptive {
    /// Target average of duplicate requests (repairs) per loss.
    pub ave_dups: f64,
    /// Target average delay, in distances.
    pub ave_delay: f64,
    pub eps: f64,
    /// EWMA weight for the duplicate and delay averages.
    pub alpha: f64,
    pub c1_min: f64,
    pub c1_max: f64,
    pub c2_min: f64,
    pub d1_min: f64,
    pub d2_min: f64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            ave_dups: 1.0,
            ave_delay: 1.0,
            eps: 0.1,
            alpha: 0.25,
            c1_min: 0.5,
            c1_max: 2.0,
            c2_min: 1.0,
            d1_min: 0.5,
            d2_min: 1.0,
        }
    }
}

impl Config {
    /// SRM with fixed timers as P001 ran it, ns-2's `Agent/SRM/Fixed`:
    /// C1 = C2 = 2 and D1 = D2 = log10 G (notes, Appendix A), backoff ×2.
    /// The wider repair window of a larger group gives more holders time
    /// to hear a first repair and suppress their own.
    pub fn fixed(group_size: usize) -> Config {
        let log_g = log10_group(group_size);
        Config {
            d1: log_g,
            d2: log_g,
            ..Config::default()
        }
    }

    /// Adaptive SRM as ns-2 starts it: C1 = C2 = 2, D1 = D2 = log10 G,
    /// backoff ×3.
    pub fn adaptive(group_size: usize) -> Config {
        let log_g = log10_group(group_size);
        Config {
            d1: log_g,
            d2: log_g,
            backoff_factor: 3.0,
            adaptive: Some(Adaptive::default()),
            ..Config::default()
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("c1", self.c1),
            ("d1", self.d1),
            ("backoff_factor", self.backoff_factor),
            ("distance_alpha", self.distance_alpha),
        ];
        for (name, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(ConfigError::NotPositive(name));
            }
        }
        for (name, value) in [("c2", self.c2), ("d2", self.d2)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(ConfigError::NotPositive(name));
            }
        }
        if self.session_interval.is_zero() || self.initial_distance.is_zero() {
            return Err(ConfigError::NotPositive(
                "session_interval/initial_distance",
            ));
        }
        if !(0.0..1.0).contains(&self.session_jitter) {
            return Err(ConfigError::Jitter(self.session_jitter));
        }
        Ok(())
    }
}

/// log10 G, with G at least 2 so the repair window stays positive.
fn log10_group(group_size: usize) -> f64 {
    (group_size.max(2) as f64).log10()
}

/// A setting out of its allowed range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} must be a positive finite number")]
    NotPositive(&'static str),
    #[error("session_jitter must be in [0, 1), got {0}")]
    Jitter(f64),
    #[error("the member list must contain this member ({0})")]
    NotAMember(u32),
}
