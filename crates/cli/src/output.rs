//! Human output: aligned tables and short times. Data goes to stdout, diagnostics to stderr.

use starbridge_api::Timestamp;

/// Prints rows under a header, each column as wide as its widest cell.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(index) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let render = |cells: Vec<String>| {
        let line: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(index, cell)| {
                let width = widths.get(index).copied().unwrap_or(0);
                format!("{cell:<width$}")
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    };
    render(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        render(row.clone());
    }
}

/// `2026-11-22 10:04:05` in UTC, or `-`.
pub(crate) fn time(ts: Option<Timestamp>) -> String {
    ts.map(|ts| ts.strftime("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

/// Seconds between two times with millisecond precision, or `-`.
pub(crate) fn elapsed(from: Option<Timestamp>, to: Option<Timestamp>) -> String {
    match (from, to) {
        (Some(from), Some(to)) => {
            let millis = to.as_millisecond() - from.as_millisecond();
            format!("{:.3}s", millis as f64 / 1000.0)
        }
        _ => "-".to_owned(),
    }
}

/// Shortens long text for a table cell.
pub(crate) fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}
