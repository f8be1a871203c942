//! Exponential backoff with random jitter, between the attempts of
//! something that keeps failing: a watch of the API server, the template
//! directory, a template file that cannot be read.
//!
//! Invariants:
//! * Each delay is drawn uniformly from [next/2, next], `next` starting at
//!   the minimum and doubling after each delay up to the maximum.
//! * The jitter is random (keyed by the operating system's random source,
//!   through std's `RandomState`), not derived from the clock: daemons on many
//!   nodes that lose the API server at the same moment do not come back in
//!   step, whatever the clock's resolution.
//! * A failure that comes [`HEALTHY`] or more after the previous attempt
//!   starts from the minimum again: a watch that ran well for a while and
//!   then drops retries quickly, one that fails at once again and again
//!   backs off.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

/// The first delay (before jitter).
pub const MIN: Duration = Duration::from_millis(250);
/// The longest delay.
pub const MAX: Duration = Duration::from_secs(8);
/// How long without a failure resets the backoff. Longer than [`MAX`], so
/// that the wait itself never counts as health.
pub const HEALTHY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    /// When the attempt after the last delay was due.
    attempt: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    /// From [`MIN`] to [`MAX`].
    pub fn new() -> Self {
        Backoff::with_bounds(MIN, MAX)
    }

    /// From `min` doubling up to `max`.
    pub fn with_bounds(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            next: min,
            attempt: None,
        }
    }

    /// Back to the minimum: what was failing works.
    pub fn reset(&mut self) {
        self.next = self.min;
        self.attempt = None;
    }

    /// The delay before the next attempt, after a failure now.
    pub fn delay(&mut self) -> Duration {
        self.delay_at(Instant::now())
    }

    /// [`Backoff::delay`] after a failure at `now`.
    pub fn delay_at(&mut self, now: Instant) -> Duration {
        if self
            .attempt
            .is_some_and(|at| now.saturating_duration_since(at) >= HEALTHY)
        {
            self.next = self.min;
        }
        let half = self.next / 2;
        let delay = half + (self.next - half).mul_f64(random_fraction());
        self.next = (self.next * 2).min(self.max);
        self.attempt = Some(now + delay);
        delay
    }
}

/// A random number in [0, 1]. Each `RandomState` hashes with other keys
/// (random per thread, then incremented), so hashing a constant with a new
/// one is a fresh random draw.
fn random_fraction() -> f64 {
    let bits = RandomState::new().hash_one(0u8) >> 11;
    bits as f64 / ((1u64 << 53) - 1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_jitter_bounds_up_to_the_maximum() {
        let mut b = Backoff::new();
        let now = Instant::now();
        let mut next = MIN;
        for _ in 0..10 {
            let d = b.delay_at(now);
            assert!(
                d >= next / 2 && d <= next,
                "{d:?} not in [{:?}, {next:?}]",
                next / 2
            );
            next = (next * 2).min(MAX);
        }
        assert_eq!(next, MAX, "the maximum is reached");
    }

    #[test]
    fn the_jitter_is_random_and_spans_its_range() {
        // 2000 first delays, from 2000 backoffs made at one instant: no two
        // daemons need share a delay, and the draws cover [min/2, min].
        let now = Instant::now();
        let delays: Vec<Duration> = (0..2000).map(|_| Backoff::new().delay_at(now)).collect();
        let (low, high) = (MIN / 2, MIN);
        assert!(delays.iter().all(|d| *d >= low && *d <= high));
        let third = (high - low) / 3;
        assert!(
            delays.iter().any(|d| *d < low + third),
            "some in the lowest third"
        );
        assert!(
            delays.iter().any(|d| *d > high - third),
            "some in the highest third"
        );
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 1900, "{} distinct of 2000", distinct.len());
    }

    #[test]
    fn a_healthy_period_resets_it_and_the_wait_itself_does_not() {
        let mut b = Backoff::new();
        let start = Instant::now();
        let mut at = start;
        for _ in 0..8 {
            at += b.delay_at(at);
        }
        // Failing at each attempt, at most MAX apart: still at the maximum.
        let d = b.delay_at(at);
        assert!(d >= MAX / 2, "{d:?}");
        at += d;
        // Healthy for a while after the last attempt: from the minimum.
        let d = b.delay_at(at + HEALTHY);
        assert!(d <= MIN, "{d:?}");
        // And growing again.
        let d = b.delay_at(at + HEALTHY + d);
        assert!(d >= MIN && d <= 2 * MIN, "{d:?}");
        b.reset();
        assert!(b.delay_at(at) <= MIN);
    }
}
