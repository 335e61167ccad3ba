//! The approvals page (`/ui/approvals`): the steps of a namespace waiting for a person, with
//! Approve and Reject buttons (each asks for a comment, then posts to the JSON API), and the
//! same buttons for the job page's waiting approval tasks.

use std::fmt::Write as _;

use starbridge_api::ApprovalView;

use super::html::{Esc, time, url};
use super::pages::Ns;
use starbridge_core::time::Timestamp;

/// Approve and Reject buttons for task `task` (shown as `name`) of job `job`.
pub(crate) fn decision_buttons(job: &str, task: &str, name: &str) -> String {
    let mut out = String::from(r#"<p class="decide">"#);
    for (action, label, verb) in [
        ("approve", "Approve", "Approve"),
        (
            "reject",
            "Reject",
            "Reject (the step fails and the job rolls back)",
        ),
    ] {
        let _ = write!(
            out,
            r#"<button type="button" id="{action}-{id}" data-url="{href}" data-confirm="{verb}: {name}" data-fields="comment" data-done="{label}d"{primary}>{label}…</button> "#,
            id = Esc(task),
            href = Esc(&format!(
                "/api/v1/jobs/{}/tasks/{}/{action}",
                url(job),
                url(task)
            )),
            name = Esc(name),
            primary = if action == "approve" {
                r#" class="primary""#
            } else {
                ""
            },
        );
    }
    out.push_str("</p>");
    out
}

/// The approvals page's body.
pub(crate) fn page(ns: &Ns, approvals: &[ApprovalView]) -> String {
    let mut body = String::from(
        r#"<h1>Approvals</h1><table class="list"><caption>Steps waiting for a person, oldest first</caption><thead><tr><th scope="col">Job</th><th scope="col">Workflow</th><th scope="col">Step</th><th scope="col">Prompt</th><th scope="col">Waiting since (UTC)</th><th scope="col"><span class="sr">Decide</span></th></tr></thead><tbody id="approvals" data-live>"#,
    );
    for approval in approvals {
        let step = match approval.item {
            Some(item) => format!("{} [{item}]", approval.step),
            None => approval.step.clone(),
        };
        let decide = if approval.decided {
            r#"<span class="muted">decided; takes effect when the job resumes</span>"#.to_owned()
        } else {
            decision_buttons(&approval.job_id, &approval.task_id, &step)
        };
        let _ = write!(
            body,
            r#"<tr><td><a class="mono" href="{href}">{job}</a></td><td>{workflow}</td><td>{step}</td><td>{prompt}</td><td>{since}</td><td>{decide}</td></tr>"#,
            href = Esc(&ns.href(&format!("/ui/jobs/{}", url(&approval.job_id)), &[])),
            job = Esc(&approval.job_id),
            workflow = Esc(&approval.workflow),
            step = Esc(&step),
            prompt = Esc(&approval.prompt),
            since = time(Timestamp(approval.since.as_millisecond())),
        );
    }
    if approvals.is_empty() {
        body.push_str(r#"<tr><td colspan="6" class="empty">Nothing waits for approval.</td></tr>"#);
    }
    body.push_str("</tbody></table>");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(decided: bool) -> ApprovalView {
        ApprovalView {
            job_id: "job_1".into(),
            workflow: "deploy".into(),
            task_id: "tsk_9".into(),
            step: "go".into(),
            item: Some(2),
            prompt: "Ship <v2>?".into(),
            since: starbridge_api::timestamp_from_millis(0),
            decided,
        }
    }

    #[test]
    fn the_page_lists_approvals_with_escaped_prompts_and_decision_buttons() {
        let html = page(&Ns("default".into()), &[approval(false)]);
        assert!(html.contains("Ship &lt;v2&gt;?"), "{html}");
        assert!(html.contains(r#"data-url="/api/v1/jobs/job_1/tasks/tsk_9/approve""#));
        assert!(html.contains(r#"data-url="/api/v1/jobs/job_1/tasks/tsk_9/reject""#));
        assert!(html.contains("go [2]"));
        let decided = page(&Ns("default".into()), &[approval(true)]);
        assert!(
            !decided.contains("/approve"),
            "a decided one has no buttons"
        );
        assert!(page(&Ns("default".into()), &[]).contains("Nothing waits"));
    }
}
