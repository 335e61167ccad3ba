//! The store's behaviour suite: every test runs on a real SQLite file and on a real PostgreSQL
//! schema of its own (see `scratch`), with a manual clock, so both backends are held to the same
//! semantics.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};
use starbridge_core::dispatch::QueueMode;
use starbridge_core::labels::Labels;
use starbridge_core::model::{
    EventKind, Input, JobStatus, OperatorAction, OperatorCommand, ReportedError, TaskStatus,
};
use starbridge_core::schedule::{CatchUp, Overlap};
use starbridge_core::time::{Duration, Timestamp};

use super::*;
use crate::Engine as Store;

mod browse;
mod stats;

struct Fixture {
    store: Store,
    clock: Arc<ManualClock>,
    url: String,
    /// Where the database lives (a directory or a schema), dropped after the store.
    _place: Box<dyn std::any::Any>,
}

impl Fixture {
    fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        Fixture::open(url, Box::new(dir))
    }

    /// `None` when no PostgreSQL server is reachable (and none is required).
    fn postgres(label: &str) -> Option<Fixture> {
        let schema = starbridge_store::scratch::ScratchSchema::create(label)?;
        Some(Fixture::open(schema.url.clone(), Box::new(schema)))
    }

    fn open(url: String, place: Box<dyn std::any::Any>) -> Fixture {
        let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
        let store = Store::open_with_clock(&url, clock.clone()).unwrap();
        Fixture {
            store,
            clock,
            url,
            _place: place,
        }
    }

    /// Runs SQL on the database behind the store's back (to break rows on purpose).
    fn raw_sql(&self, sql: &str) {
        match self.store.path() {
            Some(file) => {
                let raw = rusqlite::Connection::open(file).unwrap();
                raw.execute_batch(sql).unwrap();
            }
            None => {
                let (url, sql) = (self.url.clone(), sql.to_owned());
                std::thread::spawn(move || {
                    let mut client = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
                    client.batch_execute(&sql).unwrap();
                })
                .join()
                .unwrap();
            }
        }
    }
}

/// Runs each listed test on both backends: `sqlite::name` and `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Fixture::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(fixture) = super::Fixture::postgres(stringify!($name)) {
                        super::$name(fixture).await;
                    }
                }
            )*
        }
    };
}

// After the macro, which it uses.
mod children;
mod claims;
mod delete;
mod minutes;
mod operator_tasks;
mod poll;
mod routing;
mod step_limits;
mod waits;
mod webhooks;

fn definition(yaml: &str) -> Value {
    starbridge_core::definition::parse_document(yaml).unwrap()
}

/// Applies `wf` in `default`: one step `a` on queue `q`.
async fn apply_one_step(store: &Store) {
    store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: a, queue: q, command: c}\n"),
        )
        .await
        .unwrap();
}

const TWO_STEPS: &str = "steps:\n- {id: a, queue: q, command: c, timeout: 10s, retry: {max_attempts: 2, initial: 1s}}\n- {id: b, queue: q, command: c}\n";

async fn submit(store: &Store, workflow: &str, params: Value) -> Submitted {
    store
        .submit(
            "default",
            Submit {
                workflow: Some(workflow.into()),
                params: Some(params),
                ..Submit::default()
            },
        )
        .await
        .unwrap()
}

async fn claim_one(store: &Store) -> Claimed {
    let mut claimed = store
        .claim("default", vec!["q".into()], "w1", 1)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "expected a ready task");
    claimed.remove(0)
}

async fn complete(store: &Store, claimed: &Claimed, output: Value) -> Result<Reported> {
    store
        .report(
            claimed.task.id.clone(),
            Input::Complete {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                output,
                logs: None,
            },
            TaskScope::default(),
        )
        .await
}

/// Reports a retryable failure of a claimed task's attempt.
async fn fail(store: &Store, claimed: &Claimed, message: &str) {
    report_failure(store, claimed, message, true).await;
}

/// Reports a failure of a claimed task's attempt, retryable or not.
async fn report_failure(store: &Store, claimed: &Claimed, message: &str, retryable: bool) {
    store
        .report(
            claimed.task.id.clone(),
            Input::Fail {
                task: claimed.task.id.clone(),
                lease_token: claimed.task.lease_token.clone().unwrap(),
                error: ReportedError {
                    message: message.into(),
                    retryable,
                    retry_after: None,
                },
                logs: None,
            },
            TaskScope::default(),
        )
        .await
        .unwrap();
}

async fn applying_the_same_body_keeps_the_version_and_a_change_makes_a_new_one(f: Fixture) {
    let first = f
        .store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    assert_eq!((first.version, first.created), (1, true));
    let same = f
        .store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    assert_eq!((same.version, same.created), (1, false));
    let changed = f
        .store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: a, queue: q, command: other}\n"),
        )
        .await
        .unwrap();
    assert_eq!((changed.version, changed.created), (2, true));
    let listed = f.store.workflows("default").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].version, 2);
    assert!(
        f.store
            .workflow("other-ns", "wf", None)
            .await
            .unwrap()
            .is_none()
    );
}

async fn invalid_definition_is_refused_with_problems_and_nothing_is_stored(f: Fixture) {
    let error = f
        .store
        .apply_workflow("default", "wf", definition("steps:\n- {id: a, queue: q}\n"))
        .await
        .unwrap_err();
    let Error::Invalid(problems) = error else {
        panic!("expected Invalid, got {error}")
    };
    assert_eq!(problems[0].field, "steps[0] (a).command");
    assert!(f.store.workflows("default").await.unwrap().is_empty());
}

async fn submit_with_the_same_key_returns_the_existing_job(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let request = Submit {
        workflow: Some("wf".into()),
        key: Some("order-42".into()),
        ..Submit::default()
    };
    let first = f.store.submit("default", request.clone()).await.unwrap();
    let second = f.store.submit("default", request).await.unwrap();
    assert!(first.created);
    assert!(!second.created);
    assert_eq!(first.state.job.id, second.state.job.id);
    let jobs = f
        .store
        .jobs(JobFilter {
            namespace: "default".into(),
            status: None,
            workflow: None,
            before: None,
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
}

async fn params_are_checked_against_the_schema_naming_the_field(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "wf",
            definition("params: {type: object, required: [cpu], properties: {cpu: {type: integer}}}\nsteps:\n- {id: a, queue: q, command: c}\n"),
        )
        .await
        .unwrap();
    let error = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("wf".into()),
                params: Some(json!({"cpu": "four"})),
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    let Error::Invalid(problems) = error else {
        panic!("expected Invalid")
    };
    assert_eq!(problems[0].field, "params.cpu");
    let missing = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("wf".into()),
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("cpu"), "{missing}");
}

/// A submit by name runs the workflow's latest version, also when a version was applied after
/// the last submit (which made its job before the writer against the version it knew as the
/// latest) and when that submit's params or labels are refused; and the same job and history
/// come out whichever way the writer took.
async fn a_submit_by_name_runs_the_latest_version_applied_since_the_last_submit(f: Fixture) {
    let version = |command: &str| {
        definition(&format!(
            "params: {{type: object, properties: {{n: {{type: integer}}}}}}\n\
             steps:\n- {{id: a, queue: q, command: {command}}}\n- {{id: b, queue: q, command: {command}}}\n"
        ))
    };
    f.store
        .apply_workflow("default", "wf", version("first"))
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for expected in [1, 1] {
        let made = submit(&f.store, "wf", json!({"n": 1})).await;
        assert_eq!(made.state.job.version, expected);
        jobs.push(made.state);
    }
    f.store
        .apply_workflow("default", "wf", version("second"))
        .await
        .unwrap();
    let refused = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("wf".into()),
                params: Some(json!({"n": "one"})),
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::Invalid(problems) if problems[0].field == "params.n"),
        "{refused}"
    );
    for _ in 0..2 {
        let made = submit(&f.store, "wf", json!({"n": 1})).await;
        assert_eq!(made.state.job.version, 2);
        assert_eq!(made.state.tasks[0].command, "second");
        jobs.push(made.state);
    }
    for state in &jobs {
        let stored = f
            .store
            .job("default", &state.job.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.job.version, state.job.version);
        assert_eq!(stored.job.status, JobStatus::Running);
        let statuses: Vec<_> = stored.tasks.iter().map(|task| task.status).collect();
        assert_eq!(statuses, [TaskStatus::Ready, TaskStatus::Waiting]);
        assert_eq!(stored.tasks, state.tasks);
    }
}

