//! API tokens (`/api/v1/tokens`, admin scope) and the audit log (`/api/v1/audit`).

use crate::answer::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get};
use axum::{Extension, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_engine::{AuditEntry, NewToken, Token};
use utoipa::IntoParams;

use crate::auth::{Caller, actor};
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known};
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, OtherNamespace, PROBLEM, TokenPath,
    Unprocessable,
};
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::TOKENS, get(list).post(create))
        .route(paths::TOKEN, delete(revoke))
        .route(paths::AUDIT, get(audit))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, revoke, audit))]
pub(crate) struct Api;

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

/// List API tokens
///
/// Every token, revoked ones included (with when), oldest first; secrets are never shown. Takes no
/// namespace.
#[utoipa::path(
    get,
    path = paths::TOKENS,
    operation_id = "listTokens",
    tag = "tokens",
    responses(
        (status = 200, description = "The tokens.", body = api::TokenList),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn list(State(state): State<AppState>) -> ApiResult<Json<api::TokenList>> {
    let tokens = state.engine.tokens().await?;
    Ok(Json(api::TokenList {
        items: tokens.iter().map(view).collect(),
    }))
}

/// Create an API token
///
/// Makes a token with the given scopes, optionally bound to a namespace and (for `work`) to queues.
/// The answer holds the whole token (`secret`) this once: only its hash is stored. Takes no
/// namespace: bind the token with the body's `namespace`.
#[utoipa::path(
    post,
    path = paths::TOKENS,
    operation_id = "createToken",
    tag = "tokens",
    params(ActorHeader),
    request_body(content = api::CreateTokenRequest),
    responses(
        (
            status = 201,
            description = "The token, with its secret (shown this once).",
            body = api::CreatedToken,
        ),
        (
            status = 400,
            description = "The body is not a CreateTokenRequest object (empty, malformed JSON, an \
                           unknown field, a missing `name` or `scopes`, a wrong type; the field is \
                           `body`), an unknown scope (`scopes`), a malformed `namespace` \
                           (`namespace`), or a malformed `Starbridge-Actor` header. Nothing \
                           changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 409,
            description = "A token with this name exists (revoked tokens keep their names): pick \
                           another. Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 422,
            description = "A malformed `name` (`name`), no scope (`scopes`), `queues` on a token \
                           without the `work` scope or a malformed queue name or pattern in it \
                           (`queues`), or a `namespace` on an `admin` token (`namespace`). Nothing \
                           changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
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

/// Revoke an API token
///
/// From now on the token is refused (401). It stays listed, with `revoked_at`, so that the history
/// and the audit log naming it can still be understood; its name cannot be reused. Takes no body
/// (one sent is ignored) and no namespace.
#[utoipa::path(
    delete,
    path = paths::TOKEN,
    operation_id = "revokeToken",
    tag = "tokens",
    params(TokenPath, ActorHeader),
    responses(
        (status = 200, description = "The revoked token.", body = api::TokenView),
        (status = 400, response = BadRequest),
        (status = 404, description = "No such token.", body = api::Problem, content_type = PROBLEM),
        (
            status = 409,
            description = "The token is already revoked. Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<api::TokenView>> {
    let token = state.engine.revoke_token(&id).await?;
    Ok(Json(view(&token)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only entries of this namespace; every namespace when absent (with `--auth`, a token bound
    /// to a namespace reads only its own; another is a 404). A malformed name is a 400.
    #[param(pattern = "^[a-z0-9_.-]{1,128}$")]
    namespace: Option<String>,
    /// Only entries with a `seq` below this: the `next_cursor` of the previous page.
    before: Option<i64>,
    /// Most entries to return, 1 to 1000 (else 400).
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<u32>,
}

// The audit log, newest first: of the request's namespace, or of all of them for a caller that
// may act in every namespace and names none.
/// Read the audit log
///
/// Every change the API accepted (a 2xx answer to POST, PUT, PATCH or DELETE, the worker protocol
/// aside), newest first: of the namespace named, or, when none is named, of every namespace (for a
/// token bound to a namespace: of its namespace).
#[utoipa::path(
    get,
    path = paths::AUDIT,
    operation_id = "listAudit",
    tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, description = "The entries.", body = api::AuditList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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
