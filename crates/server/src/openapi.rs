//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document of the whole API, generated with
//! `utoipa` rather than written by hand. Its parts come from where the API is defined:
//!
//! - each operation from the `#[utoipa::path]` of its handler, which names its route by the same
//!   `paths` constant the route table registers, and lists its parameters, body and answers; each
//!   resource file gathers its handlers' operations (`Api`, next to its `routes()`);
//! - the schemas from the wire types (`starbridge_api`, `starbridge_core::wire`, feature
//!   `openapi`), with their doc comments as descriptions;
//! - the parameters and answers many operations share, and the document's top (info, tags,
//!   security, the `jobStatusChanged` webhook), from this file.
//!
//! It is built once, at the first request. `tests/openapi.rs` checks it against the routes,
//! validates real answers with its schemas, and compares it with the last hand-written document
//! (`tests/fixtures/openapi-handwritten.json`) so that nothing that document said is lost.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::http::{Method, header};
use axum::response::IntoResponse;
use serde_json::json;
use starbridge_api::{self as api, paths};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{
    HttpMethod, Operation, OperationBuilder, Parameter, ParameterBuilder, ParameterIn, PathItem,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder, ResponsesBuilder};
use utoipa::openapi::schema::{Object, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{
    ContentBuilder, InfoBuilder, LicenseBuilder, OpenApi, Ref, RefOr, Required, SecurityRequirement,
};
use utoipa::{IntoParams, IntoResponses, OpenApi as _, ToResponse};

/// The document, as served.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    document()
        .to_pretty_json()
        .expect("the OpenAPI document serializes")
});

/// This OpenAPI document
#[utoipa::path(
    get,
    path = paths::OPENAPI,
    operation_id = "openapi",
    tag = "system",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of the API.", body = Object),
        (status = 403, response = Forbidden),
        (status = 422, response = Unprocessable),
        (status = 431, response = HeadersTooLarge),
    ),
)]
pub(crate) async fn serve() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}

/// This OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(crate::health::health, crate::metrics::serve, serve),
    components(
        schemas(
            api::JobStatus,
            api::TaskStatus,
            api::TaskKind,
            api::ErrorKind,
            api::EventKind,
            api::AttemptOutcome,
            api::Scope,
            starbridge_core::definition::WorkflowDefinition,
            api::openapi::CreatedWebhook,
            api::openapi::QueueAnswer,
            api::WebhookPayload,
            api::WebhookEvent,
            api::RateView,
            api::RateSettings,
            api::ProblemLimit,
            api::BulkAction,
        ),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            OtherNamespace,
            Conflict,
            Unprocessable,
            PayloadTooLarge,
            Internal,
            Unavailable,
            UnsupportedMediaType,
            HeadersTooLarge,
        )
    )
)]
struct System;

/// The whole document: the operations of every resource, the shared components, the top.
fn document() -> OpenApi {
    let mut document = System::openapi();
    for part in [
        crate::workflows::Api::openapi(),
        crate::jobs::Api::openapi(),
        crate::batch::Api::openapi(),
        crate::operate::Api::openapi(),
        crate::tasks::Api::openapi(),
        crate::queues::Api::openapi(),
        crate::minutes::Api::openapi(),
        crate::schedules::Api::openapi(),
        crate::webhooks::Api::openapi(),
        crate::tokens::Api::openapi(),
        crate::signals::Api::openapi(),
        crate::approvals::Api::openapi(),
        crate::callbacks::Api::openapi(),
    ] {
        document.merge(part);
    }
    optional_bodies(&mut document.paths);
    scopes(&mut document.paths);
    let components = document.components.get_or_insert_with(Default::default);
    inline_flattened(&mut components.schemas);
    if let Some(submit) = components.schemas.remove("SubmitJob") {
        components
            .schemas
            .insert("SubmitJob".into(), api::openapi::submit_job(submit));
    }
    components.add_security_scheme(
        "bearerAuth",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "An API token `sbt_…` (see `POST /api/v1/tokens`), needed only when the \
                     server runs with `--auth`.",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        "cookieAuth",
        SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
            "starbridge_token",
            "The same token in the `starbridge_token` cookie, for browsers; the `Authorization` \
             header wins when both are sent.",
        ))),
    );
    document.info = info();
    document.tags = Some(tags());
    document.security = Some(vec![
        SecurityRequirement::new("bearerAuth", Vec::<String>::new()),
        SecurityRequirement::new("cookieAuth", Vec::<String>::new()),
    ]);
    // utoipa's `OpenApi` has no `webhooks` (an OpenAPI 3.1 member): its extensions are written
    // as members of the document's top object, so the webhook goes there.
    let webhooks = json!({ "jobStatusChanged": job_status_changed() });
    document.extensions = Some(members([("webhooks", webhooks)]));
    document
}