/// An inline definition equal to an existing version (not only the latest) runs that version;
/// one equal to none adds a version only when the submitter may (the `operate` scope), and is
/// otherwise refused with nothing stored.
async fn an_inline_definition_runs_its_version_and_adds_one_only_when_allowed(f: Fixture) {
    let first = definition("steps:\n- {id: a, queue: q, command: first}\n");
    let second = definition("steps:\n- {id: a, queue: q, command: second}\n");
    let third = definition("steps:\n- {id: a, queue: q, command: third}\n");
    f.store
        .apply_workflow("default", "wf", first)
        .await
        .unwrap();
    f.store
        .apply_workflow("default", "wf", second)
        .await
        .unwrap();
    let stored_first = f
        .store
        .workflow("default", "wf", Some(1))
        .await
        .unwrap()
        .unwrap();
    let inline = |definition: Value, may_add_version: bool| Submit {
        workflow: Some("wf".into()),
        definition: Some(definition),
        may_add_version,
        ..Submit::default()
    };
    let ran = f
        .store
        .submit("default", inline(stored_first.definition, false))
        .await
        .unwrap();
    assert_eq!(ran.state.job.version, 1);
    assert_eq!(ran.added_version, None);
    let refused = f
        .store
        .submit("default", inline(third.clone(), false))
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Forbidden(_)), "{refused}");
    let latest = f
        .store
        .workflow("default", "wf", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.version, 2, "a refused definition made a version");
    let added = f
        .store
        .submit("default", inline(third, true))
        .await
        .unwrap();
    assert_eq!(added.state.job.version, 3);
    assert_eq!(added.added_version, Some(3));
}

/// A submit with an inline definition that is refused (here for its params) stores no version,
/// and leaves nothing behind in memory either: the version number it would have taken goes to
/// the next definition applied, whose jobs run that definition's steps.
async fn a_refused_inline_definition_leaves_no_version_behind(f: Fixture) {
    let inline = definition(
        "name: wf\nparams: {type: object, required: [cpu]}\nsteps:\n- {id: refused, queue: q, command: c}\n",
    );
    let error = f
        .store
        .submit(
            "default",
            Submit {
                definition: Some(inline),
                params: Some(json!({})),
                may_add_version: true,
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid(_)), "{error}");
    let applied = f
        .store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: kept, queue: q, command: c}\n"),
        )
        .await
        .unwrap();
    assert_eq!(applied.version, 1, "the refused definition took no version");
    let submitted = submit(&f.store, "wf", json!({})).await;
    let steps: Vec<&str> = submitted
        .state
        .tasks
        .iter()
        .map(|t| t.step.as_str())
        .collect();
    assert_eq!(steps, ["kept"]);
}

async fn a_job_runs_to_success_and_its_history_is_stored_in_order(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let job = submit(&f.store, "wf", json!({"x": 1})).await.state.job.id;
    let a = claim_one(&f.store).await;
    assert_eq!(a.task.step, "a");
    assert_eq!(a.lease, Duration::from_secs(10));
    // The claim is on the task's row, not in the history.
    let running = f.store.job("default", &job).await.unwrap().unwrap();
    assert!(running.tasks[0].claimed_at.is_some());
    complete(&f.store, &a, json!({"done": "a"})).await.unwrap();
    let b = claim_one(&f.store).await;
    complete(&f.store, &b, json!({})).await.unwrap();
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert_eq!(state.tasks[0].output, Some(json!({"done": "a"})));
    assert!(state.tasks.iter().all(|task| task.claimed_at.is_none()));
    let events = f
        .store
        .events("default", &job, 0, 100)
        .await
        .unwrap()
        .unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.event.kind).collect();
    assert_eq!(kinds.first(), Some(&EventKind::JobCreated));
    assert_eq!(kinds.last(), Some(&EventKind::JobSucceeded));
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(!kinds.contains(&EventKind::TaskClaimed));
    // Each success carries the start of the run it ended.
    let runs: Vec<(i64, i64)> = events
        .iter()
        .filter(|e| e.event.kind == EventKind::TaskSucceeded)
        .map(|e| (e.event.detail["claimed_at"].as_i64().unwrap(), e.event.at.0))
        .collect();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|(claimed, ended)| claimed <= ended));
}

async fn finished_jobs_are_pruned_after_their_retention_and_running_ones_stay(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let finished = submit(&f.store, "wf", json!({})).await.state.job.id;
    for _ in 0..2 {
        let task = claim_one(&f.store).await;
        complete(&f.store, &task, json!({})).await.unwrap();
    }
    let running = submit(&f.store, "wf", json!({})).await.state.job.id;
    assert_eq!(
        f.store.prune().await.unwrap(),
        0,
        "kept within the retention"
    );

    let retention = f.store.options().retain_finished.unwrap();
    f.clock
        .advance(Duration::from_millis(retention.as_millis() + 1));
    assert_eq!(f.store.prune().await.unwrap(), 1);
    assert!(f.store.job("default", &finished).await.unwrap().is_none());
    assert!(
        f.store
            .events("default", &finished, 0, 10)
            .await
            .unwrap()
            .is_none()
    );
    let kept = f.store.job("default", &running).await.unwrap().unwrap();
    assert_eq!(kept.tasks[0].status, TaskStatus::Ready);
    assert_eq!(f.store.prune().await.unwrap(), 0);
    // The running job is still served by the writer (and its job cache) after the prune.
    let claimed = claim_one(&f.store).await;
    assert_eq!(claimed.task.job_id, running);
    complete(&f.store, &claimed, json!({})).await.unwrap();
}

async fn history_retires_by_day_after_the_retention_and_a_running_job_keeps_its_day(f: Fixture) {
    let postgres = f.store.path().is_none();
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let first = f.store.retire_history().await.unwrap();
    assert_eq!(first.made.len(), if postgres { 8 } else { 0 });
    assert!(first.dropped.is_empty());
    let finished = submit(&f.store, "wf", json!({})).await.state.job.id;
    for _ in 0..2 {
        let task = claim_one(&f.store).await;
        complete(&f.store, &task, json!({})).await.unwrap();
    }
    let running = submit(&f.store, "wf", json!({})).await.state.job.id;

    let day = 86_400_000;
    let retention = f.store.options().retain_finished.unwrap();
    f.clock
        .advance(Duration::from_millis(retention.as_millis() + 2 * day));
    assert_eq!(f.store.prune().await.unwrap(), 1);
    let retired = f.store.retire_history().await.unwrap();
    if postgres {
        assert!(!retired.dropped.is_empty(), "the empty days went");
        assert!(
            !retired.dropped.contains(&first.made[0]),
            "the running job's day stays: {retired:?}"
        );
    } else {
        assert_eq!(retired, HistoryPartitions::default());
    }
    assert!(f.store.job("default", &finished).await.unwrap().is_none());
    let history = f
        .store
        .events("default", &running, 0, 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history[0].event.kind, EventKind::JobCreated);

    for _ in 0..2 {
        let task = claim_one(&f.store).await;
        complete(&f.store, &task, json!({})).await.unwrap();
    }
    f.clock
        .advance(Duration::from_millis(retention.as_millis() + 1));
    assert_eq!(f.store.prune().await.unwrap(), 1);
    let retired = f.store.retire_history().await.unwrap();
    assert_eq!(
        first
            .made
            .first()
            .is_some_and(|day| retired.dropped.contains(day)),
        postgres,
        "the job's day retires after it: {retired:?}"
    );
}

