//! API tokens: the rules of making one, revoking one and checking a presented one (the rows,
//! and the `Scope` and `Token` types, are the store's `rows::tokens`).
//!
//! A token is `sbt_<id>_<secret>`. The secret is random (256 bits), shown once when the token is
//! made, and stored only as its SHA-256; a presented token is found by its id and its secret
//! compared with the stored hash in constant time. Revoked tokens stay listed (with when), so an
//! audit entry naming them can still be understood.

use starbridge_core::routing::QueueTarget;
use starbridge_store::db::Conn;
use starbridge_store::rows;

use crate::commands::invalid;
use crate::ctx::WriteCtx;
use crate::secrets::{constant_time_eq, hash, random_hex};
use crate::{Error, Result, Scope, Token};

/// What a new token is for.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub namespace: Option<String>,
    pub scopes: Vec<Scope>,
    pub queues: Option<Vec<String>>,
    pub created_by: String,
}

const PREFIX: &str = "sbt_";

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
    for queue in new.queues.iter().flatten() {
        QueueTarget::parse(queue).map_err(|message| invalid("queues", message))?;
    }
    if new.scopes.contains(&Scope::Admin) && new.namespace.is_some() {
        return Err(invalid(
            "namespace",
            "an admin token manages every namespace: leave the namespace out",
        ));
    }
    if rows::tokens::name_taken(ctx.conn, &new.name)? {
        return Err(Error::Conflict(format!(
            "a token named '{}' exists: pick another name (revoked tokens keep their names)",
            new.name
        )));
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let secret = random_hex();
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
    rows::tokens::insert(ctx.conn, &token, &hash(&secret))?;
    Ok((token, format!("{PREFIX}{id}_{secret}")))
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
    let found = rows::tokens::with_secret_hash(conn, id)?;
    Ok(found.and_then(|(token, stored)| {
        (constant_time_eq(&hash(secret), &stored) && token.revoked_at.is_none()).then_some(token)
    }))
}

pub(crate) fn revoke(ctx: &mut WriteCtx<'_>, id: &str) -> Result<Token> {
    let changed = rows::tokens::revoke(ctx.conn, id, ctx.now)?;
    let token = rows::tokens::get(ctx.conn, id)?
        .ok_or_else(|| Error::NotFound(format!("token {id} not found")))?;
    if !changed {
        return Err(Error::Conflict(format!("token {id} is already revoked")));
    }
    Ok(token)
}