/// Members of an OpenAPI 3.1 object that utoipa's model lacks (`webhooks`, `info.summary`, a
/// response header's `required`), written through the object's extensions, which serialize as
/// members of the object itself (`Extensions::builder` would prefix their names with `x-`).
fn members<const N: usize>(members: [(&str, serde_json::Value); N]) -> Extensions {
    let mut extensions = Extensions::default();
    for (name, value) in members {
        extensions.insert(name.to_owned(), value);
    }
    extensions
}

/// Problem documents, as every error is sent.
pub(crate) const PROBLEM: &str = "application/problem+json";

pub(crate) fn problem(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        PROBLEM,
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build(),
    )
}

/// The answers many operations share (`components/responses`): a problem document each, with
/// the description given as the doc comment.
macro_rules! problem_responses {
    ($($(#[doc = $doc:literal])+ $name:ident;)+) => {$(
        $(#[doc = $doc])+
        pub(crate) struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), problem(concat!($($doc),+).trim()).build().into())
            }
        }
    )+};
}

problem_responses! {
    /// The request is malformed: the problem names the field (body, a query parameter, `query`
    /// for a query string that does not parse at all, or a header) and says how to fix it.
    BadRequest;
    /// Refused (`/problems/forbidden`): the server runs with `--auth` and the token's scopes do
    /// not allow the operation (see `x-required-scope`), or a task poll names a queue the token
    /// may not serve. Or refused before it is read: a change sent by a browser from another
    /// origin (`/problems/cross-origin`: `Sec-Fetch-Site` other than `same-origin` or `none`, or
    /// an `Origin` that is not the requested host), or, without `--auth`, a request addressed to
    /// a host name other than `localhost` and the `--allowed-host` names
    /// (`/problems/host-not-allowed`). Nothing changed.
    Forbidden;
    /// No such resource in this namespace (a malformed id is not found either; with `--auth`,
    /// neither is anything of a namespace other than the one the token is bound to).
    NotFound;
    /// The server runs with `--auth` and the request names a namespace other than the one its
    /// token is bound to: answered as if nothing were there, so that existence does not leak.
    OtherNamespace;
    /// The request conflicts with the current state; `detail` says why. Nothing changed.
    Conflict;
    /// Validation failed, or a part of the request is over a server limit
    /// (`/problems/limit-exceeded`, naming the limit and its setting); `errors` names each field
    /// at fault. Also: a NUL character in a text field, path or query, and an integer beyond 64
    /// bits anywhere in a JSON body (`/problems/validation`, naming its path such as
    /// `params.n`).
    Unprocessable;
    /// The body is larger than the server's body limit (`--max-body-bytes`, default 4 MiB) or,
    /// for a definition, its definition limit (`--max-definition-bytes`, default 1 MiB); a
    /// `/problems/limit-exceeded` problem names which.
    PayloadTooLarge;
    /// An internal error; the details are logged, not sent.
    Internal;
    /// The database is unavailable (`/problems/unavailable`), its disk is full
    /// (`/problems/disk-full`), it or its filesystem is read-only (`/problems/read-only`), or
    /// other server nodes kept the rows this request needs busy (`/problems/contended`); nothing
    /// was changed, try again.
    Unavailable;
    /// The request has a body whose `Content-Type` is missing or is not one the operation reads:
    /// `application/json` or `application/*+json` (a workflow definition may also be
    /// `application/yaml`, `application/x-yaml` or `text/yaml`). Nothing changed.
    UnsupportedMediaType;
    /// The request carries more than 64 KiB of header fields (`/problems/headers-too-large`).
    /// More than 100 header fields are refused with 431 by the HTTP parser before the API reads
    /// the request, with an empty body.
    HeadersTooLarge;
}

/// The server runs with `--auth` and the request carries no token, or an unknown or revoked one
/// (`/problems/unauthorized`); the answer names the scheme in `WWW-Authenticate`.
pub(crate) struct Unauthorized;

