//! The one place where the OS clock becomes engine time.
//!
//! Engines see [`shoal_core::Instant`]: nanoseconds since an origin the driver
//! picks. Every node of a process shares one [`Clock`], so timestamps written
//! by one member (e.g. the demo's send time in a payload) mean the same thing
//! to every other member.

use std::time::Duration;

use shoal_core::Instant;

/// A monotonic clock with a fixed origin. Cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Clock {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// Engine time now.
    pub fn now(&self) -> Instant {
        self.instant(std::time::Instant::now())
    }

    /// Engine time of an OS instant (zero before the origin).
    pub fn instant(&self, at: std::time::Instant) -> Instant {
        let nanos = at.saturating_duration_since(self.origin).as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The OS instant of an engine time, for tokio timers.
    pub fn os_instant(&self, at: Instant) -> std::time::Instant {
        let since_origin = Duration::from_nanos(at.as_nanos());
        // Far-future deadlines (Instant::MAX) would overflow: cap at a year.
        self.origin
            .checked_add(since_origin)
            .unwrap_or_else(|| std::time::Instant::now() + Duration::from_secs(365 * 86_400))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_os_time() {
        let clock = Clock::new();
        let now = clock.now();
        let back = clock.instant(clock.os_instant(now));
        assert_eq!(back, now);
    }

    #[test]
    fn far_future_does_not_panic() {
        let clock = Clock::new();
        assert!(clock.os_instant(Instant::MAX) > std::time::Instant::now());
    }
}