async fn a_token_authenticates_until_revoked_and_only_its_hash_is_kept(f: Fixture) {
    let new = NewToken {
        name: "ci-worker".into(),
        namespace: Some("team-a".into()),
        scopes: vec![Scope::Work],
        queues: Some(vec!["builds".into()]),
        created_by: "admin".into(),
    };
    let (token, text) = f.store.create_token(new.clone()).await.unwrap();
    assert!(text.starts_with("sbt_"));
    let found = f.store.authenticate(&text).await.unwrap().unwrap();
    assert_eq!(found, token);
    assert!(found.may_serve("builds") && !found.may_serve("deploys"));
    assert!(found.may_act_in("team-a") && !found.may_act_in("team-b"));
    let mut forged = text.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    assert!(f.store.authenticate(&forged).await.unwrap().is_none());
    assert!(
        f.store
            .authenticate("sbt_nope_nope")
            .await
            .unwrap()
            .is_none()
    );
    let again = f.store.create_token(new).await.unwrap_err();
    assert!(matches!(again, Error::Conflict(_)), "{again}");

    assert_eq!(f.store.active_tokens().await.unwrap(), 1);
    f.store.revoke_token(&token.id).await.unwrap();
    assert!(f.store.authenticate(&text).await.unwrap().is_none());
    assert_eq!(f.store.active_tokens().await.unwrap(), 0);
    let listed = f.store.tokens().await.unwrap();
    assert!(listed[0].revoked_at.is_some(), "revoked tokens stay listed");
    if let Some(file) = f.store.path() {
        let raw = std::fs::read(file).unwrap();
        let secret = text.rsplit('_').next().unwrap();
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is not stored"
        );
    }
}

async fn the_audit_log_lists_entries_newest_first_per_namespace(f: Fixture) {
    for (namespace, action) in [("a", "PUT /x"), ("b", "POST /y"), ("a", "DELETE /z")] {
        f.store
            .record_audit(AuditEntry {
                seq: 0,
                at: Timestamp(0),
                namespace: namespace.into(),
                actor: "ops".into(),
                action: action.into(),
                target: "/t".into(),
                status: 200,
                reason: Some("because".into()),
            })
            .await
            .unwrap();
    }
    let a = f.store.audit(Some("a".into()), None, 10).await.unwrap();
    let actions: Vec<&str> = a.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["DELETE /z", "PUT /x"]);
    assert_eq!(a[0].at, f.clock.now());
    let all = f.store.audit(None, Some(a[0].seq), 10).await.unwrap();
    assert_eq!(
        all.len(),
        2,
        "entries before the cursor, of every namespace"
    );
}

/// A page that follows a job live learns of every change from its change mark, a run's start
/// included, though a claim writes no history.
async fn a_jobs_change_mark_moves_with_its_history_and_its_runs(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let job = submit(&f.store, "wf", json!({})).await.state.job.id;
    let mark = || async { f.store.change_mark("default", &job).await.unwrap().unwrap() };
    let submitted = mark().await;
    assert!(submitted.last_event > 0);
    assert_eq!((submitted.runs, submitted.last_claim), (0, None));
    let claimed = claim_one(&f.store).await;
    let running = mark().await;
    assert_eq!(
        running.last_event, submitted.last_event,
        "a claim writes no history"
    );
    assert_eq!(running.runs, 1);
    assert!(running.last_claim.is_some());
    complete(&f.store, &claimed, json!({})).await.unwrap();
    let completed = mark().await;
    assert!(completed.last_event > running.last_event);
    assert_eq!(completed.runs, 0);
    assert!(
        f.store
            .change_mark("other-ns", &job)
            .await
            .unwrap()
            .is_none()
    );
}

async fn concurrent_claims_never_hand_out_the_same_task(f: Fixture) {
    apply_one_step(&f.store).await;
    for _ in 0..30 {
        submit(&f.store, "wf", json!({})).await;
    }
    let mut handles = Vec::new();
    for worker in 0..12 {
        let store = f.store.clone();
        handles.push(tokio::spawn(async move {
            store
                .claim("default", vec!["q".into()], &format!("w{worker}"), 4)
                .await
                .unwrap()
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for handle in handles {
        for claimed in handle.await.unwrap() {
            total += 1;
            assert!(seen.insert(claimed.task.id), "a task was claimed twice");
        }
    }
    assert_eq!(total, 30);
}

/// A job of `TWO_STEPS` (a 10 s lease on its first step), and the claim of its first step.
async fn first_of_two_steps_claimed(store: &Store) -> (JobId, Claimed) {
    store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let job = submit(store, "wf", json!({})).await.state.job.id;
    (job, claim_one(store).await)
}

async fn lapsed_lease_is_retried_and_the_stale_report_is_refused_without_change(f: Fixture) {
    let (job, first) = first_of_two_steps_claimed(&f.store).await;
    f.clock.advance(Duration::from_secs(11));
    assert_eq!(f.store.tick().await.unwrap(), 1);
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.tasks[0].status, TaskStatus::Ready);
    let before_events = f
        .store
        .events("default", &job, 0, 1000)
        .await
        .unwrap()
        .unwrap()
        .len();
    let stale = complete(&f.store, &first, json!({})).await.unwrap_err();
    assert!(matches!(stale, Error::Conflict(_)), "{stale}");
    let after_events = f
        .store
        .events("default", &job, 0, 1000)
        .await
        .unwrap()
        .unwrap()
        .len();
    assert_eq!(
        before_events, after_events,
        "a refused report writes nothing"
    );
    f.clock.advance(Duration::from_secs(1));
    let second = claim_one(&f.store).await;
    assert_eq!(second.task.attempt, 2);
    complete(&f.store, &second, json!({})).await.unwrap();
}

/// On PostgreSQL a node's committed transactions carry the jobs they kept over to its next
/// ones; a job another node changed in between is read again, not taken from memory as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_carried_job_another_node_changed_is_read_again() {
    let Some(f) = Fixture::postgres("carried_job_changed_elsewhere") else {
        return;
    };
    let other = Store::open_with_clock(&f.url, f.clock.clone()).unwrap();
    // This node claims the first step and carries the job over.
    let (job, first) = first_of_two_steps_claimed(&f.store).await;
    // The worker's completion reaches the other node, which makes the second step ready.
    let done = complete(&other, &first, json!({"n": 1})).await.unwrap();
    assert_eq!(done.task.status, TaskStatus::Succeeded);
    // Sent again to this node, it is a repeat of that success, not a first one.
    let again = complete(&f.store, &first, json!({"n": 1})).await.unwrap();
    assert_eq!(again.task.status, TaskStatus::Succeeded);
    let second = claim_one(&f.store).await;
    assert_eq!(second.task.step, "b", "the step the other node made ready");
    complete(&f.store, &second, json!({})).await.unwrap();
    let state = f.store.job("default", &job).await.unwrap().unwrap();
    assert_eq!(state.job.status, JobStatus::Succeeded);
    assert_eq!(state.tasks.len(), 2, "{:?}", state.tasks);
    let succeeded = f
        .store
        .events("default", &job, 0, 1000)
        .await
        .unwrap()
        .unwrap()
        .into_iter()
        .filter(|stored| stored.event.kind == EventKind::TaskSucceeded)
        .count();
    assert_eq!(succeeded, 2, "each step succeeded once");
}

/// When the next ready task of queue `q` becomes claimable.
async fn next_available_on_q(store: &Store) -> Option<Timestamp> {
    store
        .next_available("default", vec!["q".into()])
        .await
        .unwrap()
}

/// Submits a job of workflow `wf` at `priority`.
async fn submit_at_priority(store: &Store, priority: i32) -> JobId {
    let submit = Submit {
        workflow: Some("wf".into()),
        priority: Some(priority),
        ..Submit::default()
    };
    store.submit("default", submit).await.unwrap().state.job.id
}

async fn the_next_timer_and_next_available_time_are_reported(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    submit(&f.store, "wf", json!({})).await;
    let claimed = claim_one(&f.store).await;
    assert_eq!(
        f.store.next_timer().await.unwrap(),
        claimed.task.lease_expires_at
    );
    fail(&f.store, &claimed, "boom").await;
    let due = next_available_on_q(&f.store).await;
    assert_eq!(
        due,
        Some(f.store.now().saturating_add(Duration::from_secs(1)))
    );
    assert!(
        f.store
            .claim("default", vec!["q".into()], "w", 1)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn the_next_available_time_is_the_earliest_of_every_priority(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    for priority in [100, 0] {
        submit_at_priority(&f.store, priority).await;
    }
    let claimed = claim_n(&f.store, &["q"], 2).await;
    let (high, low) = (&claimed[0], &claimed[1]);
    assert_eq!((high.task.priority, low.task.priority), (100, 0));
    fail(&f.store, low, "boom").await;
    let low_due = f.store.now().saturating_add(Duration::from_secs(1));
    f.clock.advance(Duration::from_millis(500));
    fail(&f.store, high, "boom").await;
    let due = next_available_on_q(&f.store).await;
    assert_eq!(
        due,
        Some(low_due),
        "the lower priority's retry is due first"
    );
}

async fn jobs_survive_reopening_the_database(f: Fixture) {
    let url = f.url.clone();
    let job = {
        let store = f.store;
        store
            .apply_workflow("default", "wf", definition(TWO_STEPS))
            .await
            .unwrap();
        submit(&store, "wf", json!({"n": 7})).await.state.job.id
    };
    let store = Store::open(&url).unwrap();
    let state = store.job("default", &job).await.unwrap().expect("job kept");
    assert_eq!(state.job.params, json!({"n": 7}));
    assert_eq!(state.tasks[0].status, TaskStatus::Ready);
}

/// On SQLite, claims of jobs the writer's cache does not hold (a store just opened) ask for the
/// next ready tasks' jobs to be read ahead; the next claims take them from there, except a job
/// an operator changed since it was read, which is read again as it is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_take_jobs_read_ahead_but_not_one_changed_since() {
    let f = Fixture::sqlite();
    apply_one_step(&f.store).await;
    let mut jobs = Vec::new();
    for n in 0..50 {
        jobs.push(submit(&f.store, "wf", json!({ "n": n })).await.state.job.id);
    }
    let store = Store::open_with_clock(&f.url, f.clock.clone()).unwrap();
    drop(f.store);
    let read_ahead = store.inner.read_ahead.clone().expect("SQLite reads ahead");
    let first = claim_n(&store, &["q"], 1).await;
    assert_eq!(first[0].task.job_id, jobs[0]);
    read_ahead.settle();
    let cancel = OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action: OperatorAction::Cancel { compensate: false },
    };
    let cancelled = store.operate("default", &jobs[10], cancel).await.unwrap();
    assert_eq!(cancelled.job.status, JobStatus::Cancelled);
    let rest = claim_n(&store, &["q"], 100).await;
    let claimed: Vec<&JobId> = rest.iter().map(|claimed| &claimed.task.job_id).collect();
    let expected: Vec<&JobId> = jobs[1..].iter().filter(|job| **job != jobs[10]).collect();
    assert_eq!(
        claimed, expected,
        "every ready job once, the cancelled one not"
    );
    // The 48 claimed, and the cancelled job: the operator's command took it out to change it
    // (reading it from the store), so the claim after found it neither held nor ready.
    assert_eq!(store.writer_stats().jobs_read_ahead, 49);
    complete(&store, &rest[0], json!({})).await.unwrap();
    let done = store.job("default", &jobs[1]).await.unwrap().unwrap();
    assert_eq!(done.job.status, JobStatus::Succeeded);
}

async fn fresh_ids_are_compact_and_sort_by_creation(f: Fixture) {
    apply_one_step(&f.store).await;
    let mut jobs = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let state = submit(&f.store, "wf", json!({})).await.state;
        jobs.push(state.job.id.as_str().to_owned());
        tasks.push(state.tasks[0].id.as_str().to_owned());
    }
    for (id, prefix) in jobs
        .iter()
        .map(|id| (id, "job_"))
        .chain(tasks.iter().map(|id| (id, "tsk_")))
    {
        let unique = id.strip_prefix(prefix).expect("the id's prefix");
        assert_eq!(unique.len(), 22, "{id}");
        assert!(
            unique
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()),
            "{id}"
        );
    }
    assert!(jobs.is_sorted() && tasks.is_sorted(), "{jobs:?} {tasks:?}");
    let job = JobId::parse(&jobs[0]).unwrap();
    let stored = f
        .store
        .job("default", &job)
        .await
        .unwrap()
        .expect("found by its id");
    assert_eq!(stored.tasks[0].id.as_str(), tasks[0]);
}

