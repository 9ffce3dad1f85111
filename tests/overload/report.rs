//! From a run's outcome to a row of the report, and the checks of the done-when criteria.

use std::fmt::Write;

use crate::scenarios::Scenario;
use crate::sim::{Outcome, LIMIT_SAMPLES, MS, SECOND};

/// The chart's width in columns.
const CHART: usize = 40;
/// After an overload ends, the limit has this long to stop shedding (the "sticks" check).
pub const RECOVERY: u64 = 3 * SECOND;

pub struct Row {
    pub protection: String,
    pub p50: u64,
    pub p99: u64,
    /// p99 of the latencies an unloaded server would have given (the reference).
    pub unloaded_p99: u64,
    /// Completions within the deadline over what could have completed.
    pub goodput: f64,
    pub shed_rate: [f64; 2],
    pub chart: String,
    pub limit_range: (u32, u32),
    /// From the scenario's `settle` on: p50, p99, unloaded p50 and p99.
    pub settled: Option<[u64; 4]>,
    /// Failed done-when checks, in words.
    pub failures: Vec<String>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sparkline(samples: &[u32]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if samples.is_empty() {
        return "-".into();
    }
    let per = samples.len().div_ceil(CHART);
    let columns: Vec<f64> = samples
        .chunks(per)
        .map(|c| c.iter().map(|&v| f64::from(v)).sum::<f64>() / c.len() as f64)
        .collect();
    let (lo, hi) = columns
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    columns
        .iter()
        .map(|&v| {
            let at = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            BARS[((at * 7.0).round() as usize).min(7)]
        })
        .collect()
}

/// The mean limit between `from` and `to` (nanoseconds) of a run of `duration`.
fn mean_limit(limit: &[u32], duration: u64, from: u64, to: u64) -> f64 {
    let at = |t: u64| ((t as f64 / duration as f64) * LIMIT_SAMPLES as f64) as usize;
    let slice = &limit[at(from).min(limit.len())..at(to).min(limit.len())];
    slice.iter().map(|&v| f64::from(v)).sum::<f64>() / slice.len().max(1) as f64
}

pub fn row(scenario: &Scenario, protection: String, mut out: Outcome, checked: bool) -> Row {
    out.latencies.sort_unstable();
    out.intrinsic.sort_unstable();
    let unloaded_p99 = percentile(&out.intrinsic, 0.99);
    let deadline = 2 * unloaded_p99;
    let good = out.latencies.iter().filter(|&&l| l <= deadline).count();
    let goodput = good as f64 / scenario.achievable();
    let shed_rate = [0, 1].map(|p| out.shed[p] as f64 / out.arrivals[p].max(1) as f64);
    let p99 = percentile(&out.latencies, 0.99);
    out.settled.sort_unstable();
    out.settled_intrinsic.sort_unstable();
    let settled = scenario.settle.map(|_| {
        [
            percentile(&out.settled, 0.5),
            percentile(&out.settled, 0.99),
            percentile(&out.settled_intrinsic, 0.5),
            percentile(&out.settled_intrinsic, 0.99),
        ]
    });
    let mut failures = Vec::new();
    if checked {
        if p99 > 2 * unloaded_p99 {
            failures.push(format!(
                "p99 {} ms > 2 × unloaded {} ms",
                p99 / MS,
                unloaded_p99 / MS
            ));
        }
        if let (Some(from), Some(settled)) = (scenario.settle, settled) {
            // The median too: a standing queue of a few service times hides in a p99 of 2.8.
            for (name, got, unloaded) in [
                ("p50", settled[0], settled[2]),
                ("p99", settled[1], settled[3]),
            ] {
                if got > 2 * unloaded {
                    failures.push(format!(
                        "from {} s, {name} {:.1} ms > 2 × unloaded {:.1} ms",
                        from / SECOND,
                        got as f64 / MS as f64,
                        unloaded as f64 / MS as f64
                    ));
                }
            }
        }
        match scenario.known_shortfall {
            Some((floor, _)) if goodput < floor => {
                failures.push(format!(
                    "goodput {:.0} % < the known floor",
                    goodput * 100.0
                ));
            }
            Some(_) => {}
            None if goodput < 0.9 => {
                failures.push(format!("goodput {:.0} % < 90 %", goodput * 100.0));
            }
            None => {}
        }
        if let Some((from, to)) = scenario.overload {
            let third = (to - from) / 3;
            let middle = mean_limit(&out.limit, scenario.duration, from + third, to - third);
            let last = mean_limit(&out.limit, scenario.duration, to - third, to);
            // Two requests of slack: a limit of 5 to 10 moves by whole requests.
            if last > 1.25 * middle + 2.0 {
                failures.push(format!("limit drifts up: {middle:.0} then {last:.0}"));
            }
            if scenario.slow_share == 0.0 {
                let ideal = f64::from(scenario.ideal(scenario.phase(to - 1)));
                if last > 2.0 * ideal {
                    failures.push(format!("limit {last:.0} above 2 × the useful {ideal}"));
                }
            }
            let tenth = (to + RECOVERY) / (SECOND / 10);
            if to < scenario.duration && out.shed_at.iter().any(|&t| t >= tenth) {
                failures.push(format!(
                    "limit sticks: sheds {} s after the overload",
                    RECOVERY / SECOND
                ));
            }
        }
    }
    Row {
        protection,
        p50: percentile(&out.latencies, 0.5),
        p99,
        unloaded_p99,
        goodput,
        shed_rate,
        limit_range: (
            out.limit.iter().copied().min().unwrap_or(0),
            out.limit.iter().copied().max().unwrap_or(0),
        ),
        chart: sparkline(&out.limit),
        settled,
        failures,
    }
}

fn ms(nanos: u64) -> String {
    format!("{:.0}", nanos as f64 / MS as f64)
}

/// The report's section of one scenario.
pub fn section(report: &mut String, scenario: &Scenario, rows: &[Row]) {
    let _ = writeln!(report, "## {}\n\n{}.\n", scenario.name, scenario.what);
    let _ = writeln!(
        report,
        "| protection | goodput | p50 ms | p99 ms | p99 / unloaded | shed paid | shed free | limit (min–max over the run) |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let limit = if r.limit_range.1 == 0 {
            "-".to_string()
        } else {
            format!("`{}` {}–{}", r.chart, r.limit_range.0, r.limit_range.1)
        };
        let _ = writeln!(
            report,
            "| {} | {:.0} % | {} | {} | {:.2} | {:.1} % | {:.1} % | {} |",
            r.protection,
            r.goodput * 100.0,
            ms(r.p50),
            ms(r.p99),
            r.p99 as f64 / r.unloaded_p99.max(1) as f64,
            r.shed_rate[0] * 100.0,
            r.shed_rate[1] * 100.0,
            limit,
        );
    }
    let _ = writeln!(report);
    if let Some(from) = scenario.settle {
        let _ = writeln!(
            report,
            "From {} s (requests admitted then), p50 · p99 and their ratio to the unloaded ones \
             ({}):\n",
            from / SECOND,
            rows.first()
                .and_then(|r| r.settled)
                .map_or("-".into(), |s| format!(
                    "{:.1} ms · {:.1} ms",
                    s[2] as f64 / MS as f64,
                    s[3] as f64 / MS as f64
                )),
        );
        for r in rows {
            if let Some(s) = r.settled {
                let _ = writeln!(
                    report,
                    "* {}: {:.1} ms · {:.1} ms ({:.2} · {:.2})",
                    r.protection,
                    s[0] as f64 / MS as f64,
                    s[1] as f64 / MS as f64,
                    s[0] as f64 / s[2].max(1) as f64,
                    s[1] as f64 / s[3].max(1) as f64
                );
            }
        }
        let _ = writeln!(report);
    }
}
