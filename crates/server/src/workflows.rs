//! Workflows: apply a definition (`PUT`), read a version, list them, delete (hide) one.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::definition::{check_name, parse_document};
use utoipa::IntoParams;

use crate::error::{ApiError, ApiResult};
use crate::extract::{namespace, namespace_name};
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, NotFound, OtherNamespace, PROBLEM,
    Unprocessable, WorkflowPath,
};
use crate::state::AppState;
use crate::views;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::WORKFLOWS, get(list_workflows))
        .route(
            paths::WORKFLOW,
            put(apply_workflow)
                .get(get_workflow)
                .delete(delete_workflow),
        )
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list_workflows, get_workflow, apply_workflow, delete_workflow))]
pub(crate) struct Api;

/// List workflows
///
/// The latest version of every workflow of the namespace.
#[utoipa::path(
    get,
    path = paths::WORKFLOWS,
    operation_id = "listWorkflows",
    tag = "workflows",
    params(api::NamespaceQuery),
    responses(
        (status = 200, description = "The workflows.", body = api::WorkflowList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WorkflowQuery {
    /// Documented by [`api::NamespaceQuery`].
    #[param(ignore)]
    namespace: Option<String>,
    /// A version; the latest when absent.
    #[param(minimum = 0, maximum = 4294967295u64)]
    version: Option<u32>,
}

/// Get a workflow version
///
/// The latest version, or `version`. The name is not validated: a malformed name is not found.
/// A deleted workflow has no latest version (404), while its versions stay readable by number
/// for the jobs that ran them.
#[utoipa::path(
    get,
    path = paths::WORKFLOW,
    operation_id = "getWorkflow",
    tag = "workflows",
    params(WorkflowPath, api::NamespaceQuery, WorkflowQuery),
    responses(
        (status = 200, description = "The workflow version.", body = api::WorkflowDetail),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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

/// Delete a workflow
///
/// Hides the workflow: it is no longer listed, has no latest version, and runs no new job, not
/// even in a version given by number. Its versions are kept for the jobs that ran them (their
/// pages still show them), and applying the name again stores the next version number. Refused
/// while anything could still run it: a job of it that is unfinished or could still be retried
/// (any status but `succeeded`; delete such jobs, e.g. with `POST /api/v1/jobs/bulk/delete` and
/// `workflow`), a schedule of it, or a sub-workflow step of another workflow's latest version.
/// Takes no body (one sent is ignored).
#[utoipa::path(
    delete,
    path = paths::WORKFLOW,
    operation_id = "deleteWorkflow",
    tag = "workflows",
    params(WorkflowPath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 204, description = "The workflow was deleted; the answer has no body."),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (
            status = 409,
            description = "The workflow is still in use; `detail` names every user and what to                            do: its jobs that are not succeeded (the count and the oldest ids), its                            schedules, and the steps of other workflows that start it.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn delete_workflow(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_workflow(&namespace, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Apply a definition
///
/// Stores the definition as a new version when it differs from the latest, else returns the latest.
/// The body is YAML or JSON text whatever the content type: one whose first non-blank character is
/// `{` is read as JSON, anything else as YAML.
#[utoipa::path(
    put,
    path = paths::WORKFLOW,
    operation_id = "applyWorkflow",
    tag = "workflows",
    params(WorkflowPath, api::NamespaceQuery, ActorHeader),
    request_body(
        content((api::WorkflowDefinition = "application/yaml"), (api::WorkflowDefinition = "application/json")),
        description = "The definition, as YAML or JSON text.",
    ),
    responses(
        (
            status = 200,
            description = "The body matched the latest version, which is returned (`created: \
                           false`).",
            body = api::AppliedWorkflow,
        ),
        (status = 201, description = "A new version was stored.", body = api::AppliedWorkflow),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (
            status = 422,
            description = "The text is not YAML or JSON (the field is `line L column C`), or the \
                           definition is invalid (each step and field at fault is named).",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
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
