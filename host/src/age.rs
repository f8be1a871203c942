//! Ages as kubectl prints them in its `AGE` columns (`5s`, `3m2s`, `4h`,
//! `2d3h`): about two to three significant figures, coarser as the age
//! grows, so that a column of them reads at a glance and means the same as
//! in `kubectl get`.
//!
//! The rules are those of apimachinery's `duration.HumanDuration`
//! (k8s.io/apimachinery/pkg/util/duration), which kubectl's printers use; the
//! tests below hold each boundary. A moment up to a second in the future
//! (clocks of two machines differ) is `0s`; further is `<invalid>`, as
//! kubectl says.

use std::time::Duration;

const MINUTE: i64 = 60;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;
const YEAR: i64 = 365 * DAY;

/// The age of something that happened `seconds` ago (negative: in the
/// future), whole seconds, as kubectl prints it.
pub fn human_seconds(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 2 * MINUTE {
        return format!("{seconds}s");
    }
    let minutes = seconds / MINUTE;
    if minutes < 10 {
        return with_rest(minutes, "m", seconds % MINUTE, "s");
    }
    if minutes < 3 * 60 {
        return format!("{minutes}m");
    }
    let hours = seconds / HOUR;
    if hours < 8 {
        return with_rest(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = seconds / DAY;
    if hours < 24 * 8 {
        return with_rest(days, "d", hours % 24, "h");
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    let years = seconds / YEAR;
    if days < 365 * 8 {
        return with_rest(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

/// [`human_seconds`] of a [`Duration`] (never negative).
pub fn human(age: Duration) -> String {
    human_seconds(i64::try_from(age.as_secs()).unwrap_or(i64::MAX))
}

/// `5m` when the rest is zero, else `5m3s`.
fn with_rest(whole: i64, unit: &str, rest: i64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{whole}{unit}")
    } else {
        format!("{whole}{unit}{rest}{rest_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each boundary of kubectl's rules, on both sides.
    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let m = MINUTE;
        let h = HOUR;
        let d = DAY;
        let y = YEAR;
        for (seconds, expected) in [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (59, "59s"),
            (60, "60s"),
            (2 * m - 1, "119s"),
            (2 * m, "2m"),
            (3 * m + 2, "3m2s"),
            (10 * m - 1, "9m59s"),
            (10 * m, "10m"),
            (10 * m + 59, "10m"),
            (3 * h - 1, "179m"),
            (3 * h, "3h"),
            (4 * h, "4h"),
            (4 * h + 30 * m + 59, "4h30m"),
            (8 * h - 1, "7h59m"),
            (8 * h, "8h"),
            (48 * h - 1, "47h"),
            (48 * h, "2d"),
            (2 * d + 3 * h, "2d3h"),
            (8 * d - 1, "7d23h"),
            (8 * d, "8d"),
            (2 * y - 1, "729d"),
            (2 * y, "2y"),
            (2 * y + 5 * d, "2y5d"),
            (8 * y - 1, "7y364d"),
            (8 * y, "8y"),
            (100 * y, "100y"),
        ] {
            assert_eq!(human_seconds(seconds), expected, "{seconds} s");
        }
        assert_eq!(human(Duration::from_millis(5_999)), "5s");
        assert_eq!(human(Duration::MAX), format!("{}y", i64::MAX / YEAR));
    }
}