impl<'r> ToResponse<'r> for Unauthorized {
    fn response() -> (&'r str, RefOr<Response>) {
        let challenge = crate::error::CHALLENGE;
        let mut response = problem(
            "The server runs with `--auth` and the request carries no token, or an unknown or \
             revoked one (`/problems/unauthorized`).",
        )
        .build();
        // utoipa's `Header` has no `required`, nor its schemas a `const`.
        let header = json!({
            "description": format!("Always `{challenge}`."),
            "required": true,
            "schema": {"type": "string", "const": challenge},
        });
        response.extensions = Some(members([(
            "headers",
            json!({ "WWW-Authenticate": header }),
        )]));
        ("Unauthorized", response.into())
    }
}

/// Answers listed together by many operations, as references to the shared ones.
macro_rules! response_groups {
    ($($(#[doc = $doc:literal])+ $name:ident { $($status:literal: $response:ident),+ })+) => {$(
        $(#[doc = $doc])+
        pub(crate) struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                BTreeMap::from([$((
                    $status.to_owned(),
                    Ref::from_response_name(<$response as ToResponse>::response().0).into(),
                )),+])
            }
        }
    )+};
}

/// Problem answers that several operations of one resource give alike, written once and
/// listed inline in each: `Name { "404": description, … }`, described by the doc comment.
macro_rules! problem_answers {
    ($($(#[doc = $doc:literal])+ $name:ident { $($status:literal: $description:expr),+ $(,)? })+) => {$(
        $(#[doc = $doc])+
        pub(crate) struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
            > {
                std::collections::BTreeMap::from([$((
                    $status.to_owned(),
                    $crate::openapi::problem($description).build().into(),
                )),+])
            }
        }
    )+};
}

pub(crate) use problem_answers;

response_groups! {
    /// What a request can be refused with before its operation runs: no valid token, scopes
    /// that do not allow it, too many header bytes.
    Guarded { "401": Unauthorized, "403": Forbidden, "431": HeadersTooLarge }
    /// The refusals of a request body (a change): too large, or of a type the API does not read.
    Body { "413": PayloadTooLarge, "415": UnsupportedMediaType }
    /// Failures of the server or its database.
    Failures { "500": Internal, "503": Unavailable }
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

/// A parameter named `name` in `place`, with its schema.
fn parameter(
    name: &str,
    place: ParameterIn,
    description: &str,
    schema: impl Into<RefOr<Schema>>,
) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(place.clone())
        .required(if place == ParameterIn::Path {
            Required::True
        } else {
            Required::False
        })
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

/// The parameters many operations share, each described by its doc comment: `Name(name, in,
/// schema)`.
macro_rules! shared_parameters {
    ($($(#[doc = $doc:literal])+ $type:ident($name:literal, $place:ident, $schema:expr);)+) => {$(
        $(#[doc = $doc])+
        pub(crate) struct $type;

        impl IntoParams for $type {
            fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
                let description = concat!($($doc),+).trim();
                vec![parameter($name, ParameterIn::$place, description, $schema)]
            }
        }
    )+};
}

/// The pattern of namespace, workflow and schedule names.
const NAME_PATTERN: &str = "^[a-z0-9_.-]{1,128}$";

shared_parameters! {
    /// The workflow's name: 1 to 128 characters of a-z, 0-9, `_`, `.` and `-`.
    WorkflowPath("name", Path, string().pattern(Some(NAME_PATTERN)));
    /// A job id (`job_…`).
    JobPath("id", Path, string());
    /// A task id (`tsk_…`).
    TaskPath("id", Path, string());
    /// The queue's name: 1 to 128 bytes of letters, digits, `_`, `.`, `-`, `:` and `/` (sent as
    /// `%2F` in the path).
    QueuePath("name", Path, string().pattern(Some("^[A-Za-z0-9_.:/-]{1,128}$")));
    /// A queue's name, or a pattern: a name followed by `*` (`agent-*`; `*` alone names every
    /// queue), the only place a `*` may stand. A name is 1 to 128 bytes of letters, digits, `_`,
    /// `.`, `-`, `:` and `/` (sent as `%2F` in the path).
    QueueOrPatternPath(
        "name",
        Path,
        string().pattern(Some("^([A-Za-z0-9_.:/-]{1,128}|[A-Za-z0-9_.:/-]{0,128}[*])$"))
    );
    /// The schedule's name: 1 to 128 characters of a-z, 0-9, `_`, `.` and `-`.
    SchedulePath("name", Path, string().pattern(Some(NAME_PATTERN)));
    /// A subscription id (`whk_…`).
    WebhookPath("id", Path, string());
    /// A token id (16 hexadecimal characters; the part after `sbt_` of the token).
    TokenPath("id", Path, string());
    /// Who acts, recorded in the job's history and the audit log (and as `created_by` of a
    /// token) when the server runs without `--auth`; `anonymous` when absent. With `--auth`, the
    /// token's name is recorded and this header is replaced. 1 to 128 visible ASCII characters,
    /// else 400.
    ActorHeader(
        "Starbridge-Actor",
        Header,
        string().min_length(Some(1)).max_length(Some(128))
    );
    /// The W3C trace context of the caller's span (`00-<trace id>-<span id>-<flags>`). Read only
    /// while the server exports OpenTelemetry traces (`--otlp-endpoint`): a job submitted with it
    /// continues that trace, and the request's own span is its child. Ignored when malformed.
    TraceparentHeader("traceparent", Header, string());
}

/// Schemas the derive writes as `allOf` of a struct and the fields flattened into it
/// (`#[serde(flatten)]`: `JobView`, `WorkflowDetail`) as one object listing every field, as the
/// JSON is: a validator that closes objects (`additionalProperties: false`) then reads them as
/// the API writes them.
fn inline_flattened(schemas: &mut BTreeMap<String, RefOr<Schema>>) {
    let merged: Vec<(String, Object)> = schemas
        .iter()
        .filter_map(|(name, schema)| {
            let RefOr::T(Schema::AllOf(all_of)) = schema else {
                return None;
            };
            let mut object = Object::with_type(Type::Object);
            object.description.clone_from(&all_of.description);
            for item in &all_of.items {
                let part = match item {
                    RefOr::Ref(reference) => {
                        let target = reference.ref_location.rsplit('/').next()?;
                        schemas.get(target)?
                    }
                    schema => schema,
                };
                let RefOr::T(Schema::Object(part)) = part else {
                    return None;
                };
                object.properties.extend(part.properties.clone());
                object.required.extend(part.required.iter().cloned());
            }
            Some((name.clone(), object))
        })
        .collect();
    for (name, object) in merged {
        schemas.insert(name, Schema::Object(object).into());
    }
}

/// Each operation's `x-required-scope`, or `security: []` for a public one, as
/// `auth::required_scope` decides for its route: the scopes the document shows are those the
/// server checks.
fn scopes(paths: &mut utoipa::openapi::Paths) {
    for (path, item) in &mut paths.paths {
        let operations = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::PATCH, &mut item.patch),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else {
                continue;
            };
            match crate::auth::required_scope(&method, path) {
                Some(scope) => {
                    let extensions = operation.extensions.get_or_insert_with(Default::default);
                    extensions.insert("x-required-scope".into(), json!(scope.as_str()));
                }
                None => operation.security = Some(Vec::new()),
            }
        }
    }
}

/// An optional body (`request_body(content = Option<T>)`) is written by utoipa as a required
/// body whose JSON may be `null`; it is a body that may be left out, whose JSON is a `T`.
fn optional_bodies(paths: &mut utoipa::openapi::Paths) {
    let operations = paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
    });
    for operation in operations.flatten() {
        let Some(body) = &mut operation.request_body else {
            continue;
        };
        if body.required == Some(Required::True) {
            continue;
        }
        for content in body.content.values_mut() {
            if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                let mut items = one_of.items.iter().filter(|item| !is_null(item));
                if let (Some(item), None) = (items.next(), items.next()) {
                    content.schema = Some(item.clone());
                }
            }
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(schema, RefOr::T(Schema::Object(object))
        if object.schema_type == SchemaType::Type(Type::Null))
}

