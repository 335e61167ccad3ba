//! API tokens: their rows (never their secret, only its hash), and what a token's scopes and
//! bounds allow. How a token is made, its secret and how a presented one is checked are the
//! engine's (`tokens`).

use starbridge_core::routing::any_matches;
pub use starbridge_core::scope::Scope;
use starbridge_core::time::Timestamp;

use crate::db::{Conn, Queries, Row, args};
use crate::{Error, Result};

/// A stored token (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub id: String,
    pub name: String,
    /// The only namespace it may act in; `None`: every namespace.
    pub namespace: Option<String>,
    pub scopes: Vec<Scope>,
    /// The queues a `work` token may poll and report on; `None`: every queue.
    pub queues: Option<Vec<String>>,
    pub created_at: Timestamp,
    pub created_by: String,
    pub last_used_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

impl Token {
    pub fn allows(&self, needed: Scope) -> bool {
        self.scopes.iter().any(|scope| scope.covers(needed))
    }

    pub fn may_act_in(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|own| own == namespace)
    }

    /// Whether the token may poll and report on `queue`: it names no queues, or one of its
    /// queues or patterns (`agent-*`) names this one.
    pub fn may_serve(&self, queue: &str) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|queues| any_matches(queues, queue))
    }
}

const COLUMNS: &str = "id, name, namespace, scopes, queues, created_at, created_by, last_used_at, \
     revoked_at";

fn from_row(row: &mut Row) -> Result<Token> {
    let scopes: String = row.get(3)?;
    let scopes: Vec<String> = serde_json::from_str(&scopes)
        .map_err(|error| Error::Corrupt(format!("token scopes: {error}")))?;
    let queues: Option<String> = row.get(4)?;
    let queues = queues
        .map(|text| serde_json::from_str::<Vec<String>>(&text))
        .transpose()
        .map_err(|error| Error::Corrupt(format!("token queues: {error}")))?;
    Ok(Token {
        id: row.get(0)?,
        name: row.get(1)?,
        namespace: row.get(2)?,
        scopes: scopes.iter().filter_map(|s| Scope::parse(s)).collect(),
        queues,
        created_at: Timestamp(row.get(5)?),
        created_by: row.get(6)?,
        last_used_at: row.get::<Option<i64>>(7)?.map(Timestamp),
        revoked_at: row.get::<Option<i64>>(8)?.map(Timestamp),
    })
}

/// True when a token (revoked or not) has this name.
pub fn name_taken(conn: &mut dyn Conn, name: &str) -> Result<bool> {
    let taken: Option<String> = conn.query_opt(
        "SELECT id FROM tokens WHERE name = ?1",
        args![name],
        |row| row.get(0),
    )?;
    Ok(taken.is_some())
}

/// Stores a new token with the hash of its secret.
pub fn insert(conn: &mut dyn Conn, token: &Token, secret_hash: &str) -> Result<()> {
    let scopes: Vec<&str> = token.scopes.iter().map(|s| s.as_str()).collect();
    conn.execute(
        "INSERT INTO tokens (id, name, namespace, scopes, queues, secret_hash, created_at, created_by) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![
            token.id,
            token.name,
            token.namespace,
            serde_json::to_string(&scopes).unwrap_or_default(),
            token
                .queues
                .as_ref()
                .map(|queues| serde_json::to_string(queues).unwrap_or_default()),
            secret_hash,
            token.created_at.0,
            token.created_by,
        ],
    )?;
    Ok(())
}

/// Every token, revoked ones too, oldest first.
pub fn list(conn: &mut dyn Conn) -> Result<Vec<Token>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id"),
        &[],
        from_row,
    )
}

/// How many tokens that are not revoked exist.
pub fn active_count(conn: &mut dyn Conn) -> Result<u64> {
    conn.query_value("SELECT COUNT(*) FROM tokens WHERE revoked_at IS NULL", &[])
}

pub fn get(conn: &mut dyn Conn, id: &str) -> Result<Option<Token>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"),
        args![id],
        from_row,
    )
}

/// A token with the stored hash of its secret.
pub fn with_secret_hash(conn: &mut dyn Conn, id: &str) -> Result<Option<(Token, String)>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS}, secret_hash FROM tokens WHERE id = ?1"),
        args![id],
        |row| Ok((from_row(row)?, row.get::<String>(9)?)),
    )
}

/// Notes that a token was used at `now`.
pub fn touch(conn: &mut dyn Conn, id: &str, now: Timestamp) -> Result<()> {
    conn.execute(
        "UPDATE tokens SET last_used_at = ?2 WHERE id = ?1",
        args![id, now.0],
    )?;
    Ok(())
}

/// Marks a token revoked at `now`; false when it is unknown or revoked already.
pub fn revoke(conn: &mut dyn Conn, id: &str, now: Timestamp) -> Result<bool> {
    let changed = conn.execute(
        "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        args![id, now.0],
    )?;
    Ok(changed > 0)
}
