//! Whether the database takes writes, as `/healthz` reports it. A database that answers reads
//! may still refuse every write (a full disk, a filesystem remounted read-only, a read-only
//! PostgreSQL), so health is judged by writes.
//!
//! The writer records the outcome of each group transaction (one atomic store per commit, see
//! `LastWrite`). Health answers from it: a write that succeeded in the last `HEALTHY_WRITE_AGE`
//! means ok; a write that failed in the last `FAULT_REUSE` gives its fault. Otherwise (nothing
//! written lately, or the last failure is older) health makes a probe write, one row changed in
//! place (`health_probe`), through the writer like any request, and answers from its outcome.
//! So health turns ok again by itself once the fault is gone, without waiting for traffic.
//!
//! Health must not add load when it is asked often: at most one probe is in flight per store,
//! callers that waited for it answer from its outcome, a failed outcome answers for
//! `FAULT_REUSE`, and a successful one for `HEALTHY_WRITE_AGE`. While traffic flows no probe
//! is made at all. Reads still count: a database that cannot be read is unavailable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration as StdDuration;

use starbridge_core::time::Timestamp;

use crate::{Engine, Error};
use starbridge_store::fault::WriteFault;
use starbridge_store::rows;

/// A write that succeeded this recently makes the database healthy without a probe.
pub const HEALTHY_WRITE_AGE: StdDuration = StdDuration::from_secs(10);

/// A write that failed this recently gives health its answer without a probe: health asked
/// many times in a row probes at most once per this while the fault lasts.
const FAULT_REUSE: StdDuration = StdDuration::from_secs(1);

/// Longest a probe write may take before health calls writes stuck.
const PROBE_TIMEOUT: StdDuration = StdDuration::from_secs(5);

/// What `/healthz` reports about the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// `None`: the database is read and written.
    pub fault: Option<WriteFault>,
    /// What the answer rests on, for an operator (no database internals: they are logged).
    pub detail: String,
}

impl Health {
    fn ok(detail: String) -> Health {
        Health {
            fault: None,
            detail,
        }
    }

    fn faulty(fault: WriteFault, what_failed: &str) -> Health {
        Health {
            fault: Some(fault),
            detail: format!(
                "{}: {what_failed}; writes are refused (nothing is changed) {}",
                fault.explain(),
                until(fault)
            ),
        }
    }
}

/// Until when writes are refused.
fn until(fault: WriteFault) -> &'static str {
    match fault {
        WriteFault::Full => "until space is freed on it",
        WriteFault::ReadOnly => "until it is writable again",
        WriteFault::Unavailable => "until it is back",
    }
}

/// Milliseconds as seconds for a person: `0.3 s`.
fn seconds(millis: i64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let seconds = millis as f64 / 1000.0;
    format!("{seconds:.1} s")
}

fn millis(duration: StdDuration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The outcome of the writer's last group transaction: when it ended (the store's clock) and its
/// fault, if it failed. One word, stored once per transaction.
#[derive(Debug, Default)]
pub(crate) struct LastWrite {
    /// 0 before the first transaction; else `at_millis << 3 | PRESENT | fault code`.
    packed: AtomicU64,
}

const PRESENT: u64 = 0b100;

fn fault_code(fault: Option<WriteFault>) -> u64 {
    match fault {
        None => 0,
        Some(WriteFault::Full) => 1,
        Some(WriteFault::ReadOnly) => 2,
        Some(WriteFault::Unavailable) => 3,
    }
}

fn fault_of(code: u64) -> Option<WriteFault> {
    match code & 0b11 {
        0 => None,
        1 => Some(WriteFault::Full),
        2 => Some(WriteFault::ReadOnly),
        _ => Some(WriteFault::Unavailable),
    }
}

impl LastWrite {
    /// Records that a write ended at `at`, failing with `fault` or succeeding (`None`).
    pub(crate) fn record(&self, at: Timestamp, fault: Option<WriteFault>) {
        let at = u64::try_from(at.0).unwrap_or(0) & (u64::MAX >> 3);
        self.packed
            .store((at << 3) | PRESENT | fault_code(fault), Ordering::Relaxed);
    }

