//! Workflows: apply a definition (`PUT`), read a version, list them.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::definition::{check_name, parse_document};

use crate::error::{ApiError, ApiResult};
use crate::extract::{namespace, namespace_name};
use crate::limits::Limit;
use crate::state::AppState;
use crate::views;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::WORKFLOWS, get(list_workflows))
        .route(paths::WORKFLOW, put(apply_workflow).get(get_workflow))
}

async fn list_workflows(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::WorkflowList>> {
    let namespace = namespace(&query)?;
    let stored = state.engine.workflows(&namespace).await?;
    Ok(Json(api::WorkflowList {
        items: stored.iter().map(views::workflow_summary).collect(),
    }))
}

#[derive(Deserialize)]
struct WorkflowQuery {
    namespace: Option<String>,
    version: Option<u32>,
}

async fn get_workflow(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<WorkflowQuery>,
) -> ApiResult<Json<api::WorkflowDetail>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let stored = state
        .engine
        .workflow(&namespace, &name, query.version)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("workflow {name} not found")))?;
    Ok(Json(api::WorkflowDetail {
        summary: views::workflow_summary(&stored),
        definition: stored.definition,
    }))
}

async fn apply_workflow(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<Response> {
    let namespace = namespace(&query)?;
    state.limits.text(Limit::Name, "name", &name)?;
    check_name(&name).map_err(|message| ApiError::invalid("name", message))?;
    if bytes.len() > state.limits.definition_bytes {
        return Err(state.limits.body_too_large(Limit::Definition, "body"));
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::invalid("body", "the definition must be UTF-8 text"))?;
    let document =
        parse_document(text).map_err(|error| starbridge_engine::Error::Invalid(error.problems))?;
    state.limits.definition("body", &document)?;
    let applied = state
        .engine
        .apply_workflow(&namespace, &name, document)
        .await?;
    let status = if applied.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(api::AppliedWorkflow {
            namespace,
            name,
            version: applied.version,
            created: applied.created,
        }),
    )
        .into_response())
}