async fn a_job_is_invisible_from_another_namespace(f: Fixture) {
    f.store
        .apply_workflow("team-a", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    let job = f
        .store
        .submit(
            "team-a",
            Submit {
                workflow: Some("wf".into()),
                ..Submit::default()
            },
        )
        .await
        .unwrap()
        .state
        .job
        .id;
    assert!(f.store.job("team-b", &job).await.unwrap().is_none());
    assert!(
        f.store
            .events("team-b", &job, 0, 10)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        f.store
            .claim("team-b", vec!["q".into()], "w", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let unknown = f
        .store
        .submit(
            "team-b",
            Submit {
                workflow: Some("wf".into()),
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(unknown, Error::NotFound(_)));
}

async fn dispatch_prefers_job_priority_then_age(f: Fixture) {
    apply_one_step(&f.store).await;
    let old_low = submit(&f.store, "wf", json!({})).await.state.job.id;
    f.clock.advance(Duration::from_millis(5));
    let high = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("wf".into()),
                priority: Some(10),
                ..Submit::default()
            },
        )
        .await
        .unwrap()
        .state
        .job
        .id;
    f.clock.advance(Duration::from_millis(5));
    submit(&f.store, "wf", json!({})).await;
    let order: Vec<_> = f
        .store
        .claim("default", vec!["q".into()], "w", 3)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.task.job_id)
        .collect();
    assert_eq!(order[0], high);
    assert_eq!(order[1], old_low);
}

async fn a_long_poll_registration_is_woken_by_a_new_ready_task(f: Fixture) {
    apply_one_step(&f.store).await;
    let notify = f.store.notifier().register("default", &["q".to_owned()]);
    submit(&f.store, "wf", json!({})).await;
    notify.notified().await;
}

async fn configure(store: &Store, queue: &str, change: QueueChange) {
    store
        .configure_queue("default", queue, change)
        .await
        .unwrap();
}

async fn resume(store: &Store, queue: &str) {
    let resume = QueueChange {
        paused: Some(false),
        ..QueueChange::default()
    };
    configure(store, queue, resume).await;
}

async fn claim_n(store: &Store, queues: &[&str], max: u32) -> Vec<Claimed> {
    store
        .claim(
            "default",
            queues.iter().map(|q| (*q).to_owned()).collect(),
            "w",
            max,
        )
        .await
        .unwrap()
}

async fn a_serial_queue_runs_one_task_at_a_time_in_order(f: Fixture) {
    apply_one_step(&f.store).await;
    configure(
        &f.store,
        "q",
        QueueChange {
            mode: Some(QueueMode::Serial),
            ..QueueChange::default()
        },
    )
    .await;
    let first = submit(&f.store, "wf", json!({})).await.state.job.id;
    f.clock.advance(Duration::from_millis(1));
    submit(&f.store, "wf", json!({})).await;
    let claimed = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].task.job_id, first, "first in, first out");
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "one at a time"
    );
    complete(&f.store, &claimed[0], json!({})).await.unwrap();
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 1);
}

async fn a_queue_concurrency_limit_bounds_running_tasks(f: Fixture) {
    apply_one_step(&f.store).await;
    configure(
        &f.store,
        "q",
        QueueChange {
            concurrency: Some(Some(3)),
            ..QueueChange::default()
        },
    )
    .await;
    for _ in 0..5 {
        submit(&f.store, "wf", json!({})).await;
    }
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 3);
    assert!(claim_n(&f.store, &["q"], 10).await.is_empty());
}

