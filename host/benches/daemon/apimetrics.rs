//! The API server's own metrics (Prometheus text): the requests a daemon
//! made, by resource and verb, and its open watches.

use std::collections::BTreeMap;

/// One sample of the Prometheus text format.
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(parse_sample)
        .collect()
}

pub fn parse_sample(line: &str) -> Option<Sample> {
    let (name, mut rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some(Sample {
                name: name.to_string(),
                labels: BTreeMap::new(),
                value: value.split_whitespace().next()?.parse().ok()?,
            });
        }
    };
    let mut labels = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            rest = after;
            break;
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.to_string(), value);
        rest = &after[end + 1..];
    }
    Some(Sample {
        name: name.to_string(),
        labels,
        value: rest.split_whitespace().next()?.parse().ok()?,
    })
}

/// apiserver_request_total for these resources, by (resource, verb).
pub fn requests_of(samples: &[Sample], resources: &[&str]) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for s in samples {
        if s.name == "apiserver_request_total" && resources.contains(&s.label("resource")) {
            *out.entry((s.label("resource").to_string(), s.label("verb").to_string()))
                .or_default() += s.value;
        }
    }
    out
}

pub fn request_delta(before: &[Sample], after: &[Sample]) -> BTreeMap<(String, String), f64> {
    request_delta_of(before, after, &["podtemplates", "nodes"])
}

/// What [`requests_of`] counted between `before` and `after`.
pub fn request_delta_of(
    before: &[Sample],
    after: &[Sample],
    resources: &[&str],
) -> BTreeMap<(String, String), f64> {
    let before = requests_of(before, resources);
    requests_of(after, resources)
        .into_iter()
        .map(|(key, n)| {
            let d = n - before.get(&key).copied().unwrap_or(0.0);
            (key, d)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

pub fn print_requests(before: &[Sample], after: &[Sample], indent: &str) {
    let delta = request_delta(before, after);
    if delta.is_empty() {
        println!("{indent}(none counted)");
    }
    for ((resource, verb), n) in delta {
        println!("{indent}{resource:<13} {verb:<6} {n}");
    }
    println!(
        "{indent}(a WATCH is counted when it ends; open ones are in apiserver_longrunning_requests)"
    );
}
