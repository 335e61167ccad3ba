//! The web UI's pages and exports served in-process (no socket, no browser): what each page
//! shows, that stored text is escaped, and how bad requests are answered. The browser tests are
//! in `ui_browser.rs`.

mod common;

use axum::http::{StatusCode, header};
use serde_json::json;
use starbridge_engine::Submit;

use common::Api as Ui;

fn ui() -> Ui {
    Ui::start()
}

/// Pages as a browser reads them, and a job to show.
trait Pages {
    async fn get(&self, uri: &str) -> (StatusCode, String, String);
    async fn job(&self, key: &str) -> String;
}

impl Pages for Ui {
    async fn get(&self, uri: &str) -> (StatusCode, String, String) {
        let answer = self.send("GET", uri, &[], "").await;
        (answer.status, answer.content_type, answer.text)
    }

    async fn job(&self, key: &str) -> String {
        self.engine
            .apply_workflow(
                "default",
                "etl",
                json!({"steps": [
                    {"id": "extract", "queue": "q", "command": "x"},
                    {"id": "load", "queue": "q", "command": "y"}
                ]}),
            )
            .await
            .unwrap();
        let submitted = self
            .engine
            .submit(
                "default",
                Submit {
                    workflow: Some("etl".to_owned()),
                    key: Some(key.to_owned()),
                    ..Submit::default()
                },
            )
            .await
            .unwrap();
        submitted.state.job.id.to_string()
    }
}

