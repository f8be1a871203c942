//! Latency samples and how figures are printed: percentiles by nearest
//! rank over what arrived, lost updates counted apart.

use std::time::Duration;

/// Latencies, and the updates that never arrived or could not be sent.
#[derive(Default)]
pub struct Samples {
    pub took: Vec<Duration>,
    pub lost: usize,
    pub errors: Vec<String>,
}

impl Samples {
    pub fn push(&mut self, took: Option<Duration>) {
        match took {
            Some(d) => self.took.push(d),
            None => self.lost += 1,
        }
    }

    /// Nearest-rank percentile of the arrived ones.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.took.clone();
        sorted.sort();
        let n = sorted.len();
        (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
    }

    pub fn row(&self, name: &str) {
        let p = |q| self.percentile(q).map_or("-".into(), ms);
        let mean = (!self.took.is_empty())
            .then(|| self.took.iter().sum::<Duration>() / self.took.len() as u32);
        println!(
            "  {name:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            p(0.5),
            p(0.9),
            p(0.99),
            p(1.0),
            mean.map_or("-".into(), ms),
            format!(
                "{}/{}",
                self.lost + self.errors.len(),
                self.took.len() + self.lost + self.errors.len()
            )
        );
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub fn verdict(met: bool) -> &'static str {
    if met { "target met" } else { "not met" }
}
