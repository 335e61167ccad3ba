//! Tokens, scopes and namespaces: each isolation rule of the API, with the router driven
//! in-process over a real SQLite file and authentication required.

mod common;

use axum::http::{StatusCode, header};
use serde_json::{Value, json};
use starbridge_engine::Scope;

use common::{Answer, Api};

/// Requests as a client with (or without) a token sends them.
trait Calls {
    async fn call(
        &self,
        token: Option<&str>,
        method: &str,
        uri: &str,
        body: &str,
    ) -> (StatusCode, Value);
    async fn page(&self, uri: &str, cookie: Option<&str>) -> Answer;
}

impl Calls for Api {
    /// The status and JSON body of a request with a JSON body.
    async fn call(
        &self,
        token: Option<&str>,
        method: &str,
        uri: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer));
        }
        let answer = self.send(method, uri, &headers, body).await;
        (answer.status, answer.json())
    }

    /// A page as a browser asks for it, with the token cookie when signed in.
    async fn page(&self, uri: &str, cookie: Option<&str>) -> Answer {
        let cookie = cookie.map(|token| format!("starbridge_token={token}"));
        let mut headers = vec![("accept", "text/html")];
        if let Some(cookie) = &cookie {
            headers.push(("cookie", cookie));
        }
        self.send("GET", uri, &headers, "").await
    }
}

const WORKFLOW: &str = "steps:\n- {id: a, queue: q, command: c}\n";