fn info() -> utoipa::openapi::Info {
    let mut info = InfoBuilder::new()
        .title("Starbridge API")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(DESCRIPTION))
        .license(Some(
            LicenseBuilder::new()
                .name("Apache-2.0")
                .identifier(Some("Apache-2.0"))
                .build(),
        ))
        .build();
    // utoipa's `Info` has no `summary` (OpenAPI 3.1): an extension is written as a member.
    info.extensions = Some(members([(
        "summary",
        json!(
            "Durable workflow engine: workflows, jobs, operator actions, queues, schedules, \
             webhooks, the worker protocol, API tokens and the audit log."
        ),
    )]));
    info
}

fn tags() -> Vec<utoipa::openapi::Tag> {
    [
        ("workflows", "Apply and read workflow definitions."),
        (
            "jobs",
            "Submit, inspect and operate on jobs, one at a time or in bulk.",
        ),
        (
            "tasks",
            "The worker protocol: long-poll for tasks, then report with the lease token.",
        ),
        (
            "queues",
            "Read queues with what they hold; change how they dispatch, pause and resume them.",
        ),
        (
            "schedules",
            "Start jobs of a workflow on a cron schedule: create or replace, list with the next \
             fire times, pause, resume and delete.",
        ),
        (
            "webhooks",
            "Subscribe a URL to job status changes: create, list, read the deliveries and \
             delete. Each change is POSTed to the URL, signed with the subscription's secret \
             (see the `jobStatusChanged` webhook).",
        ),
        (
            "tokens",
            "API tokens (admin scope): create one (its secret is shown once), list them, \
             revoke one.",
        ),
        (
            "audit",
            "The audit log: every change the API accepted, who made it and why.",
        ),
        ("system", "Health, metrics and this document."),
    ]
    .into_iter()
    .map(|(name, description)| {
        TagBuilder::new()
            .name(name)
            .description(Some(description))
            .build()
    })
    .collect()
}