async fn a_paused_queue_keeps_its_tasks_and_hands_none_out_until_resumed(f: Fixture) {
    apply_one_step(&f.store).await;
    submit(&f.store, "wf", json!({})).await;
    let pause = QueueChange {
        paused: Some(true),
        ..QueueChange::default()
    };
    configure(&f.store, "q", pause).await;
    assert!(claim_n(&f.store, &["q"], 10).await.is_empty());
    assert_eq!(
        next_available_on_q(&f.store).await,
        None,
        "a poll does not spin on a paused queue"
    );
    let woken = f.store.notifier().register("default", &["q".to_owned()]);
    resume(&f.store, "q").await;
    woken.notified().await;
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 1);
}

/// The writer keeps the queue rows it read; every change of a row must reach the next claim.
async fn a_queue_that_pauses_itself_on_a_failure_hands_out_nothing_more(f: Fixture) {
    apply_one_step(&f.store).await;
    configure(
        &f.store,
        "q",
        QueueChange {
            on_error: Some(starbridge_core::dispatch::OnError::Pause),
            ..QueueChange::default()
        },
    )
    .await;
    for _ in 0..2 {
        submit(&f.store, "wf", json!({})).await;
    }
    // This claim reads the queue's row (unpaused) before the failure pauses it.
    let claimed = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(claimed.len(), 1);
    report_failure(&f.store, &claimed[0], "broken", false).await;
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "the queue paused itself: the other job's task waits"
    );
    resume(&f.store, "q").await;
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 1);
}

async fn higher_priority_queues_are_served_first(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "wf",
            definition("steps:\n- {id: a, queue: low, command: c, depends_on: []}\n- {id: b, queue: high, command: c, depends_on: []}\n"),
        )
        .await
        .unwrap();
    configure(
        &f.store,
        "high",
        QueueChange {
            priority: Some(10),
            ..QueueChange::default()
        },
    )
    .await;
    submit(&f.store, "wf", json!({})).await;
    let claimed = claim_n(&f.store, &["low", "high"], 1).await;
    assert_eq!(claimed[0].task.queue, "high");
}

async fn a_task_waiting_longer_than_max_wait_goes_ahead_of_priority(f: Fixture) {
    apply_one_step(&f.store).await;
    configure(
        &f.store,
        "q",
        QueueChange {
            max_wait: Some(Duration::from_secs(60)),
            ..QueueChange::default()
        },
    )
    .await;
    let at_priority = |priority: i32| submit_at_priority(&f.store, priority);
    // Starving tasks go oldest first whatever their priority: the oldest has the lowest.
    let starved = at_priority(0).await;
    f.clock.advance(Duration::from_secs(1));
    let starved_later = at_priority(50).await;
    f.clock.advance(Duration::from_secs(61));
    for _ in 0..3 {
        at_priority(100).await;
    }
    let claimed = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(claimed[0].task.job_id, starved);
    let claimed = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(claimed[0].task.job_id, starved_later);
    let next = claim_n(&f.store, &["q"], 1).await;
    assert_eq!(next[0].task.priority, 100, "the rest go by priority");
}

async fn queue_settings_are_validated(f: Fixture) {
    let zero = f
        .store
        .configure_queue(
            "default",
            "q",
            QueueChange {
                concurrency: Some(Some(0)),
                ..QueueChange::default()
            },
        )
        .await
        .unwrap_err();
    assert!(zero.to_string().contains("concurrency"), "{zero}");
    let bad_name = f
        .store
        .configure_queue("default", "bad name", QueueChange::default())
        .await
        .unwrap_err();
    assert!(matches!(bad_name, Error::Invalid(_)));
}

const LOCKED: &str = "lock: {key: 'cluster-${{ params.cluster }}', slots: 2}\nsteps:\n- {id: a, queue: q, command: c}\n";

async fn submit_locked(store: &Store, cluster: &str) -> Submitted {
    submit(store, "locked", json!({"cluster": cluster})).await
}

async fn a_lock_lets_its_slots_run_and_queues_the_rest_first_come_first_served(f: Fixture) {
    f.store
        .apply_workflow("default", "locked", definition(LOCKED))
        .await
        .unwrap();
    let first = submit_locked(&f.store, "a").await;
    assert_eq!(first.state.job.status, JobStatus::Running);
    assert_eq!(
        submit_locked(&f.store, "a").await.state.job.status,
        JobStatus::Running
    );
    let third = submit_locked(&f.store, "a").await;
    assert_eq!(
        third.state.job.status,
        JobStatus::Queued,
        "2 slots are held"
    );
    let fourth = submit_locked(&f.store, "a").await;
    let other_key = submit_locked(&f.store, "b").await;
    assert_eq!(
        other_key.state.job.status,
        JobStatus::Running,
        "another key has its own slots"
    );

    // The first job fails for good: its slot goes to the job that waited longest.
    let claimed = claim_n(&f.store, &["q"], 10).await;
    assert_eq!(claimed.len(), 3, "queued jobs dispatch nothing");
    let of_first = claimed
        .iter()
        .find(|c| c.task.job_id == first.state.job.id)
        .unwrap();
    report_failure(&f.store, of_first, "broken", false).await;
    let third_now = f
        .store
        .job("default", &third.state.job.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third_now.job.status, JobStatus::Running);
    let fourth_now = f
        .store
        .job("default", &fourth.state.job.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fourth_now.job.status, JobStatus::Queued);

    // Cancelling a queued job takes it out of line without taking a slot.
    let cancel = OperatorCommand {
        actor: "ops".into(),
        reason: None,
        action: OperatorAction::Cancel { compensate: false },
    };
    let cancelled = f
        .store
        .operate("default", &fourth.state.job.id, cancel)
        .await
        .unwrap();
    assert_eq!(cancelled.job.status, JobStatus::Cancelled);
    let events = f
        .store
        .events("default", &third.state.job.id, 0, 100)
        .await
        .unwrap()
        .unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.event.kind).collect();
    assert!(kinds.contains(&EventKind::JobQueued));
    assert!(kinds.contains(&EventKind::JobStarted));
}

async fn a_lock_key_that_does_not_render_is_refused_at_submit(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "locked",
            definition(
                "lock: {key: '${{ params.cluster }}'}\nsteps:\n- {id: a, queue: q, command: c}\n",
            ),
        )
        .await
        .unwrap();
    let error = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("locked".into()),
                params: Some(json!({"cluster": {"nested": true}})),
                ..Submit::default()
            },
        )
        .await
        .unwrap_err();
    let Error::Invalid(problems) = error else {
        panic!("expected a validation error")
    };
    assert_eq!(problems[0].field, "lock.key");
}

fn schedule_spec(cron: &str, overlap: Overlap, catch_up: CatchUp) -> ScheduleSpec {
    ScheduleSpec {
        workflow: "wf".into(),
        params: json!({"from": "cron"}),
        cron: cron.into(),
        timezone: "UTC".into(),
        overlap,
        catch_up,
        paused: false,
        labels: Default::default(),
    }
}

