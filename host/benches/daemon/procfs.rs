//! A process's RSS and CPU time from /proc, sampled over a window.

use std::fs;
use std::time::{Duration, Instant};

/// A `kVALUE` line of /proc/PID/status, in KiB.
pub fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The fields of /proc/PID/stat after the command name.
pub fn proc_stat(pid: u32) -> Option<Vec<u64>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    // Field 3 (state) is a letter; keep the numbering by putting 0 there.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// utime + stime (+ cutime + cstime: children waited for) in clock ticks.
pub fn proc_ticks(pid: u32, children: bool) -> Option<u64> {
    let f = proc_stat(pid)?;
    // Fields 14..=17 of stat, counted from 3 here.
    let (utime, stime, cutime, cstime) = (f[11], f[12], f[13], f[14]);
    Some(utime + stime + if children { cutime + cstime } else { 0 })
}

/// The RSS of the children of `pid` (podstamp's pod check helper), in KiB,
/// and how many there are.
pub fn children_rss_kib(pid: u32) -> (u64, usize) {
    let children = children(pid);
    let rss = children
        .iter()
        .filter_map(|&c| proc_status_kib(c, "VmRSS"))
        .sum();
    (rss, children.len())
}

/// The pids of the children of `pid`, from every thread of it.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The CPU time (utime + stime, clock ticks) of the children of `pid` so
/// far: the pod check helper's work, its start included.
pub fn children_ticks(pid: u32) -> u64 {
    children(pid)
        .iter()
        .filter_map(|&c| proc_ticks(c, false))
        .sum()
}

/// The RSS of every process in process group `pgid`, in KiB.
pub fn group_rss_kib(pgid: u32) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|f| f.get(2) == Some(&u64::from(pgid))))
        .filter_map(|pid| proc_status_kib(pid, "VmRSS"))
        .sum()
}

pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// The CPU ticks `ticks` counts over `window`, and the peak of `rss`,
/// sampled every 100 ms.
pub fn observe(
    window: Duration,
    ticks: impl Fn() -> Option<u64>,
    rss: impl Fn() -> u64,
) -> (Option<u64>, u64) {
    let start = ticks();
    let end = Instant::now() + window;
    let mut peak = 0;
    while Instant::now() < end {
        peak = peak.max(rss());
        std::thread::sleep(Duration::from_millis(100));
    }
    (start.zip(ticks()).map(|(a, b)| b.saturating_sub(a)), peak)
}

/// The resident KiB of `pid` by what is mapped (/proc/PID/smaps): the
/// executable's own file, other files, `[heap]`, `[stack]`, and anonymous
/// mappings apart; largest first. Says where an RSS figure lives.
pub fn rss_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let exe = fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut sums: std::collections::BTreeMap<String, u64> = Default::default();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(kib) = line.strip_prefix("Rss:") {
            let kib: u64 = kib
                .split_whitespace()
                .next()
                .and_then(|k| k.parse().ok())
                .unwrap_or(0);
            *sums.entry(current.clone()).or_default() += kib;
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-'))
        {
            // A mapping's header: "start-end perms offset dev inode [path]".
            let path = line.split_whitespace().nth(5).unwrap_or("");
            current = if path.is_empty() {
                "anonymous".into()
            } else if path == exe {
                "the executable".into()
            } else if path.starts_with('[') {
                path.into()
            } else {
                "other files".into()
            };
        }
    }
    let mut sums: Vec<_> = sums.into_iter().filter(|(_, k)| *k > 0).collect();
    sums.sort_by_key(|s| std::cmp::Reverse(s.1));
    sums
}