/// The `jobStatusChanged` webhook: what the server sends to each matching subscription.
fn job_status_changed() -> PathItem {
    let header = |name: &str, description: &str, schema: ObjectBuilder| {
        let mut parameter = parameter(name, ParameterIn::Header, description, schema);
        parameter.required = Required::True;
        parameter
    };
    let operation: Operation = OperationBuilder::new()
        .operation_id(Some("jobStatusChanged"))
        .tag("webhooks")
        .summary(Some(
            "A job's status changed, or a task event (sent by the server to each matching \
             subscription)",
        ))
        .description(Some(WEBHOOK_DESCRIPTION))
        .parameter(header(
            "Starbridge-Signature",
            "`t=<unix seconds>,v1=<hex>`: `<t>` is the time of the attempt (so it changes across \
             retries) and `<hex>` the lowercase hex HMAC-SHA256, keyed with the subscription's \
             secret (its UTF-8 bytes), of `<t>.<body>`: the decimal `t`, a dot, then the body \
             bytes as received. Recompute it over the raw body before parsing it, compare in \
             constant time, and reject an old `t` to resist replays.",
            string().pattern(Some("^t=-?[0-9]+,v1=[0-9a-f]{64}$")),
        ))
        .parameter(header(
            "Starbridge-Delivery",
            "The delivery id (`id` in the subscription's deliveries), the same across retries of \
             one message.",
            string().pattern(Some("^[0-9]+$")),
        ))
        .parameter(header(
            "Starbridge-Event",
            "What the message reports; the same as the body's `type`.",
            string().enum_values(Some(api::WebhookEvent::ALL.iter().map(|e| e.as_str()))),
        ))
        .request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("WebhookPayload")))
                        .build(),
                )
                .build(),
        ))
        .responses(
            ResponsesBuilder::new()
                .response(
                    "2XX",
                    ResponseBuilder::new()
                        .description("Delivered; the body of the answer is ignored."),
                )
                .response(
                    "default",
                    ResponseBuilder::new().description(
                        "Any other answer (or none within 10 seconds) fails the attempt; the \
                         message is tried again later.",
                    ),
                ),
        )
        .build();
    PathItem::new(HttpMethod::Post, operation)
}