async fn all_jobs(store: &Store) -> Vec<starbridge_core::model::Job> {
    store
        .jobs(JobFilter {
            namespace: "default".into(),
            status: None,
            workflow: None,
            before: None,
            limit: 500,
            ..JobFilter::default()
        })
        .await
        .unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn labels_merge_over_the_workflows_and_are_checked_at_apply_and_submit(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "wf",
            definition(
                "labels: {team: storage, tier: '1'}\nsteps:\n- {id: a, queue: q, command: c}\n",
            ),
        )
        .await
        .unwrap();
    let submitted = f
        .store
        .submit(
            "default",
            Submit {
                workflow: Some("wf".into()),
                labels: labels(&[("tier", "2"), ("env", "prod")]),
                ..Submit::default()
            },
        )
        .await
        .unwrap();
    let expected = labels(&[("env", "prod"), ("team", "storage"), ("tier", "2")]);
    assert_eq!(submitted.state.job.labels, expected, "the submission's win");
    let read = f
        .store
        .job("default", &submitted.state.job.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.job.labels, expected);
    let plain = submit(&f.store, "wf", json!({})).await;
    assert_eq!(
        plain.state.job.labels,
        labels(&[("team", "storage"), ("tier", "1")])
    );
    let found = f
        .store
        .jobs(JobFilter {
            namespace: "default".into(),
            labels: vec![
                ("team".into(), "storage".into()),
                ("tier".into(), "2".into()),
            ],
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, submitted.state.job.id);

    let refused = |labels: Labels| {
        let store = f.store.clone();
        async move {
            let request = Submit {
                workflow: Some("wf".into()),
                labels,
                ..Submit::default()
            };
            let Err(Error::Invalid(problems)) = store.submit("default", request).await else {
                panic!("expected a validation error");
            };
            problems
        }
    };
    let problems = refused(labels(&[("Team", "x")])).await;
    assert_eq!(problems[0].field, "labels.Team");
    let problems = refused(labels(&[("team", "a\0b")])).await;
    assert_eq!(problems[0].field, "labels.team");
    // 30 distinct labels with the workflow's two are 32, the default limit; one more is over.
    let many: Labels = (0..31).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let problems = refused(many).await;
    assert_eq!(problems[0].field, "labels");
    assert!(
        problems[0].message.contains("33 labels"),
        "{}",
        problems[0].message
    );

    let over: String = (0..33).map(|i| format!("k{i}: v\n  ")).collect();
    let Err(Error::Invalid(problems)) = f
        .store
        .apply_workflow(
            "default",
            "wide",
            definition(&format!(
                "labels:\n  {over}\nsteps:\n- {{id: a, queue: q, command: c}}\n"
            )),
        )
        .await
    else {
        panic!("expected a validation error");
    };
    assert_eq!(problems[0].field, "labels");
    assert_eq!(
        all_jobs(&f.store).await.len(),
        2,
        "nothing refused was stored"
    );
}

async fn a_schedule_gives_its_labels_to_the_jobs_it_starts(f: Fixture) {
    f.store
        .apply_workflow(
            "default",
            "wf",
            definition("labels: {team: storage}\nsteps:\n- {id: a, queue: q, command: c}\n"),
        )
        .await
        .unwrap();
    let spec = ScheduleSpec {
        labels: labels(&[("origin", "cron")]),
        ..schedule_spec("*/10 * * * * *", Overlap::Allow, CatchUp::Skip)
    };
    let schedule = f
        .store
        .put_schedule("default", "nightly", spec)
        .await
        .unwrap();
    assert_eq!(schedule.labels, labels(&[("origin", "cron")]));
    f.clock
        .advance(schedule.next_fire_at.unwrap().since(f.store.now()));
    f.store.tick().await.unwrap();
    let jobs = all_jobs(&f.store).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        jobs[0].labels,
        labels(&[("origin", "cron"), ("team", "storage")])
    );
    let bad = ScheduleSpec {
        labels: labels(&[("Origin", "cron")]),
        ..schedule_spec("*/10 * * * * *", Overlap::Allow, CatchUp::Skip)
    };
    let Err(Error::Invalid(problems)) = f.store.put_schedule("default", "bad", bad).await else {
        panic!("expected a validation error");
    };
    assert_eq!(problems[0].field, "labels.Origin");
}

async fn a_schedule_fires_one_job_per_fire_time_with_its_params(f: Fixture) {
    apply_one_step(&f.store).await;
    let schedule = f
        .store
        .put_schedule(
            "default",
            "nightly",
            schedule_spec("*/10 * * * * *", Overlap::Allow, CatchUp::Skip),
        )
        .await
        .unwrap();
    let first_fire = schedule.next_fire_at.unwrap();
    assert!(first_fire > f.store.now());
    assert_eq!(f.store.next_timer().await.unwrap(), Some(first_fire));
    f.clock.advance(first_fire.since(f.store.now()));
    f.store.tick().await.unwrap();
    f.store.tick().await.unwrap();
    let jobs = all_jobs(&f.store).await;
    assert_eq!(jobs.len(), 1, "a fire creates exactly one job");
    assert_eq!(jobs[0].params, json!({"from": "cron"}));
    assert_eq!(
        jobs[0].key.as_deref(),
        Some(format!("schedule:nightly:{}", first_fire.0).as_str())
    );
    let after = f
        .store
        .schedule("default", "nightly")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.last_fire_at, Some(first_fire));
    assert_eq!(
        after.next_fire_at,
        Some(first_fire.saturating_add(Duration::from_secs(10)))
    );
}

async fn overlap_skip_starts_nothing_while_the_previous_job_runs_and_queue_one_holds_one_fire(
    f: Fixture,
) {
    apply_one_step(&f.store).await;
    for (name, overlap) in [("skipper", Overlap::Skip), ("queuer", Overlap::QueueOne)] {
        f.store
            .put_schedule(
                "default",
                name,
                schedule_spec("*/10 * * * * *", overlap, CatchUp::Skip),
            )
            .await
            .unwrap();
    }
    for _ in 0..3 {
        f.clock.advance(Duration::from_secs(10));
        f.store.tick().await.unwrap();
    }
    let jobs = all_jobs(&f.store).await;
    assert_eq!(jobs.len(), 2, "one job per schedule while the first runs");
    let queuer = f
        .store
        .schedule("default", "queuer")
        .await
        .unwrap()
        .unwrap();
    assert!(
        queuer.pending_fire_at.is_some(),
        "queue_one keeps one fire waiting"
    );
    let skipper = f
        .store
        .schedule("default", "skipper")
        .await
        .unwrap()
        .unwrap();
    assert!(skipper.pending_fire_at.is_none());

    // Finish both jobs: the held fire of queue_one starts at once.
    while let Some(claimed) = claim_n(&f.store, &["q"], 1).await.pop() {
        complete(&f.store, &claimed, json!({})).await.unwrap();
    }
    assert_eq!(
        f.store
            .next_timer()
            .await
            .unwrap()
            .map(|t| t <= f.store.now()),
        Some(true)
    );
    f.store.tick().await.unwrap();
    assert_eq!(all_jobs(&f.store).await.len(), 3);
}

async fn catch_up_all_runs_missed_fires_up_to_its_limit(f: Fixture) {
    apply_one_step(&f.store).await;
    f.store
        .put_schedule(
            "default",
            "hourly",
            schedule_spec("0 * * * *", Overlap::Allow, CatchUp::All { limit: 3 }),
        )
        .await
        .unwrap();
    // Ten hours of downtime.
    f.clock.advance(Duration::from_secs(10 * 3600));
    f.store.tick().await.unwrap();
    assert_eq!(all_jobs(&f.store).await.len(), 3);
}

async fn schedule_input_is_validated_naming_the_field(f: Fixture) {
    apply_one_step(&f.store).await;
    let cases = [
        (
            schedule_spec("99 * * * *", Overlap::Skip, CatchUp::Skip),
            "cron",
        ),
        (
            ScheduleSpec {
                timezone: "Mars/Olympus".into(),
                ..schedule_spec("0 * * * *", Overlap::Skip, CatchUp::Skip)
            },
            "timezone",
        ),
        (
            ScheduleSpec {
                workflow: "nope".into(),
                ..schedule_spec("0 * * * *", Overlap::Skip, CatchUp::Skip)
            },
            "workflow",
        ),
    ];
    for (spec, field) in cases {
        let Error::Invalid(problems) = f
            .store
            .put_schedule("default", "s", spec)
            .await
            .unwrap_err()
        else {
            panic!("expected a validation error for {field}")
        };
        assert_eq!(problems[0].field, field);
    }
    let paused = f
        .store
        .put_schedule(
            "default",
            "s",
            ScheduleSpec {
                paused: true,
                ..schedule_spec("* * * * * *", Overlap::Allow, CatchUp::Skip)
            },
        )
        .await
        .unwrap();
    assert!(paused.paused);
    f.clock.advance(Duration::from_secs(5));
    f.store.tick().await.unwrap();
    assert!(
        all_jobs(&f.store).await.is_empty(),
        "a paused schedule does not fire"
    );
    f.store.delete_schedule("default", "s").await.unwrap();
    assert!(matches!(
        f.store.delete_schedule("default", "s").await,
        Err(Error::NotFound(_))
    ));
}

