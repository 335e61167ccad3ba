//! The dashboard page: per workflow and per queue, the figures of `GET /api/v1/stats/minutes`
//! as totals and line charts drawn here as SVG (no script draws them, so the page's CSP stays
//! as strict as the others'). Pure.

use std::fmt::Write as _;

use starbridge_api::{MinuteStats, MinuteView, SeriesView};

use super::html::{Esc, duration};
use super::pages::Ns;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 150.0;
/// Room left of the plot for the scale, and below it for the time labels.
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 20.0;
const TOP: f64 = 22.0;

/// One line of a chart: a value per minute of the window, `None` where there is none.
struct Line {
    label: &'static str,
    class: &'static str,
    points: Vec<Option<f64>>,
}

/// How a chart's values are written on its scale.
#[derive(Clone, Copy)]
enum Unit {
    Count,
    Millis,
}

impl Unit {
    fn format(self, value: f64) -> String {
        match self {
            Unit::Count => format!("{value:.0}"),
            Unit::Millis => duration(value as i64),
        }
    }
}

/// The page's body for the answer `stats` over `minutes` minutes.
pub(crate) fn dashboard(ns: &Ns, stats: &MinuteStats, minutes: usize) -> String {
    let mut out = String::from("<h1>Dashboard</h1>");
    let mut windows = String::new();
    for (window, label) in [("1h", "last hour"), ("1d", "last day")] {
        let current = if stats.window == window {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(
            windows,
            r#" <a href="{}"{current}>{label}</a>"#,
            Esc(&ns.href("/ui/dashboard", &[("window", window)]))
        );
    }
    let _ = write!(
        out,
        r#"<p class="window">Per minute, over the{windows}. Counted a few seconds after the fact.</p>"#
    );
    // The page re-reads itself: this part is swapped in when it changed.
    out.push_str(r#"<div id="dashboard" data-live>"#);
    if stats.workflows.is_empty() && stats.queues.is_empty() {
        out.push_str(
            r#"<p class="empty">No figures in this window yet: jobs are counted a few seconds after they start and end.</p>"#,
        );
    }
    let from = stats.from.as_millisecond();
    for (kind, series) in [("workflow", &stats.workflows), ("queue", &stats.queues)] {
        for one in series.iter() {
            out.push_str(&section(kind, one, from, minutes));
        }
    }
    out.push_str("</div>");
    out
}

fn section(kind: &str, series: &SeriesView, from: i64, minutes: usize) -> String {
    // `absent`: what a minute without figures shows. Counts are 0 then, and so are a queue's
    // samples (an empty queue writes none); percentiles have no value.
    let values = |pick: &dyn Fn(&MinuteView) -> Option<f64>, absent: Option<f64>| {
        let mut points = vec![absent; minutes];
        for minute in &series.minutes {
            let index = (minute.minute.as_millisecond() - from) / 60_000;
            if let Some(slot) = usize::try_from(index).ok().and_then(|i| points.get_mut(i)) {
                *slot = pick(minute).or(absent);
            }
        }
        points
    };
    let counts = chart(
        "per minute",
        Unit::Count,
        &[
            Line {
                label: "started",
                class: "started",
                points: values(&|m| Some(m.started as f64), Some(0.0)),
            },
            Line {
                label: "succeeded",
                class: "succeeded",
                points: values(&|m| Some(m.succeeded as f64), Some(0.0)),
            },
            Line {
                label: "failed",
                class: "failed",
                points: values(&|m| Some(m.failed as f64), Some(0.0)),
            },
        ],
    );
    let durations = chart(
        "duration",
        Unit::Millis,
        &[
            Line {
                label: "p50",
                class: "p50",
                points: values(&|m| m.p50_ms.map(|v| v as f64), None),
            },
            Line {
                label: "p95",
                class: "p95",
                points: values(&|m| m.p95_ms.map(|v| v as f64), None),
            },
        ],
    );
    let totals = &series.totals;
    let ms = |value: Option<u64>| value.map_or("–".to_owned(), |v| duration(v as i64));
    let mut out = format!(
        r#"<section class="series" data-kind="{kind}" data-name="{name}"><h2>{kind} {name}</h2><table class="totals"><thead><tr><th>started</th><th>succeeded</th><th>failed</th><th>p50</th><th>p95</th>"#,
        name = Esc(&series.name),
    );
    let queue = kind == "queue";
    if queue {
        out.push_str("<th>most ready</th><th>longest wait</th>");
    }
    let _ = write!(
        out,
        r#"</tr></thead><tbody><tr><td class="started">{}</td><td class="succeeded">{}</td><td class="failed">{}</td><td class="p50">{}</td><td class="p95">{}</td>"#,
        totals.started,
        totals.succeeded,
        totals.failed,
        ms(totals.p50_ms),
        ms(totals.p95_ms),
    );
    if queue {
        let _ = write!(
            out,
            r#"<td class="depth">{}</td><td class="wait">{}</td>"#,
            totals.depth.map_or("–".to_owned(), |v| v.to_string()),
            ms(totals.oldest_wait_ms),
        );
    }
    out.push_str("</tr></tbody></table><div class=\"charts\">");
    out.push_str(&counts);
    out.push_str(&durations);
    if queue {
        out.push_str(&chart(
            "ready tasks",
            Unit::Count,
            &[Line {
                label: "depth",
                class: "depth",
                points: values(&|m| m.depth.map(|v| v as f64), Some(0.0)),
            }],
        ));
        out.push_str(&chart(
            "oldest wait",
            Unit::Millis,
            &[Line {
                label: "oldest wait",
                class: "wait",
                points: values(&|m| m.oldest_wait_ms.map(|v| v as f64), Some(0.0)),
            }],
        ));
    }
    out.push_str("</div></section>");
    out
}

/// A line chart of `lines` over the window, scaled to the largest value; a gap where a line
/// has no value.
fn chart(title: &str, unit: Unit, lines: &[Line]) -> String {
    let top = lines
        .iter()
        .flat_map(|line| line.points.iter().flatten())
        .fold(0.0_f64, |max, value| max.max(*value));
    let scale = if top > 0.0 { top } else { 1.0 };
    let count = lines.first().map_or(0, |line| line.points.len()).max(2);
    let plot_width = WIDTH - LEFT - 8.0;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |index: usize| LEFT + plot_width * index as f64 / (count - 1) as f64;
    let y = |value: f64| TOP + plot_height * (1.0 - value / scale);
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="sb-chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{title}"><style>.axis{{stroke:#adb5bd;stroke-width:1}}path.line{{fill:none;stroke-width:1.5}}.started{{stroke:#1c7ed6;fill:#1c7ed6}}.succeeded{{stroke:#2f9e44;fill:#2f9e44}}.failed{{stroke:#e03131;fill:#e03131}}.p50{{stroke:#1c7ed6;fill:#1c7ed6}}.p95{{stroke:#f08c00;fill:#f08c00}}.depth{{stroke:#7048e8;fill:#7048e8}}.wait{{stroke:#f08c00;fill:#f08c00}}text{{font:11px sans-serif;fill:#495057;stroke:none}}</style><title>{title}</title>"##,
        title = Esc(title),
    );
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}"/><line class="axis" x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}"/><text x="{tx}" y="{ty}" text-anchor="end" class="scale">{max}</text><text x="{tx}" y="{b}" text-anchor="end">0</text><text x="{LEFT}" y="{lb}">-{span}m</text><text x="{r}" y="{lb}" text-anchor="end">now</text>"#,
        b = TOP + plot_height,
        r = LEFT + plot_width,
        tx = LEFT - 4.0,
        ty = TOP + 4.0,
        lb = HEIGHT - 4.0,
        max = Esc(&unit.format(top)),
        span = count - 1,
    );
    let mut legend_x = LEFT;
    for line in lines {
        // Runs of minutes with a value; a run of one minute is drawn as a dot.
        let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut pen_down = false;
        for (index, value) in line.points.iter().enumerate() {
            match value {
                Some(value) if pen_down => {
                    if let Some(run) = runs.last_mut() {
                        run.push((x(index), y(*value)));
                    }
                }
                Some(value) => {
                    runs.push(vec![(x(index), y(*value))]);
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        let mut path = String::new();
        let mut dots = String::new();
        for run in &runs {
            for (index, (px, py)) in run.iter().enumerate() {
                let verb = if index == 0 { 'M' } else { 'L' };
                let _ = write!(path, "{verb}{px:.1} {py:.1}");
            }
            if let [(px, py)] = run[..] {
                let _ = write!(
                    dots,
                    r#"<circle class="{}" cx="{px:.1}" cy="{py:.1}" r="2.5"/>"#,
                    line.class
                );
            }
        }
        out.push_str(&dots);
        let _ = write!(
            out,
            r#"<path class="line {class}" data-series="{label}" d="{path}"/><rect class="{class}" x="{legend_x}" y="6" width="10" height="3"/><text x="{tx}" y="11">{label}</text>"#,
            class = line.class,
            label = line.label,
            tx = legend_x + 14.0,
        );
        legend_x += 14.0 + 8.0 * line.label.len() as f64 + 12.0;
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_each_line_with_gaps_and_scales_to_the_largest_value() {
        let svg = chart(
            "duration",
            Unit::Millis,
            &[Line {
                label: "p50",
                class: "p50",
                points: vec![Some(100.0), None, Some(2_500.0), Some(50.0)],
            }],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert!(svg.contains(r#"class="scale">2.5s</text>"#), "{svg}");
        let path = svg.split(r#"d=""#).nth(1).unwrap();
        let path = &path[..path.find('"').unwrap()];
        assert_eq!(path.matches('M').count(), 2, "a gap lifts the pen: {path}");
        assert_eq!(path.matches('L').count(), 1, "{path}");
        assert_eq!(
            svg.matches("<circle").count(),
            1,
            "the lone first minute is a dot: {svg}"
        );
        assert!(
            path.contains(&format!("{:.1}", TOP)),
            "the largest value is at the top: {path}"
        );
    }

    #[test]
    fn a_chart_of_nothing_still_draws_its_axes() {
        let svg = chart(
            "per minute",
            Unit::Count,
            &[Line {
                label: "started",
                class: "started",
                points: vec![Some(0.0); 60],
            }],
        );
        assert!(svg.contains(r#"class="scale">0</text>"#), "{svg}");
        assert!(svg.contains("-59m"), "{svg}");
    }
}