const WEBHOOK_DESCRIPTION: &str = "Sent to the `url` of every subscription whose `workflow` \
(when set) is the job's and whose `states` (when not empty) hold the job's new status, for every \
change of a job's status, its creation included (`type: job.status_changed`); and to every \
subscription whose `events` name a task event, whose `workflow` (when set) is the job's and whose \
`steps` (when not empty) hold the task's step, when a task of the job starts, succeeds, fails for \
good or fails an attempt that will be retried (`task.started`, `task.succeeded`, `task.failed`, \
`task.retrying`, with `task`). The message is written in the same transaction \
as the change, so a committed change is always sent and a rolled-back one never is. Each attempt \
is a `POST` with `Content-Type: application/json` and `User-Agent: starbridge/<version>`; the \
receiver has 10 seconds to answer. A 2xx answer delivers the message (its body is ignored). \
Redirects are not followed. Any other answer, or none, fails the attempt: the message is tried \
again 2^n seconds after the n-th failed attempt (at most an hour later), and given up after 20 \
attempts (`state: failed` in its delivery), or at once when the server's destination policy \
refuses the URL (see WebhookRequest's `url`). Delivery is at least once: drop duplicates by \
`Starbridge-Delivery`. Messages are sent one at a time but not necessarily in order (a retried \
message arrives after later ones): order them by `at` and check `previous_status`.";

/// The document's `info.description`: how the whole API behaves.
const DESCRIPTION: &str = "JSON under `/api/v1`. Errors are RFC 9457 `application/problem+json` documents whose `errors` \
name each field at fault. Endpoints that read or change a workflow, job, queue, schedule or \
webhook take `?namespace=` (default `default`); a job, queue, schedule or webhook of another \
namespace is not found. Every error is a problem document, including what is refused before a \
handler runs: a query string that does not parse (400), a body over the size limit (413), a \
known path with an unsupported method (405, with an `Allow` header) and an unknown path (404). \
Requests over a server limit (body, definition, steps, params, task output, key and name \
lengths, page size) are refused with `/problems/limit-exceeded`: 413 when the whole body is too \
large, 422 when a part of it is; the problem's `limit` names the setting, its value, and the \
flag and environment variable that change it. Times are RFC 3339; fields shown as absent are \
sent as `null`.\n\n\
Authentication is required only when the server runs with `--auth`: then every request but `GET \
/healthz` and `GET /api/v1/openapi.json` carries an API token, as `Authorization: Bearer sbt_…` \
(the CLI and SDK read `STARBRIDGE_TOKEN`) or in the `starbridge_token` cookie (for browsers). A \
missing, unknown or revoked token is a 401 `/problems/unauthorized` with `WWW-Authenticate: \
Bearer realm=\"starbridge\"`; a token whose scopes do not allow the operation is a 403 \
`/problems/forbidden`. Each operation names the scope it needs in `x-required-scope`. Scopes: \
`admin` ⊃ `operate` ⊃ `submit` ⊃ `read` (each allows what the ones after it allow): `read` reads \
everything, `submit` also submits jobs, `operate` also applies workflows, acts on jobs, \
configures queues, schedules and webhooks and reads the audit log, `admin` also manages tokens \
and reads `/metrics`. `work` stands alone (not even `admin` includes it): it polls tasks and \
reports on them, on the token's queues only. A token bound to a namespace acts only in it: a \
request without `?namespace=` gets the token's namespace, and one naming another namespace is \
answered 404, exactly as if nothing were there. Without `--auth`, no token is needed and none is \
checked. Every accepted change (a 2xx answer to POST, PUT, PATCH or DELETE) is appended to the \
audit log (`GET /api/v1/audit`) with who made it: the token's name, or, without `--auth`, the \
`Starbridge-Actor` header. The data plane is left out: the worker protocol, and job submissions, \
whose submitter the job's `job_created` event records (`detail.actor`), in the same transaction \
as the job.\n\n\
Requests from browsers: a change (any method but GET, HEAD and OPTIONS) whose `Sec-Fetch-Site` \
is neither `same-origin` nor `none`, or whose `Origin` (`null` included) is not the host it was \
sent to, is refused with 403 `/problems/cross-origin`; clients that send neither header (the \
CLI, the SDKs, curl) are not affected. Without `--auth`, a request addressed (`Host`) to a DNS \
name other than `localhost` and those given with `--allowed-host` is refused with 403 \
`/problems/host-not-allowed`; IP addresses are accepted. A request with a body names its type: \
JSON bodies are `application/json` (or `application/*+json`), a workflow definition may also be \
YAML (`application/yaml`, `application/x-yaml`, `text/yaml`); anything else is refused with 415 \
`/problems/unsupported-media-type` (with curl, send `-H 'Content-Type: application/json'`). A \
request with more than 100 header fields or 64 KiB of them gets 431 \
`/problems/headers-too-large`.";