/// An admin token, and a workflow `wf` with one job in each of namespaces `a` and `b`.
async fn two_teams(api: &Api) -> (String, String, String) {
    let admin = api.token("root", None, &[Scope::Admin], None).await;
    let mut jobs = Vec::new();
    for namespace in ["a", "b"] {
        let uri = format!("/api/v1/workflows/wf?namespace={namespace}");
        let (status, _) = api.call(Some(&admin), "PUT", &uri, WORKFLOW).await;
        assert!(status.is_success(), "{status}");
        let uri = format!("/api/v1/jobs?namespace={namespace}");
        let (status, job) = api
            .call(Some(&admin), "POST", &uri, r#"{"workflow": "wf"}"#)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        jobs.push(job["id"].as_str().unwrap().to_owned());
    }
    (admin, jobs.remove(0), jobs.remove(0))
}

#[tokio::test]
async fn a_request_without_a_valid_token_is_refused_but_health_and_the_document_are_public() {
    let api = Api::with_auth();
    let (status, problem) = api.call(None, "GET", "/api/v1/jobs", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(problem["type"], "/problems/unauthorized");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("STARBRIDGE_TOKEN")
    );
    let (status, _) = api
        .call(Some("sbt_made_up"), "GET", "/api/v1/jobs", "")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        api.call(None, "GET", "/healthz", "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        api.call(None, "GET", "/api/v1/openapi.json", "").await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_token_of_one_namespace_gets_404_for_anothers_job_not_403() {
    let api = Api::with_auth();
    let (_, job_a, job_b) = two_teams(&api).await;
    let reader_a = api.token("reader-a", Some("a"), &[Scope::Read], None).await;

    let (status, job) = api
        .call(Some(&reader_a), "GET", &format!("/api/v1/jobs/{job_a}"), "")
        .await;
    assert_eq!(status, StatusCode::OK, "its own namespace is the default");
    assert_eq!(job["namespace"], "a");
    let (status, _) = api
        .call(Some(&reader_a), "GET", &format!("/api/v1/jobs/{job_b}"), "")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let uri = format!("/api/v1/jobs/{job_b}?namespace=b");
    let (status, problem) = api.call(Some(&reader_a), "GET", &uri, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    let (status, list) = api.call(Some(&reader_a), "GET", "/api/v1/jobs", "").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [job_a.as_str()], "lists show only its namespace");
}

#[tokio::test]
async fn scopes_decide_what_a_token_may_do() {
    let api = Api::with_auth();
    let (_, job_a, job_b) = two_teams(&api).await;
    let read = api.token("read", Some("a"), &[Scope::Read], None).await;
    let submit = api.token("submit", Some("a"), &[Scope::Submit], None).await;
    let operate = api
        .token("operate", Some("a"), &[Scope::Operate], None)
        .await;
    let work = api.token("work", Some("a"), &[Scope::Work], None).await;
    let submit_job = r#"{"workflow": "wf"}"#;
    let pause = format!("/api/v1/jobs/{job_a}/pause");

    let (status, problem) = api
        .call(Some(&read), "POST", "/api/v1/jobs", submit_job)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        problem["detail"].as_str().unwrap().contains("needs submit"),
        "{problem}"
    );
    assert_eq!(
        api.call(Some(&submit), "POST", "/api/v1/jobs", submit_job)
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.call(Some(&submit), "POST", &pause, "").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        api.call(Some(&operate), "POST", &pause, "").await.0,
        StatusCode::OK
    );
    // A task's requeue and fail need operate, in the token's namespace.
    for (action, body) in [
        ("requeue", r#"{"reason": "host drains"}"#),
        ("fail", r#"{"error": "gone"}"#),
    ] {
        let on_a = format!("/api/v1/jobs/{job_a}/tasks/tsk_nope/{action}");
        assert_eq!(
            api.call(Some(&submit), "POST", &on_a, body).await.0,
            StatusCode::FORBIDDEN
        );
        let on_b = format!("/api/v1/jobs/{job_b}/tasks/tsk_nope/{action}?namespace=b");
        assert_eq!(
            api.call(Some(&operate), "POST", &on_b, body).await.0,
            StatusCode::NOT_FOUND,
            "another namespace's job is not found"
        );
    }
    assert_eq!(
        api.call(Some(&operate), "GET", "/api/v1/tokens", "")
            .await
            .0,
        StatusCode::FORBIDDEN,
        "only admins manage tokens"
    );
    let (status, _) = api
        .call(Some(&work), "GET", &format!("/api/v1/jobs/{job_a}"), "")
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a work token cannot read jobs"
    );
    let poll = r#"{"queues": ["q"], "worker_id": "w"}"#;
    assert_eq!(
        api.call(Some(&read), "POST", "/api/v1/tasks/poll", poll)
            .await
            .0,
        StatusCode::FORBIDDEN,
        "only work tokens poll"
    );
}

#[tokio::test]
async fn a_work_token_polls_and_reports_only_on_its_queues_and_namespace() {
    let api = Api::with_auth();
    let (_, job_a, job_b) = two_teams(&api).await;
    let work_a = api
        .token("work-a", Some("a"), &[Scope::Work], Some(&["q"]))
        .await;
    let other_queue = r#"{"queues": ["elsewhere"], "worker_id": "w"}"#;
    let (status, problem) = api
        .call(Some(&work_a), "POST", "/api/v1/tasks/poll", other_queue)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    let other_namespace = r#"{"queues": ["q"], "worker_id": "w", "namespace": "b"}"#;
    let (status, _) = api
        .call(Some(&work_a), "POST", "/api/v1/tasks/poll", other_namespace)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, polled) = api
        .call(
            Some(&work_a),
            "POST",
            "/api/v1/tasks/poll",
            r#"{"queues": ["q"], "worker_id": "w"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let task = &polled["tasks"][0];
    assert_eq!(task["job_id"], job_a.as_str(), "{polled}");

    // A task of namespace b, claimed by b's worker: work-a cannot report on it even holding
    // its lease token.
    let (_, polled_b) = api
        .call(
            Some(&api.token("work-b", Some("b"), &[Scope::Work], None).await),
            "POST",
            "/api/v1/tasks/poll",
            r#"{"queues": ["q"], "worker_id": "w"}"#,
        )
        .await;
    let task_b = &polled_b["tasks"][0];
    assert_eq!(task_b["job_id"], job_b.as_str());
    let complete = json!({"lease_token": task_b["lease_token"], "output": {}}).to_string();
    let uri = format!("/api/v1/tasks/{}/complete", task_b["id"].as_str().unwrap());
    let (status, _) = api.call(Some(&work_a), "POST", &uri, &complete).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A token's queue may be a pattern: `agent-*` serves every queue its prefix starts (the queues
/// of a fan-out routed to hosts), and nothing else.
#[tokio::test]
async fn a_work_token_of_a_pattern_serves_the_queues_it_names() {
    let api = Api::with_auth();
    let admin = api.token("root", None, &[Scope::Admin], None).await;
    let routed = "steps:\n- {id: each, queue: 'agent-${{ item }}', command: c, for_each: '${{ params.hosts }}'}\n";
    let (status, _) = api
        .call(Some(&admin), "PUT", "/api/v1/workflows/wf", routed)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let submit = r#"{"workflow": "wf", "params": {"hosts": ["x", "y"]}}"#;
    let (status, _) = api.call(Some(&admin), "POST", "/api/v1/jobs", submit).await;
    assert_eq!(status, StatusCode::CREATED);
    let agents = api
        .token("agents", None, &[Scope::Work], Some(&["agent-*"]))
        .await;
    let poll = |queue: &str| format!(r#"{{"queues": ["{queue}"], "worker_id": "w"}}"#);
    let (status, polled) = api
        .call(
            Some(&agents),
            "POST",
            "/api/v1/tasks/poll",
            &poll("agent-x"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(polled["tasks"][0]["queue"], "agent-x", "{polled}");
    let (status, problem) = api
        .call(Some(&agents), "POST", "/api/v1/tasks/poll", &poll("db"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("may not serve queue 'db': its queues are agent-*"),
        "{problem}"
    );
    // A pattern is checked when the token is made.
    let bad = r#"{"name": "bad", "scopes": ["work"], "queues": ["agent*x"]}"#;
    let (status, problem) = api.call(Some(&admin), "POST", "/api/v1/tokens", bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "queues");
}

#[tokio::test]
async fn tokens_are_made_shown_once_listed_revoked_and_every_change_is_audited() {
    let api = Api::with_auth();
    let admin = api.token("root", None, &[Scope::Admin], None).await;
    let request =
        json!({"name": "ci", "scopes": ["submit"], "namespace": "a", "reason": "pipeline"});
    let (status, created) = api
        .call(Some(&admin), "POST", "/api/v1/tokens", &request.to_string())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["secret"].as_str().unwrap().to_owned();
    let id = created["token"]["id"].as_str().unwrap().to_owned();
    assert_eq!(created["token"]["created_by"], "root");

    let (_, list) = api.call(Some(&admin), "GET", "/api/v1/tokens", "").await;
    assert!(
        !list.to_string().contains(&secret),
        "the secret is shown only once"
    );
    let (status, _) = api.call(Some(&secret), "GET", "/api/v1/jobs", "").await;
    assert_eq!(status, StatusCode::OK);

    let bad = json!({"name": "x", "scopes": ["superuser"]}).to_string();
    let (status, problem) = api.call(Some(&admin), "POST", "/api/v1/tokens", &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "scopes");

    let (status, revoked) = api
        .call(Some(&admin), "DELETE", &format!("/api/v1/tokens/{id}"), "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(revoked["revoked_at"].is_string());
    let (status, _) = api.call(Some(&secret), "GET", "/api/v1/jobs", "").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a revoked token is refused"
    );

    let (_, audit) = api.call(Some(&admin), "GET", "/api/v1/audit", "").await;
    let entries: Vec<(String, String)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("root".to_owned(), "DELETE /api/v1/tokens/{id}".to_owned()),
            ("root".to_owned(), "POST /api/v1/tokens".to_owned()),
        ]
    );
    assert_eq!(audit["items"][1]["reason"], "pipeline");
}

#[tokio::test]
async fn operator_actions_are_recorded_with_the_tokens_name_not_the_claimed_actor() {
    let api = Api::with_auth();
    let (_, job_a, _) = two_teams(&api).await;
    let operate = api
        .token("oncall", Some("a"), &[Scope::Operate], None)
        .await;
    let bearer = format!("Bearer {operate}");
    let response = api
        .send(
            "POST",
            &format!("/api/v1/jobs/{job_a}/pause"),
            &[
                ("authorization", &bearer),
                ("starbridge-actor", "somebody-else"),
                ("content-type", "application/json"),
            ],
            r#"{"reason": "disk full"}"#,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK);
    let (_, events) = api
        .call(
            Some(&operate),
            "GET",
            &format!("/api/v1/jobs/{job_a}/events"),
            "",
        )
        .await;
    let paused = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "job_paused")
        .cloned()
        .unwrap();
    assert_eq!(paused["detail"]["actor"], "oncall", "{paused}");
    let (_, audit) = api.call(Some(&operate), "GET", "/api/v1/audit", "").await;
    assert_eq!(audit["items"][0]["actor"], "oncall");
    assert_eq!(audit["items"][0]["namespace"], "a");
    assert_eq!(audit["items"][0]["reason"], "disk full");
}

#[tokio::test]
async fn a_jobs_history_names_its_submitter_and_submissions_stay_out_of_the_audit_log() {
    let api = Api::with_auth();
    let admin = api.token("root", None, &[Scope::Admin], None).await;
    let (status, _) = api
        .call(
            Some(&admin),
            "PUT",
            "/api/v1/workflows/wf?namespace=a",
            WORKFLOW,
        )
        .await;
    assert!(status.is_success(), "{status}");
    let ci = api.token("ci", Some("a"), &[Scope::Submit], None).await;
    let (status, one) = api
        .call(Some(&ci), "POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{one}");
    let batch = r#"{"jobs": [{"workflow": "wf"}, {"workflow": "wf"}]}"#;
    let (status, many) = api
        .call(Some(&ci), "POST", "/api/v1/jobs/batch", batch)
        .await;
    assert_eq!(status, StatusCode::OK, "{many}");
    let mut ids = vec![one["id"].as_str().unwrap().to_owned()];
    for item in many["items"].as_array().unwrap() {
        ids.push(item["id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let (_, events) = api
            .call(Some(&ci), "GET", &format!("/api/v1/jobs/{id}/events"), "")
            .await;
        let created = &events["items"][0];
        assert_eq!(created["kind"], "job_created", "{events}");
        assert_eq!(created["detail"]["actor"], "ci", "{created}");
    }
    let (_, audit) = api.call(Some(&admin), "GET", "/api/v1/audit", "").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["PUT /api/v1/workflows/{name}"], "{audit}");
}

#[tokio::test]
async fn the_web_ui_asks_a_browser_to_sign_in_and_keeps_to_the_tokens_namespace() {
    let api = Api::with_auth();
    let (_, job_a, job_b) = two_teams(&api).await;
    let reader = api.token("viewer", Some("a"), &[Scope::Read], None).await;
    let response = api.page("/", None).await;
    assert_eq!(response.status, StatusCode::UNAUTHORIZED);
    assert!(response.text.contains("Sign in"));

    let form = ("content-type", "application/x-www-form-urlencoded");
    let signed_in = api
        .send("POST", "/ui/sign-in", &[form], &format!("token={reader}"))
        .await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    let cookie = signed_in.header(header::SET_COOKIE).unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );

    let wrong = api
        .send("POST", "/ui/sign-in", &[form], "token=sbt_nope_nope")
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);

    assert_eq!(api.page("/", Some(&reader)).await.status, StatusCode::OK);
    let own = api.page(&format!("/ui/jobs/{job_a}"), Some(&reader)).await;
    assert_eq!(own.status, StatusCode::OK);
    let other = api.page(&format!("/ui/jobs/{job_b}"), Some(&reader)).await;
    assert_eq!(
        other.status,
        StatusCode::NOT_FOUND,
        "another team's job does not exist"
    );
    let other = api
        .page(&format!("/ui/jobs/{job_b}/live?namespace=b"), Some(&reader))
        .await;
    assert_eq!(
        other.status,
        StatusCode::NOT_FOUND,
        "nor does its event stream"
    );
}

#[tokio::test]
async fn deleting_a_finished_job_needs_operate_in_its_namespace_and_is_audited() {
    let api = Api::with_auth();
    let (_, job_a, _) = two_teams(&api).await;
    let operate = api
        .token("oncall", Some("a"), &[Scope::Operate], None)
        .await;
    let cancel = format!("/api/v1/jobs/{job_a}/cancel");
    assert_eq!(
        api.call(Some(&operate), "POST", &cancel, "").await.0,
        StatusCode::OK
    );
    let job = format!("/api/v1/jobs/{job_a}");
    for scope in [Scope::Read, Scope::Submit] {
        let token = api.token(scope.as_str(), Some("a"), &[scope], None).await;
        let (status, problem) = api.call(Some(&token), "DELETE", &job, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{scope:?}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("needs operate"),
            "{problem}"
        );
    }
    let elsewhere = format!("{job}?namespace=b");
    assert_eq!(
        api.call(Some(&operate), "DELETE", &elsewhere, "").await.0,
        StatusCode::NOT_FOUND,
        "another namespace is not found"
    );
    assert_eq!(
        api.call(Some(&operate), "DELETE", &job, "").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.call(Some(&operate), "GET", &job, "").await.0,
        StatusCode::NOT_FOUND
    );
    let (_, audit) = api.call(Some(&operate), "GET", "/api/v1/audit", "").await;
    assert_eq!(audit["items"][0]["action"], "DELETE /api/v1/jobs/{id}");
    assert_eq!(audit["items"][0]["target"], job);
    assert_eq!(audit["items"][0]["actor"], "oncall");
}
