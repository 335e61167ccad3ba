//! API tokens and the audit log.
//!
//! A token is `sbt_<id>_<secret>`. The secret is random (244 bits), shown once when the token is
//! made, and stored only as its SHA-256; a presented token is found by its id and its secret
//! compared with the stored hash in constant time. Revoked tokens stay listed (with when), so an
//! audit entry naming them can still be understood.

use sha2::{Digest, Sha256};
use starbridge_core::time::Timestamp;

use crate::commands::invalid;
use crate::db::{Arg, Conn, Queries, Row, args};
use crate::writer::WriteCtx;
use crate::{Error, Result};

/// What a token may do. Each scope includes those after it in `IMPLIED`, except `work`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Tokens and namespaces, and everything `operate` may do.
    Admin,
    /// Jobs and their actions, workflows, queues, schedules, webhooks; and everything `submit` may.
    Operate,
    /// Create and read jobs; and everything `read` may.
    Submit,
    /// Poll and report tasks, on the token's queues only.
    Work,
    /// Read everything of the namespace.
    Read,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Admin,
        Scope::Operate,
        Scope::Submit,
        Scope::Work,
        Scope::Read,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Operate => "operate",
            Scope::Submit => "submit",
            Scope::Work => "work",
            Scope::Read => "read",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == text)
    }

    /// True when holding `self` allows what `needed` allows.
    pub fn covers(self, needed: Scope) -> bool {
        let rank = |scope: Scope| match scope {
            Scope::Admin => 3,
            Scope::Operate => 2,
            Scope::Submit => 1,
            Scope::Read => 0,
            Scope::Work => -1,
        };
        self == needed || (needed != Scope::Work && rank(self) >= rank(needed) && rank(needed) >= 0)
    }
}

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

    pub fn may_serve(&self, queue: &str) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|queues| queues.iter().any(|q| q == queue))
    }
}

/// What a new token is for.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub namespace: Option<String>,
    pub scopes: Vec<Scope>,
    pub queues: Option<Vec<String>>,
    pub created_by: String,
}

/// One accepted change made through the API.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub seq: i64,
    pub at: Timestamp,
    pub namespace: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub status: u16,
    pub reason: Option<String>,
}

const PREFIX: &str = "sbt_";

fn hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Equal strings, compared in time that depends only on their lengths.
fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
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

/// Makes a token; returns it with the full token text, which is never shown again.
pub(crate) fn create(ctx: &mut WriteCtx<'_>, new: &NewToken) -> Result<(Token, String)> {
    starbridge_core::definition::check_name(&new.name)
        .map_err(|message| invalid("name", message))?;
    if new.scopes.is_empty() {
        return Err(invalid(
            "scopes",
            "give at least one of admin, operate, submit, work, read",
        ));
    }
    if new.queues.is_some() && !new.scopes.contains(&Scope::Work) {
        return Err(invalid(
            "queues",
            "only a token with the work scope serves queues",
        ));
    }
    if new.scopes.contains(&Scope::Admin) && new.namespace.is_some() {
        return Err(invalid(
            "namespace",
            "an admin token manages every namespace: leave the namespace out",
        ));
    }
    let taken: Option<String> = ctx.conn.query_opt(
        "SELECT id FROM tokens WHERE name = ?1",
        args![new.name],
        |row| row.get(0),
    )?;
    if taken.is_some() {
        return Err(Error::Conflict(format!(
            "a token named '{}' exists: pick another name (revoked tokens keep their names)",
            new.name
        )));
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let secret = random_hex();
    let scopes: Vec<&str> = new.scopes.iter().map(|s| s.as_str()).collect();
    ctx.conn.execute(
        "INSERT INTO tokens (id, name, namespace, scopes, queues, secret_hash, created_at, created_by) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![
            id,
            new.name,
            new.namespace,
            serde_json::to_string(&scopes).unwrap_or_default(),
            new.queues
                .as_ref()
                .map(|queues| serde_json::to_string(queues).unwrap_or_default()),
            hash(&secret),
            ctx.now.0,
            new.created_by,
        ],
    )?;
    let token = Token {
        id: id.clone(),
        name: new.name.clone(),
        namespace: new.namespace.clone(),
        scopes: new.scopes.clone(),
        queues: new.queues.clone(),
        created_at: ctx.now,
        created_by: new.created_by.clone(),
        last_used_at: None,
        revoked_at: None,
    };
    Ok((token, format!("{PREFIX}{id}_{secret}")))
}