    /// When the last write ended and how, if there was one.
    pub(crate) fn get(&self) -> Option<(Timestamp, Option<WriteFault>)> {
        let packed = self.packed.load(Ordering::Relaxed);
        if packed & PRESENT == 0 {
            return None;
        }
        let at = i64::try_from(packed >> 3).unwrap_or(i64::MAX);
        Some((Timestamp(at), fault_of(packed)))
    }
}

impl Engine {
    /// Whether the database is read and written now (see the module's documentation): at most
    /// one read, and a probe write only when no write succeeded in the last
    /// `HEALTHY_WRITE_AGE`.
    pub async fn health(&self) -> Health {
        if let Err(error) = self.ping().await {
            tracing::warn!(%error, "health: the database cannot be read");
            let fault = error.write_fault().unwrap_or(WriteFault::Unavailable);
            return Health::faulty(fault, "reads fail");
        }
        let why = match self.health_from_last_write() {
            Ok(health) => return health,
            Err(why) => why,
        };
        match tokio::time::timeout(PROBE_TIMEOUT, self.probe()).await {
            Ok(health) => health,
            Err(_) => Health::faulty(
                WriteFault::Unavailable,
                &format!(
                    "{why}, and a probe write did not end within {}",
                    seconds(millis(PROBE_TIMEOUT))
                ),
            ),
        }
    }

    /// Health as the last write tells it, if it is recent enough to; else why a probe is due.
    fn health_from_last_write(&self) -> Result<Health, String> {
        let Some((at, fault)) = self.inner.last_write.get() else {
            return Err("nothing was written since the server started".to_owned());
        };
        let age = self.inner.clock.now().0.saturating_sub(at.0);
        if age < 0 {
            // The system clock went back: how long ago is unknown.
            return Err("the clock was set back since the last write".to_owned());
        }
        match fault {
            None if age < millis(HEALTHY_WRITE_AGE) => Ok(Health::ok(format!(
                "writes succeed: the last one {} ago",
                seconds(age)
            ))),
            Some(fault) if age < millis(FAULT_REUSE) => Ok(Health::faulty(
                fault,
                &format!("the last write failed {} ago", seconds(age)),
            )),
            None => Err(format!("the last write succeeded {} ago", seconds(age))),
            Some(_) => Err(format!("the last write failed {} ago", seconds(age))),
        }
    }

    /// Makes a probe write (one at a time) and answers from its outcome; a caller that waited
    /// for another's probe answers from that one.
    async fn probe(&self) -> Health {
        let probing = self.inner.probing.clone().lock_owned().await;
        let why = match self.health_from_last_write() {
            Ok(health) => return health,
            Err(why) => why,
        };
        let writer = self.inner.writer.clone();
        // The probe holds the lock until the writer answers it, even if this caller stops
        // waiting: a stuck writer gets one probe, not one per health check.
        let probe = tokio::spawn(async move {
            let outcome = writer
                .write(|ctx| rows::write_health_probe(ctx.conn, ctx.now))
                .await;
            drop(probing);
            outcome
        });
        let error = match probe.await {
            Ok(Ok(())) => {
                return Health::ok(format!("writes succeed: {why}, and a probe write just did"));
            }
            Ok(Err(error)) => error,
            Err(error) => Error::Unavailable(format!("the probe write panicked: {error}")),
        };
        tracing::warn!(%error, "health: a probe write failed");
        Health::faulty(
            error.write_fault().unwrap_or(WriteFault::Unavailable),
            &format!("{why}, and a probe write failed just now"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_write_keeps_its_time_and_fault_in_one_word() {
        let last = LastWrite::default();
        assert_eq!(last.get(), None);
        for fault in [
            None,
            Some(WriteFault::Full),
            Some(WriteFault::ReadOnly),
            Some(WriteFault::Unavailable),
        ] {
            last.record(Timestamp(1_700_000_000_123), fault);
            assert_eq!(last.get(), Some((Timestamp(1_700_000_000_123), fault)));
        }
        last.record(Timestamp(0), None);
        assert_eq!(last.get(), Some((Timestamp(0), None)));
    }
}
