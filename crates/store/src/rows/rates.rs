//! Token buckets of steps' per-key rates (`rate_buckets`): one per namespace, rendered key and
//! limit, with when its parked tasks get their next token; idle buckets are pruned.

use starbridge_core::dispatch::{Bucket, RateLimit};
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

/// Which bucket: a namespace, a rendered key, a limit.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketId {
    pub namespace: String,
    pub key: String,
    pub limit: RateLimit,
}

/// The bucket as it was last saved, if it was (`None` is a full bucket), and when its parked
/// tasks get their next token.
pub fn rate_bucket(
    conn: &mut dyn Conn,
    id: &BucketId,
) -> Result<Option<(Bucket, Option<Timestamp>)>> {
    let found: Option<(f64, i64, Option<i64>)> = conn.query_opt(
        "SELECT bucket_tokens, bucket_at, wake_at FROM rate_buckets \
         WHERE namespace = ?1 AND key = ?2 AND tokens = ?3 AND per_ms = ?4",
        args![
            id.namespace,
            id.key,
            id.limit.tokens,
            id.limit.per.as_millis()
        ],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    Ok(found.map(|(tokens, at, wake_at)| {
        let bucket = Bucket {
            tokens,
            at: Timestamp(at),
        };
        (bucket, wake_at.map(Timestamp))
    }))
}

/// Saves a bucket's tokens (its wake-up stays as it is).
pub fn save_rate_bucket(conn: &mut dyn Conn, id: &BucketId, bucket: Bucket) -> Result<()> {
    conn.execute(
        "INSERT INTO rate_buckets (namespace, key, tokens, per_ms, bucket_tokens, bucket_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (namespace, key, tokens, per_ms) \
         DO UPDATE SET bucket_tokens = excluded.bucket_tokens, bucket_at = excluded.bucket_at",
        args![
            id.namespace,
            id.key,
            id.limit.tokens,
            id.limit.per.as_millis(),
            bucket.tokens,
            bucket.at.0
        ],
    )?;
    Ok(())
}

/// Sets when the bucket's parked tasks get their next token (`None`: none wait); the bucket
/// exists (it was saved before a task parked on it).
pub fn set_rate_wake(conn: &mut dyn Conn, id: &BucketId, wake_at: Option<Timestamp>) -> Result<()> {
    conn.execute(
        "UPDATE rate_buckets SET wake_at = ?5 \
         WHERE namespace = ?1 AND key = ?2 AND tokens = ?3 AND per_ms = ?4",
        args![
            id.namespace,
            id.key,
            id.limit.tokens,
            id.limit.per.as_millis(),
            wake_at.map(|at| at.0)
        ],
    )?;
    Ok(())
}

/// Up to `limit` buckets whose parked tasks are due a token at `now`.
pub fn due_rate_buckets(conn: &mut dyn Conn, now: Timestamp, limit: u32) -> Result<Vec<BucketId>> {
    let rows: Vec<(String, String, u32, i64)> = conn.query_map(
        "SELECT namespace, key, tokens, per_ms FROM rate_buckets INDEXED BY rate_buckets_wake \
         WHERE wake_at IS NOT NULL AND wake_at <= ?1 ORDER BY wake_at LIMIT ?2",
        args![now.0, limit],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
    )?;
    Ok(rows
        .into_iter()
        .map(|(namespace, key, tokens, per_ms)| BucketId {
            namespace,
            key,
            limit: RateLimit {
                tokens,
                per: starbridge_core::time::Duration::from_millis(
                    u64::try_from(per_ms).unwrap_or(0),
                ),
            },
        })
        .collect())
}

/// Deletes buckets that refilled by `now` with no parked tasks: the same as no bucket.
pub fn prune_rate_buckets(conn: &mut dyn Conn, now: Timestamp) -> Result<u64> {
    conn.execute(
        "DELETE FROM rate_buckets WHERE wake_at IS NULL AND bucket_at + per_ms <= ?1",
        args![now.0],
    )
}