pub(crate) fn list(conn: &mut dyn Conn) -> Result<Vec<Token>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id"),
        &[],
        from_row,
    )
}

/// How many tokens that are not revoked exist.
pub(crate) fn active_count(conn: &mut dyn Conn) -> Result<u64> {
    conn.query_value("SELECT COUNT(*) FROM tokens WHERE revoked_at IS NULL", &[])
}

/// The token a presented text stands for, if it is well formed, known, matches and is not
/// revoked.
pub(crate) fn authenticate(conn: &mut dyn Conn, presented: &str) -> Result<Option<Token>> {
    let Some((id, secret)) = presented
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('_'))
    else {
        return Ok(None);
    };
    let found = conn.query_opt(
        &format!("SELECT {COLUMNS}, secret_hash FROM tokens WHERE id = ?1"),
        args![id],
        |row| Ok((from_row(row)?, row.get::<String>(9)?)),
    )?;
    Ok(found.and_then(|(token, stored)| {
        (constant_time_eq(&hash(secret), &stored) && token.revoked_at.is_none()).then_some(token)
    }))
}

/// Notes that a token was used now.
pub(crate) fn touch(ctx: &mut WriteCtx<'_>, id: &str) -> Result<()> {
    ctx.conn.execute(
        "UPDATE tokens SET last_used_at = ?2 WHERE id = ?1",
        args![id, ctx.now.0],
    )?;
    Ok(())
}

pub(crate) fn revoke(ctx: &mut WriteCtx<'_>, id: &str) -> Result<Token> {
    let changed = ctx.conn.execute(
        "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        args![id, ctx.now.0],
    )?;
    let token = ctx
        .conn
        .query_opt(
            &format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"),
            args![id],
            from_row,
        )?
        .ok_or_else(|| Error::NotFound(format!("token {id} not found")))?;
    if changed == 0 {
        return Err(Error::Conflict(format!("token {id} is already revoked")));
    }
    Ok(token)
}

pub(crate) fn record(ctx: &mut WriteCtx<'_>, entry: &AuditEntry) -> Result<()> {
    ctx.conn.execute(
        "INSERT INTO audit (at, namespace, actor, action, target, status, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![
            ctx.now.0,
            entry.namespace,
            entry.actor,
            entry.action,
            entry.target,
            entry.status,
            entry.reason,
        ],
    )?;
    Ok(())
}

/// The newest audit entries of a namespace (of every namespace with `None`), before `before`.
pub(crate) fn audit(
    conn: &mut dyn Conn,
    namespace: Option<&str>,
    before: Option<i64>,
    limit: u32,
) -> Result<Vec<AuditEntry>> {
    let filter = if namespace.is_some() {
        "namespace = ?3 AND"
    } else {
        ""
    };
    conn.query_map(
        &format!(
            "SELECT seq, at, namespace, actor, action, target, status, reason FROM audit \
             WHERE {filter} seq < ?1 ORDER BY seq DESC LIMIT ?2"
        ),
        &[
            Arg::Int(before.unwrap_or(i64::MAX)),
            Arg::Int(i64::from(limit)),
            Arg::Text(namespace.unwrap_or_default()),
        ][..usize::from(namespace.is_some()) + 2],
        |row| {
            Ok(AuditEntry {
                seq: row.get(0)?,
                at: Timestamp(row.get(1)?),
                namespace: row.get(2)?,
                actor: row.get(3)?,
                action: row.get(4)?,
                target: row.get(5)?,
                status: row.get(6)?,
                reason: row.get(7)?,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_include_the_lesser_ones_but_work_stands_alone() {
        assert!(Scope::Admin.covers(Scope::Read));
        assert!(Scope::Operate.covers(Scope::Submit));
        assert!(Scope::Submit.covers(Scope::Read));
        assert!(!Scope::Submit.covers(Scope::Operate));
        assert!(!Scope::Read.covers(Scope::Submit));
        assert!(!Scope::Operate.covers(Scope::Work));
        assert!(!Scope::Work.covers(Scope::Read));
        assert!(Scope::Work.covers(Scope::Work));
    }

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(constant_time_eq(&hash("abc"), &hash("abc")));
        assert!(!constant_time_eq(&hash("abc"), &hash("abd")));
        assert!(!constant_time_eq("abc", "abcd"));
    }
}
