//! API tokens (`/api/v1/tokens`, admin scope) and the audit log (`/api/v1/audit`).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_engine::{AuditEntry, NewToken, Token};

use crate::auth::{Caller, actor};
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known};
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::TOKENS, get(list).post(create))
        .route(paths::TOKEN, delete(revoke))
        .route(paths::AUDIT, get(audit))
}

fn time(at: starbridge_core::time::Timestamp) -> api::Timestamp {
    api::timestamp_from_millis(at.0)
}

pub(crate) fn view(token: &Token) -> api::TokenView {
    api::TokenView {
        id: token.id.clone(),
        name: token.name.clone(),
        namespace: token.namespace.clone(),
        scopes: token.scopes.iter().map(|&scope| scope.into()).collect(),
        queues: token.queues.clone(),
        created_at: time(token.created_at),
        created_by: token.created_by.clone(),
        last_used_at: token.last_used_at.map(time),
        revoked_at: token.revoked_at.map(time),
    }
}

/// Checks a token request; returns what the store needs.
fn new_token(request: api::CreateTokenRequest, created_by: String) -> ApiResult<NewToken> {
    let scopes = request
        .scopes
        .iter()
        .map(|scope| {
            known("scopes", scope, |text| {
                format!("unknown scope '{text}': use admin, operate, submit, work or read")
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    if let Some(namespace) = &request.namespace {
        starbridge_core::definition::check_name(namespace)
            .map_err(|message| ApiError::invalid("namespace", message))?;
    }
    Ok(NewToken {
        name: request.name,
        namespace: request.namespace,
        scopes,
        queues: request.queues,
        created_by,
    })
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<api::TokenList>> {
    let tokens = state.engine.tokens().await?;
    Ok(Json(api::TokenList {
        items: tokens.iter().map(view).collect(),
    }))
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<api::CreatedToken>)> {
    let request: api::CreateTokenRequest = body(&bytes)?;
    let new = new_token(request, actor(&headers)?)?;
    let (token, secret) = state.engine.create_token(new).await?;
    Ok((
        StatusCode::CREATED,
        Json(api::CreatedToken {
            token: view(&token),
            secret,
        }),
    ))
}

async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<api::TokenView>> {
    let token = state.engine.revoke_token(&id).await?;
    Ok(Json(view(&token)))
}

#[derive(Deserialize)]
struct AuditQuery {
    namespace: Option<String>,
    before: Option<i64>,
    limit: Option<u32>,
}

/// The audit log, newest first: of the request's namespace, or of all of them for a caller that
/// may act in every namespace and names none.
async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<AuditQuery>,
) -> ApiResult<Json<api::AuditList>> {
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::invalid("limit", "must be between 1 and 1000"));
    }
    let namespace = match (&caller, query.namespace.as_deref()) {
        (Caller::Token(token), None) if token.namespace.is_none() => None,
        (Caller::Anyone, None) => None,
        (_, asked) => Some(caller.namespace(asked)?),
    };
    let entries = state.engine.audit(namespace, query.before, limit).await?;
    let next_cursor = (entries.len() == limit as usize)
        .then(|| entries.last().map(|e| e.seq))
        .flatten();
    Ok(Json(api::AuditList {
        items: entries.iter().map(entry_view).collect(),
        next_cursor,
    }))
}

fn entry_view(entry: &AuditEntry) -> api::AuditEntryView {
    api::AuditEntryView {
        seq: entry.seq,
        at: time(entry.at),
        namespace: entry.namespace.clone(),
        actor: entry.actor.clone(),
        action: entry.action.clone(),
        target: entry.target.clone(),
        status: entry.status,
        reason: entry.reason.clone(),
    }
}