async fn a_schedule_that_cannot_be_computed_stops_alone_and_timers_go_on(f: Fixture) {
    f.store
        .apply_workflow("default", "wf", definition(TWO_STEPS))
        .await
        .unwrap();
    f.store
        .put_schedule(
            "default",
            "broken",
            schedule_spec("* * * * * *", Overlap::Allow, CatchUp::Skip),
        )
        .await
        .unwrap();
    // The time zone disappears from the system after the schedule was stored.
    f.raw_sql("UPDATE schedules SET timezone = 'Nowhere/Gone'");
    submit(&f.store, "wf", json!({})).await;
    claim_one(&f.store).await;
    f.clock.advance(Duration::from_secs(11));
    f.store
        .tick()
        .await
        .expect("one broken schedule does not fail the tick");
    let jobs = all_jobs(&f.store).await;
    let state = f.store.job("default", &jobs[0].id).await.unwrap().unwrap();
    assert_eq!(
        state.tasks[0].status,
        TaskStatus::Ready,
        "the lapsed lease was handled"
    );
    let broken = f
        .store
        .schedule("default", "broken")
        .await
        .unwrap()
        .unwrap();
    assert!(broken.last_error.unwrap().contains("time zone"));
    assert_eq!(broken.next_fire_at, None);
}

async fn a_rate_limited_queue_starts_at_most_its_tokens_and_the_rest_wait_ready(f: Fixture) {
    apply_one_step(&f.store).await;
    let rate = starbridge_core::dispatch::RateLimit {
        tokens: 2,
        per: Duration::from_secs(10),
    };
    configure(
        &f.store,
        "q",
        QueueChange {
            rate: Some(Some(rate)),
            ..QueueChange::default()
        },
    )
    .await;
    for _ in 0..5 {
        submit(&f.store, "wf", json!({})).await;
    }
    assert_eq!(
        claim_n(&f.store, &["q"], 10).await.len(),
        2,
        "a full bucket: 2 tokens"
    );
    assert!(
        claim_n(&f.store, &["q"], 10).await.is_empty(),
        "rate limited, not failed"
    );
    let next = next_available_on_q(&f.store).await;
    assert_eq!(
        next,
        Some(f.store.now().saturating_add(Duration::from_secs(5)))
    );
    let states = f
        .store
        .queue_states("default", vec!["q".into()])
        .await
        .unwrap();
    assert!(states["q"].tokens.unwrap() < 1.0);
    f.clock.advance(Duration::from_secs(5));
    assert_eq!(claim_n(&f.store, &["q"], 10).await.len(), 1);
    f.clock.advance(Duration::from_secs(60));
    assert_eq!(
        claim_n(&f.store, &["q"], 10).await.len(),
        2,
        "the bucket holds at most 2"
    );
    let removed = QueueChange {
        rate: Some(None),
        ..QueueChange::default()
    };
    configure(&f.store, "q", removed).await;
    let queue = f.store.queue("default", "q").await.unwrap().unwrap();
    assert_eq!(queue.queue.config.rate, None);
}

on_both_backends!(
    a_jobs_change_mark_moves_with_its_history_and_its_runs,
    labels_merge_over_the_workflows_and_are_checked_at_apply_and_submit,
    a_schedule_gives_its_labels_to_the_jobs_it_starts,
    a_token_authenticates_until_revoked_and_only_its_hash_is_kept,
    the_audit_log_lists_entries_newest_first_per_namespace,
    finished_jobs_are_pruned_after_their_retention_and_running_ones_stay,
    history_retires_by_day_after_the_retention_and_a_running_job_keeps_its_day,
    applying_the_same_body_keeps_the_version_and_a_change_makes_a_new_one,
    invalid_definition_is_refused_with_problems_and_nothing_is_stored,
    submit_with_the_same_key_returns_the_existing_job,
    params_are_checked_against_the_schema_naming_the_field,
    a_refused_inline_definition_leaves_no_version_behind,
    an_inline_definition_runs_its_version_and_adds_one_only_when_allowed,
    a_submit_by_name_runs_the_latest_version_applied_since_the_last_submit,
    a_job_runs_to_success_and_its_history_is_stored_in_order,
    concurrent_claims_never_hand_out_the_same_task,
    lapsed_lease_is_retried_and_the_stale_report_is_refused_without_change,
    the_next_timer_and_next_available_time_are_reported,
    the_next_available_time_is_the_earliest_of_every_priority,
    a_job_is_invisible_from_another_namespace,
    dispatch_prefers_job_priority_then_age,
    a_long_poll_registration_is_woken_by_a_new_ready_task,
    a_serial_queue_runs_one_task_at_a_time_in_order,
    a_queue_concurrency_limit_bounds_running_tasks,
    a_paused_queue_keeps_its_tasks_and_hands_none_out_until_resumed,
    a_queue_that_pauses_itself_on_a_failure_hands_out_nothing_more,
    higher_priority_queues_are_served_first,
    a_task_waiting_longer_than_max_wait_goes_ahead_of_priority,
    queue_settings_are_validated,
    a_lock_lets_its_slots_run_and_queues_the_rest_first_come_first_served,
    a_lock_key_that_does_not_render_is_refused_at_submit,
    a_schedule_fires_one_job_per_fire_time_with_its_params,
    overlap_skip_starts_nothing_while_the_previous_job_runs_and_queue_one_holds_one_fire,
    catch_up_all_runs_missed_fires_up_to_its_limit,
    schedule_input_is_validated_naming_the_field,
    a_schedule_that_cannot_be_computed_stops_alone_and_timers_go_on,
    a_rate_limited_queue_starts_at_most_its_tokens_and_the_rest_wait_ready,
    jobs_survive_reopening_the_database,
    fresh_ids_are_compact_and_sort_by_creation,
);

/// Several server nodes on one PostgreSQL schema: each `Store` here is what one node opens.
mod shared_database {
    use super::*;

    /// Two nodes on one fresh schema, sharing a clock, or `None` when PostgreSQL is unreachable.
    fn two_nodes(label: &str) -> Option<(Fixture, Store)> {
        let first = Fixture::postgres(label)?;
        let second = Store::open_with_clock(&first.url, first.clock.clone()).unwrap();
        Some((first, second))
    }

    const ONE_STEP: &str = "steps:\n- {id: a, queue: q, command: c}\n";

