//! `starbridge top`: the dashboard's figures in the terminal, per workflow and per queue,
//! redrawn every few seconds (or printed once with `--once`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use starbridge_api::{MinuteStats, MinuteStatsQuery, MinuteView, SeriesView};

use crate::client::Context;
use crate::output::table;

#[derive(Args)]
pub(crate) struct TopArgs {
    /// How far back the totals go: `1h` or `1d`.
    #[arg(long, default_value = "1h")]
    window: String,
    /// Only this workflow (and no queue unless `--queue` is given too).
    #[arg(long)]
    workflow: Option<String>,
    /// Only this queue (and no workflow unless `--workflow` is given too).
    #[arg(long)]
    queue: Option<String>,
    /// Print one snapshot and exit.
    #[arg(long)]
    once: bool,
    /// Seconds between redraws.
    #[arg(long, default_value_t = 2)]
    interval: u64,
}

pub(crate) async fn top(context: &Context, args: &TopArgs) -> Result<ExitCode> {
    let query = MinuteStatsQuery {
        namespace: None,
        window: Some(args.window.clone()),
        workflow: args.workflow.clone(),
        queue: args.queue.clone(),
    };
    loop {
        let stats = context.client.minute_stats(&query).await?;
        if args.once {
            return crate::client::show(context, &stats, draw);
        }
        // Clear the screen and go home, then draw the frame.
        print!("\x1b[H\x1b[2J");
        draw(&stats);
        tokio::time::sleep(Duration::from_secs(args.interval.max(1))).await;
    }
}

fn draw(stats: &MinuteStats) {
    println!(
        "starbridge top: window {} from {} (last minute in brackets)",
        stats.window,
        crate::output::time(Some(stats.from))
    );
    println!();
    table(
        &header("WORKFLOW", &[]),
        &rows(&stats.workflows, stats, false),
    );
    println!();
    let header = header("QUEUE", &["READY", "OLDEST WAIT"]);
    table(&header, &rows(&stats.queues, stats, true));
}

/// The columns of a table of series: the name's, the figures', then `extra`.
fn header<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let figures = [
        "STARTED",
        "SUCCEEDED",
        "FAILED",
        "P50",
        "P95",
        "LAST MINUTE",
    ];
    [name]
        .into_iter()
        .chain(figures)
        .chain(extra.iter().copied())
        .collect()
}

fn rows(series: &[SeriesView], stats: &MinuteStats, queue: bool) -> Vec<Vec<String>> {
    series
        .iter()
        .map(|one| {
            let totals = &one.totals;
            let last = one
                .minutes
                .last()
                .filter(|minute| minute.minute == stats.to);
            let mut row = vec![
                one.name.clone(),
                totals.started.to_string(),
                totals.succeeded.to_string(),
                totals.failed.to_string(),
                millis(totals.p50_ms),
                millis(totals.p95_ms),
                last.map_or("-".to_owned(), last_minute),
            ];
            if queue {
                let sampled = one
                    .minutes
                    .iter()
                    .rev()
                    .find(|minute| minute.depth.is_some());
                row.push(
                    sampled
                        .and_then(|minute| minute.depth)
                        .map_or("-".to_owned(), |depth| depth.to_string()),
                );
                row.push(millis(sampled.and_then(|minute| minute.oldest_wait_ms)));
            }
            row
        })
        .collect()
}

/// `started/succeeded/failed` of one minute.
fn last_minute(minute: &MinuteView) -> String {
    format!("{}/{}/{}", minute.started, minute.succeeded, minute.failed)
}

fn millis(value: Option<u64>) -> String {
    value.map_or("-".to_owned(), |millis| format!("{millis}ms"))
}
