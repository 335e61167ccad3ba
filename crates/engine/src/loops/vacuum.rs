//! PostgreSQL: vacuums `tasks` after every few thousand claims of this node, on a thread of its
//! own (see `vacuum`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use starbridge_store::Error;
use starbridge_store::db::Conn;
use starbridge_store::postgres::{Connector, PgConn};

/// Tasks this node claimed since its store opened, and the vacuums it ran: the store counts
/// claims, the vacuumer reads them.
#[derive(Default)]
pub(crate) struct Upkeep {
    pub(crate) claimed: AtomicU64,
    vacuums: AtomicU64,
}

/// Tasks a node claims before it vacuums `tasks` again.
pub(crate) const VACUUM_AFTER_CLAIMS: u64 = 5_000;
/// Every this many vacuums (the first included), the vacuumer also analyzes `tasks` and `jobs`.
const ANALYZE_EVERY_VACUUMS: u64 = 10;
/// How often the vacuumer looks at the claim count.
const VACUUM_CHECK: Duration = Duration::from_millis(200);

/// Vacuums `tasks` after every `every` tasks this node claimed, until the store is dropped.
///
/// A claimed task leaves the ready set, but its entry stays in the dispatch index
/// (`tasks_dispatch`) until the table is vacuumed. A claim reads that index from its head,
/// which is exactly where claimed tasks were (the oldest first), so every claim steps over all
/// the tasks claimed since the last vacuum: at 2,000 claims a second, autovacuum's pass a minute
/// lets a claim grow from 1 ms to several. Vacuuming after a few thousand claims keeps it flat.
/// `INDEX_CLEANUP ON` because the point is the index, which PostgreSQL would otherwise skip
/// when few heap pages have dead rows. One node vacuums at a time (an advisory lock per schema);
/// a node that finds the lock taken, or the table busy with autovacuum, counts its claims as
/// covered.
///
/// The first vacuum and every tenth also analyze `tasks` and `jobs`. Loading the tasks of many
/// jobs at once (`job_id IN (...)`) needs statistics: without them PostgreSQL guesses a
/// thousand tasks a job and scans the whole table, and autovacuum, which would gather them,
/// may be off or a minute away while a fresh database fills up.
fn vacuum(connector: Connector, upkeep: Weak<Upkeep>, every: u64) {
    let mut conn: Option<PgConn> = None;
    let mut covered = 0;
    loop {
        std::thread::sleep(VACUUM_CHECK);
        let Some(upkeep) = upkeep.upgrade() else {
            return;
        };
        let claimed = upkeep.claimed.load(Ordering::Relaxed);
        if claimed.saturating_sub(covered) < every {
            continue;
        }
        covered = claimed;
        if !conn.as_ref().is_some_and(PgConn::is_usable) {
            conn = match connector.connect() {
                Ok(conn) => Some(conn),
                Err(error) => {
                    tracing::warn!(%error, "the vacuumer cannot reach PostgreSQL; trying later");
                    continue;
                }
            };
        }
        let Some(conn) = conn.as_mut() else { continue };
        let analyze = upkeep.vacuums.load(Ordering::Relaxed) % ANALYZE_EVERY_VACUUMS == 0;
        match conn.vacuum_tasks(analyze) {
            Ok(true) => {
                upkeep.vacuums.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(Error::Contended(reason)) => {
                tracing::debug!(%reason, "tasks is being vacuumed already");
            }
            Err(error) => tracing::warn!(%error, "vacuuming tasks failed; trying again later"),
        }
    }
}

/// Starts the vacuumer thread of a node.
pub(crate) fn start(connector: Connector, upkeep: &Arc<Upkeep>, every: u64) {
    let upkeep = Arc::downgrade(upkeep);
    std::thread::Builder::new()
        .name("starbridge-vacuum".to_owned())
        .spawn(move || vacuum(connector, upkeep, every))
        .expect("spawning the vacuumer thread");
}

#[cfg(test)]
mod tests {
    use super::*;
    use starbridge_store::StoreOptions;

    #[test]
    fn the_vacuumer_vacuums_and_analyzes_tasks_once_the_node_claimed_enough() {
        let Some(schema) = starbridge_store::scratch::ScratchSchema::create("vacuumer") else {
            return;
        };
        let options = StoreOptions::default();
        let connector = Connector::new(&schema.url, &options).unwrap();
        connector.migrate(0).unwrap();
        let upkeep = Arc::new(Upkeep::default());
        start(connector.clone(), &upkeep, 10);
        upkeep.claimed.fetch_add(10, Ordering::Relaxed);
        // A liveness bound, not a measurement: the vacuumer runs on its own thread, and
        // PostgreSQL publishes its statistics a moment after the vacuum.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut conn = connector.connect().unwrap();
        loop {
            let mut counts = conn
                .query(
                    "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables \
                     WHERE relid = 'tasks'::regclass",
                    &[],
                )
                .unwrap();
            let row = &mut counts[0];
            let (vacuums, analyzes): (i64, i64) = (row.get(0).unwrap(), row.get(1).unwrap());
            if upkeep.vacuums.load(Ordering::Relaxed) == 1 && vacuums >= 1 && analyzes >= 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no vacuum and analyze of this schema's tasks: {} by the vacuumer, {vacuums} \
                 vacuums and {analyzes} analyzes in PostgreSQL",
                upkeep.vacuums.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