    /// Another node's open transaction gives a job the key a submit on this node names; it
    /// commits while this node's group waits to write its new job with that key. The group
    /// loses (the key was taken first), and the submit runs again and answers with that job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_submit_whose_key_another_node_takes_as_its_group_commits_runs_again_and_finds_it() {
        let Some(f) = Fixture::postgres("key_race") else {
            return;
        };
        apply_one_step(&f.store).await;
        let taken = submit(&f.store, "wf", json!({})).await.state.job.id;
        let url = f.url.clone();
        let job = taken.to_string();
        let (other, other_pid) = tokio::task::spawn_blocking(move || {
            let mut other = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
            other.batch_execute("BEGIN").unwrap();
            other
                .execute("UPDATE jobs SET key = 'order-7' WHERE id = $1", &[&job])
                .unwrap();
            let pid: i32 = other
                .query_one("SELECT pg_backend_pid()", &[])
                .unwrap()
                .get(0);
            (other, pid)
        })
        .await
        .unwrap();
        let store = f.store.clone();
        let submitted = tokio::spawn(async move {
            let request = Submit {
                workflow: Some("wf".into()),
                key: Some("order-7".into()),
                ..Submit::default()
            };
            store.submit("default", request).await
        });
        let url = f.url.clone();
        tokio::task::spawn_blocking(move || {
            let mut watcher = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
            let waiting =
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))";
            while watcher
                .query_one(waiting, &[&other_pid])
                .unwrap()
                .get::<_, i64>(0)
                == 0
            {
                std::thread::yield_now();
            }
            let mut other = other;
            other.batch_execute("COMMIT").unwrap();
        })
        .await
        .unwrap();
        let submitted = submitted.await.unwrap().unwrap();
        assert!(!submitted.created, "the key's job was found, not made");
        assert_eq!(submitted.state.job.id, taken);
        let all = JobFilter {
            namespace: "default".into(),
            limit: 10,
            ..JobFilter::default()
        };
        let jobs = f.store.jobs(all).await.unwrap();
        assert_eq!(jobs.len(), 1, "the lost group left no job behind");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poll_on_one_node_is_woken_by_work_made_ready_on_another() {
        let Some((a, b)) = two_nodes("wake_across") else {
            return;
        };
        a.store
            .apply_workflow("default", "wf", definition(ONE_STEP))
            .await
            .unwrap();
        let poll = b.notifier().register("default", &["q".to_owned()]);
        submit(&a.store, "wf", json!({})).await;
        // A liveness bound, not a measurement: the wake is pushed by NOTIFY, not polled.
        tokio::time::timeout(std::time::Duration::from_secs(10), poll.notified())
            .await
            .expect("node b's poll was woken by node a's commit");
        assert_eq!(claim_n(&b, &["q"], 10).await.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_on_two_nodes_at_once_never_hand_out_the_same_task() {
        let Some((a, b)) = two_nodes("claim_across") else {
            return;
        };
        a.store
            .apply_workflow("default", "wf", definition(ONE_STEP))
            .await
            .unwrap();
        for _ in 0..200 {
            submit(&a.store, "wf", json!({})).await;
        }
        let mut handles = Vec::new();
        for store in [a.store.clone(), b.clone(), a.store.clone(), b.clone()] {
            handles.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let claimed = claim_n(&store, &["q"], 7).await;
                    if claimed.is_empty() {
                        return mine;
                    }
                    mine.extend(claimed.into_iter().map(|c| c.task.id));
                }
            }));
        }
        let mut seen = HashSet::new();
        for handle in handles {
            for task in handle.await.unwrap() {
                assert!(seen.insert(task), "a task was claimed twice");
            }
        }
        assert_eq!(seen.len(), 200, "every ready task was claimed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serial_queue_runs_one_task_at_a_time_across_nodes() {
        let Some((a, b)) = two_nodes("serial_across") else {
            return;
        };
        a.store
            .apply_workflow("default", "wf", definition(ONE_STEP))
            .await
            .unwrap();
        let serial = QueueChange {
            mode: Some(QueueMode::Serial),
            ..QueueChange::default()
        };
        configure(&a.store, "q", serial).await;
        for _ in 0..20 {
            submit(&a.store, "wf", json!({})).await;
        }
        let mut claims = Vec::new();
        for store in [a.store.clone(), b.clone(), a.store.clone(), b.clone()] {
            claims.push(tokio::spawn(
                async move { claim_n(&store, &["q"], 5).await },
            ));
        }
        let mut running = 0;
        for claim in claims {
            running += claim.await.unwrap().len();
        }
        assert_eq!(running, 1, "a serial queue hands out one task at a time");
    }
}

/// What `Store::health` answers, and what it costs: a recent write answers, a probe write is made
/// only when none succeeded lately, at most one at a time.
mod health_checks {
    use super::*;

    /// Write requests the writer ran so far.
    fn requests(store: &Store) -> u64 {
        store.writer_stats().requests
    }

    async fn health_answers_from_a_recent_write_and_probes_only_when_none_succeeded_lately(
        f: Fixture,
    ) {
        // Nothing written yet since the store opened: a probe write answers.
        let before = requests(&f.store);
        let health = f.store.health().await;
        assert_eq!(health.fault, None, "{health:?}");
        assert!(health.detail.contains("probe"), "{health:?}");
        assert_eq!(requests(&f.store), before + 1, "one probe write");

        // That probe, then any write, answers the following checks: no more writes.
        assert_eq!(f.store.health().await.fault, None);
        f.store
            .apply_workflow("default", "w", definition(TWO_STEPS))
            .await
            .unwrap();
        let before = requests(&f.store);
        for _ in 0..5 {
            let health = f.store.health().await;
            assert_eq!(health.fault, None, "{health:?}");
            assert!(health.detail.contains("the last one"), "{health:?}");
        }
        assert_eq!(requests(&f.store), before, "a recent write answers");

        // No write for longer than `HEALTHY_WRITE_AGE`: one probe write.
        f.clock.advance(Duration::from_secs(11));
        let health = f.store.health().await;
        assert_eq!(health.fault, None, "{health:?}");
        assert!(health.detail.contains("probe"), "{health:?}");
        assert_eq!(requests(&f.store), before + 1);
    }

    async fn health_checks_at_once_make_at_most_one_probe_write(f: Fixture) {
        f.store
            .apply_workflow("default", "w", definition(TWO_STEPS))
            .await
            .unwrap();
        f.clock.advance(Duration::from_secs(11));
        let before = requests(&f.store);
        let checks: Vec<_> = (0..20)
            .map(|_| {
                let store = f.store.clone();
                tokio::spawn(async move { store.health().await })
            })
            .collect();
        for check in checks {
            let health = check.await.unwrap();
            assert_eq!(health.fault, None, "{health:?}");
        }
        assert_eq!(requests(&f.store), before + 1, "one probe for all");
    }

    on_both_backends!(
        health_answers_from_a_recent_write_and_probes_only_when_none_succeeded_lately,
        health_checks_at_once_make_at_most_one_probe_write,
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_stamped_after_now_because_the_clock_went_back_is_not_taken_as_recent() {
        let f = Fixture::sqlite();
        let later = Timestamp(f.store.now().0 + 3_600_000);
        f.store.inner.last_write.record(later, None);
        let before = requests(&f.store);
        let health = f.store.health().await;
        assert_eq!(health.fault, None, "{health:?}");
        assert!(health.detail.contains("clock"), "{health:?}");
        assert_eq!(requests(&f.store), before + 1, "a probe write answered");
    }

    /// Makes PostgreSQL refuse writes to `table` with `sqlstate`, as it does when its disk is
    /// full (53100) or it is read-only (25006); `None` lifts it.
    fn refuse_writes(f: &Fixture, table: &str, sqlstate: Option<&str>) {
        let Some(sqlstate) = sqlstate else {
            f.raw_sql(&format!("DROP TRIGGER IF EXISTS refuse ON {table}"));
            return;
        };
        f.raw_sql(&format!(
            "CREATE OR REPLACE FUNCTION refuse_{sqlstate}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused for the test' USING ERRCODE = '{sqlstate}'; END $$; \
             DROP TRIGGER IF EXISTS refuse ON {table}; \
             CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON {table} \
             FOR EACH ROW EXECUTE FUNCTION refuse_{sqlstate}()"
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_refusing_writes_for_want_of_space_or_read_only_is_named_until_a_probe_succeeds()
     {
        let Some(f) = Fixture::postgres("health_faults") else {
            return;
        };
        // A request PostgreSQL refuses for want of space is answered so, and health says so.
        refuse_writes(&f, "namespaces", Some("53100"));
        let refused = f
            .store
            .apply_workflow("elsewhere", "w", definition(TWO_STEPS))
            .await
            .unwrap_err();
        assert!(matches!(refused, Error::Full(_)), "{refused:?}");
        let health = f.store.health().await;
        assert_eq!(health.fault, Some(WriteFault::Full), "{health:?}");
        assert!(
            health.detail.contains("the last write failed"),
            "{health:?}"
        );
        refuse_writes(&f, "namespaces", None);

        // The probe write meets the same refusal, then a read-only database.
        refuse_writes(&f, "health_probe", Some("53100"));
        f.clock.advance(Duration::from_secs(2));
        let health = f.store.health().await;
        assert_eq!(health.fault, Some(WriteFault::Full), "{health:?}");
        assert!(health.detail.contains("probe"), "{health:?}");
        refuse_writes(&f, "health_probe", Some("25006"));
        f.clock.advance(Duration::from_secs(2));
        let health = f.store.health().await;
        assert_eq!(health.fault, Some(WriteFault::ReadOnly), "{health:?}");

        // Once writes go through again, the next probe says so.
        refuse_writes(&f, "health_probe", None);
        f.clock.advance(Duration::from_secs(2));
        let health = f.store.health().await;
        assert_eq!(health.fault, None, "{health:?}");
        assert!(health.detail.contains("probe"), "{health:?}");
    }
}