#[tokio::test]
async fn the_jobs_list_is_html_with_every_status_counted() {
    let ui = ui();
    let id = ui.job("nightly-1").await;
    let (status, content_type, page) = ui.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/html; charset=utf-8");
    assert!(page.contains(&format!(r#"href="/ui/jobs/{id}""#)), "{page}");
    assert!(page.contains(r#"data-status="running">running <b>1</b></a>"#));
    assert!(page.contains(r#"data-status="failed">failed <b>0</b></a>"#));
}

#[tokio::test]
async fn stored_text_is_escaped_on_every_page() {
    let ui = ui();
    let id = ui.job("<script>alert(1)</script>").await;
    for uri in ["/".to_owned(), format!("/ui/jobs/{id}")] {
        let (status, _, page) = ui.get(&uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert!(!page.contains("<script>alert"), "{uri}: {page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{uri}"
        );
    }
}

#[tokio::test]
async fn a_bad_filter_is_explained_on_the_page() {
    let ui = ui();
    let (status, _, page) = ui.get("/?status=lost&from=yesterday").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("status: unknown status &#39;lost&#39;"),
        "{page}"
    );
}

#[tokio::test]
async fn an_unknown_job_is_a_not_found_page() {
    let ui = ui();
    let (status, content_type, page) = ui.get("/ui/jobs/job_nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(content_type, "text/html; charset=utf-8");
    assert!(page.contains("job job_nothing not found"));
}

#[tokio::test]
async fn job_and_workflow_graphs_download_as_dot_and_svg() {
    let ui = ui();
    let id = ui.job("k").await;
    let (status, content_type, dot) = ui.get(&format!("/ui/jobs/{id}/graph.dot")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/vnd.graphviz; charset=utf-8");
    assert!(dot.contains("rankdir=LR;"));
    assert!(dot.contains("\"extract\" -> \"load\";"), "{dot}");
    assert!(
        dot.contains("\"extract\" [label=\"extract\\nq · x\\nready\""),
        "{dot}"
    );
    let (_, content_type, svg) = ui.get(&format!("/ui/jobs/{id}/graph.svg")).await;
    assert_eq!(content_type, "image/svg+xml; charset=utf-8");
    assert!(svg.starts_with("<?xml"));
    assert!(
        svg.contains(r#"class="node st-waiting" data-step="load""#),
        "{svg}"
    );
    let (status, _, dot) = ui.get("/ui/workflows/etl/graph.dot?version=1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(dot.starts_with("digraph \"etl v1\" {"), "{dot}");
    let (status, _, _) = ui.get("/ui/workflows/etl/graph.svg?version=7").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_workflow_page_shows_the_changes_between_versions() {
    let ui = ui();
    ui.job("k").await;
    ui.engine
        .apply_workflow(
            "default",
            "etl",
            json!({"steps": [
                {"id": "extract", "queue": "q", "command": "x"},
                {"id": "load", "queue": "q", "command": "y2"}
            ]}),
        )
        .await
        .unwrap();
    let (status, _, page) = ui.get("/ui/workflows/etl?version=2&diff=1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"aria-label="Changes from v1 to v2""#),
        "{page}"
    );
    assert!(
        page.contains("<del>-       &quot;command&quot;: &quot;y&quot;,</del>"),
        "{page}"
    );
    assert!(page.contains("<ins>+       &quot;command&quot;: &quot;y2&quot;,</ins>"));
}

#[tokio::test]
async fn a_workflow_page_offers_delete_and_a_deleted_version_still_shows_without_a_submit_form() {
    let ui = ui();
    ui.job("k").await;
    let (_, _, page) = ui.get("/ui/workflows/etl").await;
    assert!(
        page.contains(r#"data-url="/api/v1/workflows/etl" data-method="DELETE""#),
        "{page}"
    );
    assert!(page.contains(r#"id="submit-job""#));
    // Its job cancelled and deleted, the workflow is deleted; its version 1 still shows.
    let jobs = ui.engine.jobs(starbridge_engine::JobFilter {
        namespace: "default".into(),
        limit: 10,
        ..Default::default()
    });
    for job in jobs.await.unwrap() {
        let cancel = starbridge_core::model::OperatorCommand {
            actor: "ops".into(),
            reason: None,
            action: starbridge_core::model::OperatorAction::Cancel { compensate: false },
        };
        ui.engine.operate("default", &job.id, cancel).await.unwrap();
        ui.engine.delete_job("default", &job.id).await.unwrap();
    }
    ui.engine.delete_workflow("default", "etl").await.unwrap();
    let (status, _, _) = ui.get("/ui/workflows/etl").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, page) = ui.get("/ui/workflows/etl?version=1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"id="workflow-deleted""#), "{page}");
    assert!(!page.contains(r#"id="submit-job""#) && !page.contains("act-delete"));
}

#[tokio::test]
async fn ui_assets_are_served_from_the_binary() {
    let ui = ui();
    let (status, content_type, css) = ui.get("/ui/assets/app.css").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/css; charset=utf-8");
    assert!(css.contains(".st-failed rect.box"));
    let (_, content_type, js) = ui.get("/ui/assets/app.js").await;
    assert_eq!(content_type, "text/javascript; charset=utf-8");
    assert!(js.contains("EventSource"));
}

#[tokio::test]
async fn api_paths_still_answer_with_problem_documents() {
    let ui = ui();
    let (status, content_type, _) = ui.get("/api/v1/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(content_type, "application/problem+json");
}

#[tokio::test]
async fn a_job_stream_reports_history_growth_and_ends_when_the_server_closes() {
    use futures_util::StreamExt;

    let ui = ui();
    let id = ui.job("k").await;
    // Neither an unknown job nor a job of another namespace is streamed.
    let (status, _, _) = ui
        .get("/ui/jobs/job_01a21bfe4fcf7086adb1dfe330eef9df/live")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = ui.get(&format!("/ui/jobs/{id}/live?namespace=other")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let request = axum::http::Request::builder()
        .uri(format!("/ui/jobs/{id}/live?after=0"))
        .body(axum::body::Body::empty())
        .unwrap();
    // The stream is read as it comes, so this request goes to the app itself.
    let response = tower::ServiceExt::oneshot(ui.app.clone(), request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    let events = ui
        .engine
        .events(
            "default",
            &starbridge_core::ids::JobId::parse(&id).unwrap(),
            0,
            100,
        )
        .await
        .unwrap()
        .unwrap();
    let last = events.last().unwrap().seq;
    assert_eq!(
        String::from_utf8_lossy(&first),
        format!("event: change\ndata: {last}\n\n")
    );
    ui.closing.send(true).unwrap();
    // Whatever was under way is sent, then the stream ends (the bound only keeps a broken
    // shutdown from hanging the test run).
    let drained = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(chunk) = body.next().await {
            chunk.unwrap();
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "the stream is still open after the server closed"
    );
}
