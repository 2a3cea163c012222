//! The inputs of the paper figures that the papers leave open, which
//! `shoal sim` can set for a probe (`--solicit-retry-max-ms`, ...). Their
//! defaults are the figures' own readings. A figure records the inputs it
//! reads in its `summary.csv`, and `shoal sim` writes every input of the
//! run to `params.csv` beside it, so a file says how it was made.

use std::time::Duration;

use shoal_core::pbcast;

/// The open inputs of the paper figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs {
    /// pbcast's `solicit_retry_max` in every P001 figure: how far the
    /// solicitation retry may stretch to the measured repair round trip.
    /// `None`: pbcast's default (the retry fixed at `solicit_retry`, 20 ms).
    /// At least `solicit_retry` (`docs/pbcast.md`).
    pub solicit_retry_max: Option<Duration>,
    /// pbcast's `push_hold_max` in every P001 figure. `None`: pbcast's
    /// default (200 ms); zero: every digest invites every gap.
    pub push_hold_max: Option<Duration>,
    /// P001 Fig 3's large tree: link speed in bits/s. The paper gives
    /// none; default 10 Mbit/s (Fig 8's non-root links; at Fig 1's
    /// 1.5 Mbit/s no unicast repair fits, `docs/reproduction.md`).
    pub large_tree_bps: f64,
    /// P001 Fig 8: the loss probability, placed at the receivers in one
    /// reading and on every link in the other. Default 1% ("the data loss
    /// rate was set to 1.0% for the entire network"). In [0, 1).
    pub bottleneck_loss: f64,
}

impl Default for Inputs {
    fn default() -> Inputs {
        Inputs {
            solicit_retry_max: None,
            push_hold_max: None,
            large_tree_bps: 10e6,
            bottleneck_loss: 0.01,
        }
    }
}

/// An input out of its range; nothing is run.
#[derive(Debug, Clone, PartialEq)]
pub enum InputError {
    /// `solicit_retry_max` below pbcast's fixed retry.
    RetryBelowFloor { floor_ms: u128, got_ms: u128 },
    /// The large tree's link speed is not a positive finite number.
    LargeTreeBps(f64),
    /// The bottleneck loss is not a probability below 1.
    BottleneckLoss(f64),
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputError::RetryBelowFloor { floor_ms, got_ms } => write!(
                f,
                "--solicit-retry-max-ms must be at least pbcast's {floor_ms} ms retry, got {got_ms}"
            ),
            InputError::LargeTreeBps(bps) => write!(
                f,
                "--large-tree-bps must be a positive number of bits/s, got {bps}"
            ),
            InputError::BottleneckLoss(p) => write!(
                f,
                "--bottleneck-loss must be a probability in [0, 1), got {p}"
            ),
        }
    }
}

impl std::error::Error for InputError {}

impl Inputs {
    /// Checks every input's range.
    pub fn check(&self) -> Result<(), InputError> {
        let floor = pbcast::Config::default().solicit_retry;
        if let Some(max) = self.solicit_retry_max {
            if max < floor {
                return Err(InputError::RetryBelowFloor {
                    floor_ms: floor.as_millis(),
                    got_ms: max.as_millis(),
                });
            }
        }
        let bps = self.large_tree_bps;
        if !(bps.is_finite() && bps > 0.0) {
            return Err(InputError::LargeTreeBps(bps));
        }
        if !(0.0..1.0).contains(&self.bottleneck_loss) {
            return Err(InputError::BottleneckLoss(self.bottleneck_loss));
        }
        Ok(())
    }

    /// `config` with the pbcast inputs that are set.
    pub fn pbcast(&self, config: pbcast::Config) -> pbcast::Config {
        pbcast::Config {
            solicit_retry_max: self.solicit_retry_max.unwrap_or(config.solicit_retry_max),
            push_hold_max: self.push_hold_max.unwrap_or(config.push_hold_max),
            ..config
        }
    }

    /// Every input as (name, value), the names of `shoal sim`'s options
    /// ("default" where pbcast's own default applies).
    pub fn params(&self) -> Vec<(String, String)> {
        let ms = |d: Option<Duration>| d.map_or("default".into(), |d| d.as_millis().to_string());
        vec![
            ("solicit_retry_max_ms".into(), ms(self.solicit_retry_max)),
            ("push_hold_max_ms".into(), ms(self.push_hold_max)),
            ("large_tree_bps".into(), self.large_tree_bps.to_string()),
            ("bottleneck_loss".into(), self.bottleneck_loss.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bad_value_is_named() {
        assert_eq!(Inputs::default().check(), Ok(()));
        let bad = Inputs {
            solicit_retry_max: Some(Duration::from_millis(5)),
            ..Inputs::default()
        };
        assert!(matches!(
            bad.check(),
            Err(InputError::RetryBelowFloor { got_ms: 5, .. })
        ));
        for bps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let bad = Inputs {
                large_tree_bps: bps,
                ..Inputs::default()
            };
            assert!(matches!(bad.check(), Err(InputError::LargeTreeBps(_))));
        }
        for p in [1.0, -0.1, f64::NAN] {
            let bad = Inputs {
                bottleneck_loss: p,
                ..Inputs::default()
            };
            assert!(matches!(bad.check(), Err(InputError::BottleneckLoss(_))));
        }
    }

    #[test]
    fn pbcast_inputs_replace_only_what_is_set() {
        let base = pbcast::Config::default();
        assert_eq!(Inputs::default().pbcast(base.clone()), base);
        let probe = Inputs {
            solicit_retry_max: Some(Duration::from_millis(200)),
            push_hold_max: Some(Duration::ZERO),
            ..Inputs::default()
        };
        let c = probe.pbcast(base.clone());
        assert_eq!(c.solicit_retry_max, Duration::from_millis(200));
        assert_eq!(c.push_hold_max, Duration::ZERO);
        assert_eq!(c.gossip_interval, base.gossip_interval);
    }
}
