//! The row-level suite: each test writes rows through `rows` and reads them back, on a fresh
//! SQLite file and on a PostgreSQL schema of its own (see `scratch`), so both backends map every
//! table alike. What the rows mean is tested in the engine's behaviour suite.

use serde_json::{Value, json};
use starbridge_core::dispatch::{Bucket, OnError, QueueConfig, QueueMode, RateLimit};
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{
    CallbackAnswer, CallbackCallKind, CallbackGrant, ErrorKind, Event, EventKind, Job, JobLock,
    JobStatus, Outcome, ParentLink, Parked, Signal, Task, TaskError, TaskKind, TaskLimits,
    TaskStatus, Wait, WaitFor, WindDown,
};
use starbridge_core::schedule::{CatchUp, Overlap};
use starbridge_core::time::{Duration, Timestamp};
use starbridge_core::webhook::WebhookEvent;

use super::audit::AuditEntry;
use super::schedules::StoredSchedule;
use super::tokens::{Scope, Token};
use super::webhooks::Webhook;
use super::*;
use crate::db::{Backend, Conn, Queries, args};
use crate::deferred::WriteConn;
use crate::scratch::ScratchSchema;
use crate::{JobFilter, StoreOptions, StoredQueue, StoredQueuePrefix, StoredWorkflow};

const NOW: Timestamp = Timestamp(1_700_000_000_000);

/// A migrated database of its own, through the writer's kind of connection (rows held back
/// until `flush` or a statement that needs them).
struct Db {
    conn: WriteConn,
    /// Where the database lives (a directory or a schema), dropped after the connection.
    _place: Box<dyn std::any::Any>,
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("rows.db").display());
        Db::open(&url, Box::new(dir))
    }

    /// `None` when no PostgreSQL server is reachable (and none is required).
    fn postgres(label: &str) -> Option<Db> {
        let schema = ScratchSchema::create(label)?;
        let url = schema.url.clone();
        Some(Db::open(&url, Box::new(schema)))
    }

    fn open(url: &str, place: Box<dyn std::any::Any>) -> Db {
        let opened = crate::open(url, &StoreOptions::default(), NOW.0).unwrap();
        Db {
            conn: WriteConn::new(opened.writer),
            _place: place,
        }
    }

    /// Writes a job with its tasks and their events, as the writer does.
    fn insert(&mut self, job: &Job, tasks: &[Task], events: &[Event]) {
        self.conn.defer_job(job);
        for task in tasks {
            self.conn.defer_task(&job.namespace, task);
        }
        for event in events {
            let step = event
                .task
                .as_ref()
                .and_then(|id| tasks.iter().find(|task| &task.id == id))
                .map(|task| task.step.as_str());
            self.conn.defer_event(&job.id, step, event);
        }
        self.conn.flush().unwrap();
    }
}

/// Runs each listed test on both backends: `sqlite::name` and `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&mut super::Db::sqlite());
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    if let Some(mut db) = super::Db::postgres(stringify!($name)) {
                        super::$name(&mut db);
                    }
                }
            )*
        }
    };
}

on_both_backends!(
    history_partitions_are_made_ahead_and_a_day_retires_whole_after_its_jobs,
    a_long_running_jobs_history_keeps_its_day_partition_past_retention,
    children_read_back_with_their_parent_and_their_endings_wait_for_it,
    labels_read_back_filter_jobs_and_go_with_their_job,
    waits_and_signals_read_back_and_waits_fall_due,
    a_job_reads_back_with_its_tasks_and_events,
    row_versions_read_back_with_their_rows_and_change_with_each_write,
    a_rewritten_job_row_is_found_by_its_status_also_after_a_rolled_back_rewrite,
    the_job_list_pages_newest_first_by_creation_time,
    claim_candidates_come_in_dispatch_order,
    the_oldest_starving_tasks_come_even_past_the_priorities_the_first_tasks_reached,
    queue_settings_and_buckets_read_back,
    queue_pages_filter_by_prefix_and_text_and_count_what_each_holds,
    queue_prefix_settings_read_back,
    lock_slots_go_to_the_oldest_queued_job,
    parked_tasks_leave_the_claim_order_and_wait_in_line,
    rate_buckets_read_back_fall_due_and_are_pruned_once_refilled,
    workflow_versions_read_back,
    schedules_read_back_and_fall_due,
    webhooks_and_their_deliveries_read_back,
    tokens_and_audit_entries_read_back,
    an_event_after_the_newest_history_was_deleted_is_still_read_by_the_rollup,
);

fn job(unique: &str, created_at: Timestamp) -> Job {
    Job {
        id: JobId::from_unique(unique),
        namespace: "default".to_owned(),
        workflow: "wf".to_owned(),
        version: 1,
        status: JobStatus::Running,
        params: json!({"size": 3}),
        key: None,
        priority: 0,
        created_at,
        started_at: Some(created_at),
        ended_at: None,
        deadline_at: None,
        wind_down: None,
        compensation_planned: false,
        completions: 0,
        round: 0,
        lock: None,
        signals_received: 0,
        output: None,
        failed_steps: Vec::new(),
        parent: None,
        depth: 0,
        child_versions: Default::default(),
        labels: Default::default(),
    }
}

/// A ready task of `job` on `queue`.
fn task(job: &Job, seq: u32, queue: &str, priority: i32, available_at: Timestamp) -> Task {
    Task {
        id: TaskId::from_unique(&format!("{}-{seq}", &job.id.as_str()[4..])),
        job_id: job.id.clone(),
        seq,
        kind: TaskKind::Step,
        step: format!("s{seq}"),
        item: None,
        compensates: None,
        queue: queue.to_owned(),
        command: "run".to_owned(),
        status: TaskStatus::Ready,
        priority,
        attempt: 0,
        checking: false,
        available_at: Some(available_at),
        deadline_at: None,
        lease_token: None,
        lease_expires_at: None,
        worker_id: None,
        input: None,
        output: None,
        error: None,
        progress: None,
        logs: None,
        created_at: job.created_at,
        ready_at: Some(available_at),
        started_at: None,
        ended_at: None,
        completed_seq: None,
        held: false,
        round: 0,
        attempt_base: 0,
        wait: None,
        pending_outcome: None,
        callback: None,
        child: None,
        limits: None,
        claimed_at: None,
    }
}

fn event(at: Timestamp, kind: EventKind, task: Option<&Task>) -> Event {
    Event {
        at,
        kind,
        task: task.map(|task| task.id.clone()),
        attempt: task.map(|task| task.attempt),
        worker: task.and_then(|task| task.worker_id.clone()),
        detail: json!({"n": at.0 - NOW.0}),
    }
}

fn later(millis: i64) -> Timestamp {
    Timestamp(NOW.0 + millis)
}

fn an_event_after_the_newest_history_was_deleted_is_still_read_by_the_rollup(db: &mut Db) {
    use crate::minutes::{apply_rollup, read_rollup};
    let now = later(60_000);
    let no_lag = Duration::from_millis(0);
    let kept = finished(job("kept", NOW), later(1));
    db.insert(&kept, &[], &[event(NOW, EventKind::JobCreated, None)]);
    let newest = finished(job("newest", NOW), later(2));
    let newest_events = [
        event(later(1), EventKind::JobCreated, None),
        event(later(2), EventKind::JobSucceeded, None),
    ];
    db.insert(&newest, &[], &newest_events);
    let read = read_rollup(&mut db.conn, now, no_lag, 100).unwrap();
    assert_eq!(read.events, 3);
    assert!(apply_rollup(&mut db.conn, &read, now).unwrap());

    // The newest history goes: on SQLite the next event may take one of its ids.
    delete_job(&mut db.conn, newest.id.as_str()).unwrap();
    let next = job("next", later(3));
    db.insert(&next, &[], &[event(later(3), EventKind::JobCreated, None)]);
    let read = read_rollup(&mut db.conn, now, no_lag, 100).unwrap();
    assert_eq!(read.events, 1, "the new job's event, whatever id it took");
    assert!(apply_rollup(&mut db.conn, &read, now).unwrap());
    let read = read_rollup(&mut db.conn, now, no_lag, 100).unwrap();
    assert_eq!(read.events, 0, "and only once");
}

fn children_read_back_with_their_parent_and_their_endings_wait_for_it(db: &mut Db) {
    let parent = job("parent", NOW);
    let mut step = task(&parent, 1, "", 0, NOW);
    step.status = TaskStatus::Running;
    step.attempt = 2;
    let mut child = job("child", later(1));
    child.parent = Some(ParentLink {
        job: parent.id.clone(),
        task: step.id.clone(),
        attempt: 2,
    });
    child.depth = 1;
    child.child_versions = [("grandchild".to_owned(), 4)].into_iter().collect();
    step.child = Some(Box::new(child.id.clone()));
    db.insert(&parent, std::slice::from_ref(&step), &[]);
    db.insert(&child, &[], &[]);
    let conn = &mut db.conn;
    assert_eq!(load_job(conn, &child.id).unwrap(), Some(child.clone()));
    let state = load_job_state(conn, &parent.id).unwrap().unwrap();
    assert_eq!(state.tasks, [step.clone()]);
    assert_eq!(
        children::child_of(conn, &step.id, 2).unwrap(),
        Some(child.id.clone())
    );
    assert_eq!(children::child_of(conn, &step.id, 1).unwrap(), None);
    let of_parent = JobFilter {
        namespace: "default".to_owned(),
        parent: Some(parent.id.clone()),
        limit: 10,
        ..JobFilter::default()
    };
    assert_eq!(list_jobs(conn, &of_parent).unwrap(), [child.clone()]);

    // One child per parent attempt: a second child of the same attempt is refused.
    let mut twin = job("twin", later(2));
    twin.parent = child.parent.clone();
    db.conn.defer_job(&twin);
    assert!(
        db.conn.flush().is_err(),
        "the parent attempt already has its child"
    );
    let conn = &mut db.conn;

    // An ending waits for the parent's transaction, once per child.
    assert_eq!(next_timer(conn).unwrap(), None);
    children::note_ending(conn, &child.id, &parent.id, later(5)).unwrap();
    children::note_ending(conn, &child.id, &parent.id, later(6)).unwrap();
    assert_eq!(next_timer(conn).unwrap(), Some(later(5)));
    assert_eq!(
        children::due_endings(conn, 10).unwrap(),
        [(child.id.clone(), parent.id.clone())]
    );
    children::forget_ending(conn, &child.id).unwrap();
    assert!(children::due_endings(conn, 10).unwrap().is_empty());

    // Retention keeps a finished child while its parent is kept.
    let mut ended = child.clone();
    ended.status = JobStatus::Succeeded;
    ended.ended_at = Some(later(10));
    db.insert(&ended, &[], &[]);
    let conn = &mut db.conn;
    assert_eq!(prune_finished(conn, later(1_000), 10).unwrap(), 0);
    let mut parent_ended = parent.clone();
    parent_ended.status = JobStatus::Failed;
    parent_ended.ended_at = Some(later(20));
    db.insert(&parent_ended, &[], &[]);
    let conn = &mut db.conn;
    assert_eq!(
        prune_finished(conn, later(1_000), 10).unwrap(),
        1,
        "the parent first"
    );
    assert_eq!(
        prune_finished(conn, later(1_000), 10).unwrap(),
        1,
        "then its child"
    );
    assert_eq!(load_job(conn, &child.id).unwrap(), None);
}

fn a_job_reads_back_with_its_tasks_and_events(db: &mut Db) {
    let mut job = job("one", NOW);
    job.key = Some("order-7".to_owned());
    job.deadline_at = Some(later(60_000));
    job.lock = Some(JobLock {
        key: "db".to_owned(),
        slots: 2,
    });
    let mut done = task(&job, 1, "q", 0, NOW);
    done.status = TaskStatus::Succeeded;
    done.attempt = 2;
    done.worker_id = Some("w1".to_owned());
    done.input = Some(json!({"size": 3}));
    done.output = Some(json!(["a", "b"]));
    done.logs = Some(json!({"stdout": "ok"}));
    done.ended_at = Some(later(10));
    done.completed_seq = Some(1);
    let mut failed = task(&job, 2, "q", 5, later(10));
    failed.status = TaskStatus::Failed;
    failed.item = Some(0);
    failed.kind = TaskKind::Item;
    failed.error = Some(TaskError {
        message: "boom".to_owned(),
        retryable: false,
        kind: ErrorKind::Handler,
    });
    let mut undo = task(&job, 3, "q", 0, later(20));
    undo.kind = TaskKind::Compensation;
    undo.compensates = Some(done.id.clone());
    let tasks = [done, failed, undo];
    let mut created = event(NOW, EventKind::JobCreated, None);
    created.detail = json!({"workflow": "wf", "version": 1, "actor": "ana"});
    let written = [
        created,
        event(later(10), EventKind::TaskSucceeded, Some(&tasks[0])),
        event(later(20), EventKind::TaskFailed, Some(&tasks[1])),
    ];
    db.insert(&job, &tasks, &written);
    let conn = &mut db.conn;
    let stored_kinds: Vec<String> = conn
        .query_map(
            "SELECT kind FROM events WHERE job_id = ?1 ORDER BY seq",
            args![job.id.as_str()],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        stored_kinds,
        ["1", "2", "4"],
        "kinds are stored as their numbers"
    );
    let stored_detail: String = conn
        .query_value(
            "SELECT detail FROM events WHERE job_id = ?1 AND kind = '1'",
            args![job.id.as_str()],
        )
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stored_detail).unwrap(),
        json!({"actor": "ana"}),
        "the job's row keeps its workflow and version"
    );

    assert_eq!(load_job(conn, &job.id).unwrap(), Some(job.clone()));
    let state = load_job_state(conn, &job.id).unwrap().unwrap();
    assert_eq!((state.job, state.tasks), (job.clone(), tasks.to_vec()));
    let missing = JobId::from_unique("missing");
    assert_eq!(load_job(conn, &missing).unwrap(), None);
    let states = lock_job_states(conn, &[missing.clone(), job.id.clone()], RowLock::Wait).unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].state.tasks, tasks);
    assert_eq!(
        job_by_key(conn, "default", "order-7").unwrap(),
        Some(job.id.clone())
    );
    assert_eq!(job_by_key(conn, "other", "order-7").unwrap(), None);
    assert_eq!(
        job_of_task(conn, &tasks[1].id).unwrap(),
        Some(job.id.clone())
    );
    let unknown = TaskId::from_unique("unknown");
    assert_eq!(
        jobs_of_tasks(conn, &[tasks[2].id.clone(), unknown]).unwrap(),
        [(tasks[2].id.clone(), job.id.clone())]
    );

    let history = events(conn, &job, 0, 10).unwrap();
    let read: Vec<(Option<&str>, &Event)> = history
        .iter()
        .map(|stored| (stored.step.as_deref(), &stored.event))
        .collect();
    assert_eq!(
        read,
        [
            (None, &written[0]),
            (Some("s1"), &written[1]),
            (Some("s2"), &written[2])
        ]
    );
    assert!(history.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    let after_first = events(conn, &job, history[0].seq, 1).unwrap();
    assert_eq!(after_first.len(), 1);
    assert_eq!(after_first[0].event, written[1]);
    // One stored with them (before they were left out), and with its kind's name (before kinds
    // were numbers), reads back as it was.
    conn.execute(
        "INSERT INTO events (job_id, at, kind, detail) \
         VALUES (?1, ?2, 'job_created', '{\"workflow\":\"older\",\"version\":7}')",
        args![job.id.as_str(), later(25).0],
    )
    .unwrap();
    let last = events(conn, &job, history[2].seq, 1).unwrap();
    assert_eq!(
        last[0].event.detail,
        json!({"workflow": "older", "version": 7})
    );

    // A job row written again takes its changing columns; the others stay as first written.
    let mut ended = job.clone();
    ended.status = JobStatus::Failed;
    ended.ended_at = Some(later(30));
    ended.wind_down = Some(WindDown::StepFailed {
        task: tasks[1].id.clone(),
        step: "s2".to_owned(),
        message: "boom".to_owned(),
    });
    ended.compensation_planned = true;
    ended.completions = 1;
    ended.round = 1;
    let mut rewritten = ended.clone();
    rewritten.params = json!({"size": 4});
    db.insert(&rewritten, &[], &[]);
    let conn = &mut db.conn;
    assert_eq!(load_job(conn, &job.id).unwrap(), Some(ended.clone()));

    let filter = |status: Option<JobStatus>| JobFilter {
        namespace: "default".to_owned(),
        status,
        limit: 10,
        ..JobFilter::default()
    };
    assert_eq!(
        list_jobs(conn, &filter(Some(JobStatus::Failed))).unwrap(),
        [ended.clone()]
    );
    assert!(
        list_jobs(conn, &filter(Some(JobStatus::Running)))
            .unwrap()
            .is_empty()
    );

    // What a succeeded job produced: its output (null is an output too) and the steps it went
    // on past; a rewrite takes them, and an operator's new round clears them.
    for output in [json!({"hosts": ["h1"]}), Value::Null] {
        let mut succeeded = ended.clone();
        succeeded.status = JobStatus::Succeeded;
        succeeded.wind_down = None;
        succeeded.output = Some(output);
        succeeded.failed_steps = vec!["notify".to_owned(), "page".to_owned()];
        db.insert(&succeeded, &[], &[]);
        assert_eq!(load_job(&mut db.conn, &job.id).unwrap(), Some(succeeded));
    }
    let mut again = ended.clone();
    again.status = JobStatus::Running;
    again.round = 2;
    db.insert(&again, &[], &[]);
    assert_eq!(load_job(&mut db.conn, &job.id).unwrap(), Some(again));
}

fn row_versions_read_back_with_their_rows_and_change_with_each_write(db: &mut Db) {
    let job = job("versioned", NOW);
    let mut first = task(&job, 1, "q", 0, NOW);
    let second = task(&job, 2, "q", 0, NOW);
    db.insert(&job, &[first.clone(), second.clone()], &[]);
    let conn = &mut db.conn;
    let missing = JobId::from_unique("missing");
    let ids = [job.id.clone(), missing];
    let loaded = lock_job_states(conn, &ids, RowLock::None).unwrap();
    let now = job_row_versions(conn, &ids, RowLock::Wait).unwrap();
    if conn.backend() == Backend::Sqlite {
        assert_eq!(loaded[0].versions, None, "SQLite's rows carry no version");
        assert!(now.is_empty());
        return;
    }
    let versions = loaded[0]
        .versions
        .clone()
        .expect("PostgreSQL's rows carry one");
    assert_eq!(
        now,
        std::slice::from_ref(&versions),
        "read alone as with the rows"
    );
    let task_ids: Vec<&TaskId> = versions.tasks.iter().map(|(id, _)| id).collect();
    assert_eq!(
        task_ids,
        [&first.id, &second.id],
        "every task, in seq order"
    );

    first.status = TaskStatus::Running;
    conn.defer_task(&job.namespace, &first);
    conn.flush().unwrap();
    let after = job_row_versions(conn, std::slice::from_ref(&job.id), RowLock::None).unwrap();
    assert_eq!(after[0].row, versions.row, "the job row was not written");
    assert_eq!(after[0].tasks[1], versions.tasks[1], "nor the second task");
    assert_ne!(
        after[0].tasks[0].1, versions.tasks[0].1,
        "the first task's row is a new version"
    );
}

fn the_job_list_pages_newest_first_by_creation_time(db: &mut Db) {
    // Ids out of step with creation times (a clock that went back, or ids made before the
    // transaction): the list follows the creation time, then the id, whatever the statuses
    // (each status's jobs are read in order and merged).
    let oldest = job("c", later(0));
    let tied_low = job("a", later(10));
    let mut tied_high = job("b", later(10));
    tied_high.status = JobStatus::Succeeded;
    let mut newest = job("0", later(20));
    newest.status = JobStatus::Failed;
    let mut child = job("d", later(5));
    child.parent = Some(ParentLink {
        job: oldest.id.clone(),
        task: starbridge_core::ids::TaskId::from_unique("parent-step"),
        attempt: 1,
    });
    for job in [&oldest, &tied_low, &tied_high, &newest, &child] {
        db.insert(job, &[], &[]);
    }
    let conn = &mut db.conn;
    let page = |conn: &mut WriteConn, before: Option<&Job>, more: JobFilter| -> Vec<JobId> {
        let filter = JobFilter {
            namespace: "default".to_owned(),
            before: before.map(|job| crate::JobCursor {
                created_at: job.created_at,
                id: job.id.clone(),
            }),
            limit: 2,
            ..more
        };
        list_jobs(conn, &filter)
            .unwrap()
            .into_iter()
            .map(|job| job.id)
            .collect()
    };
    let all = JobFilter::default;
    assert_eq!(
        page(conn, None, all()),
        [newest.id.clone(), tied_high.id.clone()]
    );
    assert_eq!(
        page(conn, Some(&tied_high), all()),
        [tied_low.id.clone(), child.id.clone()]
    );
    assert_eq!(page(conn, Some(&child), all()), vec![oldest.id.clone()]);
    assert_eq!(
        page(
            conn,
            Some(&tied_high),
            JobFilter {
                status: Some(JobStatus::Running),
                ..all()
            }
        ),
        [tied_low.id.clone(), child.id.clone()],
        "a status reads its own index in the same order"
    );
    assert_eq!(
        page(
            conn,
            None,
            JobFilter {
                status: Some(JobStatus::Succeeded),
                ..all()
            }
        ),
        [tied_high.id.clone()]
    );
    let children = || JobFilter {
        parent: Some(oldest.id.clone()),
        ..all()
    };
    assert_eq!(page(conn, None, children()), [child.id.clone()]);
    assert!(page(conn, Some(&child), children()).is_empty());
    let named = || JobFilter {
        ids: Some(vec![
            oldest.id.clone(),
            newest.id.clone(),
            tied_low.id.clone(),
        ]),
        ..all()
    };
    assert_eq!(
        page(conn, None, named()),
        [newest.id.clone(), tied_low.id.clone()]
    );
    assert_eq!(
        page(conn, Some(&tied_low), named()),
        vec![oldest.id.clone()]
    );

    // Jobs of one millisecond and one status, written out of id order (the list indexes end
    // with the creation time): sorted by id as a list reaches them, a page of one at a time.
    let tied: Vec<Job> = ["t3", "t1", "t2"]
        .into_iter()
        .map(|unique| Job {
            namespace: "ties".to_owned(),
            ..job(unique, later(30))
        })
        .collect();
    for job in &tied {
        db.insert(job, &[], &[]);
    }
    for status in [None, Some(JobStatus::Running)] {
        let mut before: Option<crate::JobCursor> = None;
        let mut walked = Vec::new();
        loop {
            let filter = JobFilter {
                namespace: "ties".to_owned(),
                status,
                before: before.clone(),
                limit: 1,
                ..JobFilter::default()
            };
            let Some(last) = list_jobs(&mut db.conn, &filter).unwrap().pop() else {
                break;
            };
            before = Some(crate::JobCursor {
                created_at: last.created_at,
                id: last.id.clone(),
            });
            walked.push(last.id);
        }
        assert_eq!(
            walked,
            [tied[0].id.clone(), tied[2].id.clone(), tied[1].id.clone()],
            "status {status:?}"
        );
    }
}

fn labels_read_back_filter_jobs_and_go_with_their_job(db: &mut Db) {
    let labelled = |unique: &str, namespace: &str, labels: &[(&str, &str)]| {
        let mut job = job(unique, NOW);
        job.namespace = namespace.to_owned();
        job.labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        job
    };
    let both = labelled("both", "default", &[("team", "storage"), ("env", "prod")]);
    let team = labelled("team", "default", &[("team", "storage")]);
    let bare = labelled("bare", "default", &[]);
    let elsewhere = labelled("elsewhere", "other", &[("team", "storage")]);
    for job in [&both, &team, &bare, &elsewhere] {
        db.conn.defer_job(job);
        db.conn.defer_labels(job);
    }
    db.conn.flush().unwrap();
    let conn = &mut db.conn;
    let label_rows = |conn: &mut WriteConn, job: &Job| -> u64 {
        conn.query_value(
            "SELECT COUNT(*) FROM job_labels WHERE job_id = ?1",
            args![job.id.as_str()],
        )
        .unwrap()
    };
    assert_eq!(load_job(conn, &both.id).unwrap(), Some(both.clone()));
    assert_eq!(load_job(conn, &bare.id).unwrap(), Some(bare.clone()));
    assert_eq!(label_rows(conn, &both), 2);
    assert_eq!(
        label_rows(conn, &bare),
        0,
        "a job without labels writes no label row"
    );

    let select =
        |labels: &[(&str, &str)], status: Option<JobStatus>, before: Option<&JobId>| JobFilter {
            namespace: "default".to_owned(),
            status,
            before: before.map(|id| crate::JobCursor {
                created_at: Timestamp(0),
                id: id.clone(),
            }),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            limit: 10,
            ..JobFilter::default()
        };
    let ids = |conn: &mut WriteConn, filter: &JobFilter| -> Vec<JobId> {
        list_jobs(conn, filter)
            .unwrap()
            .into_iter()
            .map(|job| job.id)
            .collect()
    };
    let mut storage = vec![both.id.clone(), team.id.clone()];
    storage.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        ids(conn, &select(&[("team", "storage")], None, None)),
        storage
    );
    assert_eq!(
        ids(
            conn,
            &select(&[("team", "storage"), ("env", "prod")], None, None)
        ),
        vec![both.id.clone()]
    );
    assert_eq!(
        ids(
            conn,
            &select(&[("env", "prod"), ("team", "other")], None, None)
        ),
        []
    );
    assert_eq!(
        ids(
            conn,
            &select(&[("team", "storage")], Some(JobStatus::Failed), None)
        ),
        []
    );
    assert_eq!(
        ids(
            conn,
            &select(
                &[("team", "storage")],
                Some(JobStatus::Running),
                Some(&storage[0])
            )
        ),
        vec![storage[1].clone()]
    );
    // Only the ids given, with the labels or alone; another namespace's job is not there.
    let only = |labels: &[(&str, &str)], given: &[&Job]| JobFilter {
        ids: Some(given.iter().map(|job| job.id.clone()).collect()),
        ..select(labels, None, None)
    };
    assert_eq!(ids(conn, &only(&[], &[&bare, &both, &elsewhere])), {
        let mut expected = vec![both.id.clone(), bare.id.clone()];
        expected.sort_by(|a, b| b.cmp(a));
        expected
    });
    assert_eq!(
        ids(conn, &only(&[("team", "storage")], &[&bare, &team])),
        vec![team.id.clone()]
    );
    assert_eq!(ids(conn, &only(&[], &[])), []);
    let search = crate::browse::JobSearch {
        namespace: "default".to_owned(),
        labels: vec![("env".to_owned(), "prod".to_owned())],
        limit: 10,
        ..Default::default()
    };
    let lines = crate::browse::jobs(conn, &search).unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].id, both.id);
    let counts = crate::browse::status_counts(conn, &search, 100).unwrap();
    let running = counts
        .iter()
        .find(|c| c.status == JobStatus::Running)
        .unwrap();
    assert_eq!(running.count, 1);
    let by_text = crate::browse::JobSearch {
        text: Some("job_".to_owned()),
        ..search
    };
    assert_eq!(crate::browse::jobs(conn, &by_text).unwrap(), lines);

    // Pruning a finished job takes its labels with it.
    let mut ended = both.clone();
    ended.status = JobStatus::Succeeded;
    ended.ended_at = Some(later(10));
    db.insert(&ended, &[], &[]);
    let conn = &mut db.conn;
    assert_eq!(prune_finished(conn, later(20), 10).unwrap(), 1);
    assert_eq!(label_rows(conn, &both), 0);
    assert_eq!(label_rows(conn, &team), 1);
}

fn waits_and_signals_read_back_and_waits_fall_due(db: &mut Db) {
    let mut job = job("waits", NOW);
    job.signals_received = 2;
    let mut sleeping = task(&job, 1, "", 0, NOW);
    sleeping.status = TaskStatus::Running;
    sleeping.wait = Some(Box::new(Wait {
        since: NOW,
        on: WaitFor::Sleep { until: later(500) },
    }));
    let mut awaiting = task(&job, 2, "q", 0, NOW);
    awaiting.status = TaskStatus::Running;
    awaiting.attempt = 1;
    awaiting.wait = Some(Box::new(Wait {
        since: NOW,
        on: WaitFor::Callback {
            until: later(300),
            timeout: Duration::from_secs(60),
        },
    }));
    awaiting.callback = Some(Box::new(CallbackGrant {
        attempt: 1,
        round: 0,
        hash: "abc".to_owned(),
        answered: Some(CallbackAnswer {
            call: CallbackCallKind::Complete,
            digest: "d".to_owned(),
        }),
    }));
    let mut approval = task(&job, 3, "", 0, NOW);
    approval.status = TaskStatus::Running;
    approval.held = true;
    approval.wait = Some(Box::new(Wait {
        since: NOW,
        on: WaitFor::Approval {
            prompt: "go?".to_owned(),
        },
    }));
    approval.pending_outcome = Some(Box::new(Outcome::Succeeded(json!({"approved": true}))));
    let tasks = [sleeping, awaiting, approval];
    db.insert(&job, &tasks, &[]);
    let conn = &mut db.conn;
    let signal = |seq: u32, name: &str, id: Option<&str>| Signal {
        seq,
        name: name.to_owned(),
        payload: json!({"n": seq}),
        id: id.map(str::to_owned),
        sender: "tester".to_owned(),
        received_at: later(i64::from(seq)),
    };
    insert_signal(conn, &job, &signal(0, "go", Some("first"))).unwrap();
    insert_signal(conn, &job, &signal(1, "stop", None)).unwrap();
    consume_signal(conn, &job.id, 0, &tasks[0].id).unwrap();

    let state = load_job_state(conn, &job.id).unwrap().unwrap();
    assert_eq!(state.tasks, tasks);
    assert_eq!(
        state.signals,
        [signal(1, "stop", None)],
        "only those not taken"
    );
    assert!(signal_seen(conn, &job.id, "first").unwrap());
    assert!(!signal_seen(conn, &job.id, "second").unwrap());
    assert_eq!(next_timer(conn).unwrap(), Some(later(300)));
    assert!(due_jobs(conn, later(299), 10).unwrap().is_empty());
    assert_eq!(
        pending_approvals(conn, "default", 10).unwrap(),
        [(tasks[2].clone(), "wf".to_owned())]
    );
    assert!(pending_approvals(conn, "other", 10).unwrap().is_empty());
    assert_eq!(due_jobs(conn, later(300), 10).unwrap(), [job.id.clone()]);
}

/// Candidates as their task ids without the prefix, "(starving)" after those starving.
fn described(candidates: Vec<starbridge_core::dispatch::Candidate>) -> Vec<String> {
    candidates
        .iter()
        .map(|candidate| {
            let id = &candidate.task.as_str()[4..];
            if candidate.starving {
                format!("{id} (starving)")
            } else {
                id.to_owned()
            }
        })
        .collect()
}

fn claim_candidates_come_in_dispatch_order(db: &mut Db) {
    let job = job("claims", NOW);
    let mut held = task(&job, 1, "q", 9, NOW);
    held.held = true;
    let mut running = task(&job, 2, "q", 0, NOW);
    running.status = TaskStatus::Running;
    let tasks = [
        held,
        running,
        task(&job, 3, "q", 0, later(-5_000)),
        task(&job, 4, "q", 1, later(-10)),
        task(&job, 5, "q", 0, later(-20_000)),
        task(&job, 6, "q", 7, later(1_000)),
        task(&job, 7, "other", 9, later(-30_000)),
    ];
    db.insert(&job, &tasks, &[]);
    let conn = &mut db.conn;
    let config = QueueConfig {
        max_wait: Duration::from_secs(10),
        ..QueueConfig::default()
    };
    let ready = |conn: &mut dyn Conn, limit: u32| {
        described(
            claim_candidates(conn, "default", "q", &config, NOW, limit, Pass::Ready)
                .unwrap()
                .0,
        )
    };
    assert_eq!(
        ready(conn, 10),
        ["claims-4", "claims-5 (starving)", "claims-3"],
        "priority, then age: held, running and future tasks are not candidates, and those \
         claimable since before max_wait are starving"
    );
    assert_eq!(
        ready(conn, 1),
        ["claims-4", "claims-5 (starving)"],
        "the oldest starving task of a priority the first tasks did not reach comes too"
    );
    let more = |conn: &mut dyn Conn, limit: u32| {
        claim_candidates(conn, "default", "q", &config, NOW, limit, Pass::Ready)
            .unwrap()
            .1
    };
    assert!(
        !more(conn, 3),
        "a read of as many as the queue holds leaves none behind"
    );
    assert!(more(conn, 2), "a read of fewer leaves some behind");
    assert_eq!(running_count(conn, "default", "q").unwrap(), 1);
    assert_eq!(running_count(conn, "default", "other").unwrap(), 0);
    assert_eq!(
        next_available(conn, "default", "q", false).unwrap(),
        Some(later(-20_000))
    );
    assert_eq!(
        next_available(conn, "default", "none", false).unwrap(),
        None
    );
}

fn queue_settings_and_buckets_read_back(db: &mut Db) {
    let conn = &mut db.conn;
    ensure_queue(conn, "default", "b", NOW).unwrap();
    ensure_queue(conn, "default", "b", later(5)).unwrap();
    let made = queue(conn, "default", "b").unwrap().unwrap();
    assert_eq!(
        (made.config, made.bucket, made.created_at, made.updated_at),
        (QueueConfig::default(), None, NOW, None)
    );
    assert!(
        !made.configured,
        "a queue made on first use follows prefix settings"
    );
    let config = QueueConfig {
        mode: QueueMode::Serial,
        priority: 3,
        concurrency: Some(4),
        paused: true,
        max_wait: Duration::from_secs(90),
        rate: Some(RateLimit {
            tokens: 5,
            per: Duration::from_secs(2),
        }),
        on_error: OnError::Pause,
    };
    let stored = StoredQueue {
        namespace: "default".to_owned(),
        name: "a".to_owned(),
        config: config.clone(),
        bucket: None,
        created_at: NOW,
        updated_at: None,
        configured: true,
        paused_reason: Some("task t failed".to_owned()),
    };
    save_queue(conn, &stored, later(1)).unwrap();
    let bucket = Bucket {
        tokens: 2.5,
        at: later(2),
    };
    save_bucket(conn, "default", "a", bucket).unwrap();
    let read = queue(conn, "default", "a").unwrap().unwrap();
    assert_eq!(
        (read.config, read.bucket, read.created_at, read.updated_at),
        (config, Some(bucket), NOW, Some(later(1)))
    );
    assert!(read.configured);
    assert_eq!(read.paused_reason.as_deref(), Some("task t failed"));
    // A queue stops on error once: a second failure keeps the first reason.
    assert!(stop_on_error(conn, "default", "b", "task u failed", later(3)).unwrap());
    assert!(!stop_on_error(conn, "default", "b", "task v failed", later(4)).unwrap());
    let stopped = queue(conn, "default", "b").unwrap().unwrap();
    assert!(stopped.config.paused);
    assert_eq!(stopped.paused_reason.as_deref(), Some("task u failed"));
    let all = QueueSearch {
        namespace: "default".to_owned(),
        limit: 10,
        ..QueueSearch::default()
    };
    assert_eq!(page_names(conn, &all), ["a", "b"]);
    assert!(queue(conn, "other", "a").unwrap().is_none());
}

fn page_names(conn: &mut dyn crate::db::Conn, search: &QueueSearch) -> Vec<String> {
    queue_page(conn, search, NOW)
        .unwrap()
        .into_iter()
        .map(|(queue, _)| queue.name)
        .collect()
}

fn queue_pages_filter_by_prefix_and_text_and_count_what_each_holds(db: &mut Db) {
    let job = job("pages", NOW);
    let mut running = task(&job, 1, "agent-b", 0, later(-1_000));
    running.status = TaskStatus::Running;
    let mut held = task(&job, 2, "agent-b", 0, later(-1_000));
    held.held = true;
    let tasks = [
        running,
        held,
        task(&job, 3, "agent-b", 0, later(-3_000)),
        task(&job, 4, "agent-b", 0, later(5_000)),
        task(&job, 5, "agent-c", 0, later(-10)),
    ];
    db.insert(&job, &tasks, &[]);
    let conn = &mut db.conn;
    for name in [
        "agent-a", "agent-b", "agent-c", "agentx", "db", "my_agent", "myXagent",
    ] {
        ensure_queue(conn, "default", name, NOW).unwrap();
    }
    ensure_queue(conn, "other", "agent-z", NOW).unwrap();
    let search =
        |prefix: Option<&str>, text: Option<&str>, after: Option<&str>, limit| QueueSearch {
            namespace: "default".to_owned(),
            prefix: prefix.map(str::to_owned),
            text: text.map(str::to_owned),
            after: after.map(str::to_owned),
            limit,
        };
    assert_eq!(
        page_names(conn, &search(Some("agent-"), None, None, 10)),
        ["agent-a", "agent-b", "agent-c"]
    );
    assert_eq!(
        page_names(conn, &search(Some("agent-"), None, Some("agent-a"), 1)),
        ["agent-b"],
        "the page after a cursor"
    );
    assert_eq!(
        page_names(conn, &search(None, Some("AGENT"), None, 10)),
        [
            "agent-a", "agent-b", "agent-c", "agentx", "myXagent", "my_agent"
        ],
        "any case, in byte order"
    );
    assert_eq!(
        page_names(conn, &search(None, Some("y_a"), None, 10)),
        ["my_agent"],
        "'_' is a character, not a wildcard"
    );
    assert_eq!(
        page_names(conn, &search(Some("agent"), Some("-c"), None, 10)),
        ["agent-c"]
    );
    assert!(page_names(conn, &search(Some("zzz"), None, None, 10)).is_empty());
    let (queue, stats) = queue_line(conn, "default", "agent-b", NOW)
        .unwrap()
        .unwrap();
    assert_eq!(queue.name, "agent-b");
    assert_eq!(
        (stats.ready, stats.running, stats.oldest_ready_age),
        (2, 1, Duration::from_secs(3)),
        "ready but not held (a later one counts, and is not the oldest), and running"
    );
    let (_, idle) = queue_line(conn, "default", "agent-a", NOW)
        .unwrap()
        .unwrap();
    assert_eq!((idle.ready, idle.running), (0, 0));
    assert!(
        queue_line(conn, "default", "agent-z", NOW)
            .unwrap()
            .is_none()
    );
}

fn queue_prefix_settings_read_back(db: &mut Db) {
    let conn = &mut db.conn;
    let agents = StoredQueuePrefix {
        namespace: "default".to_owned(),
        prefix: "agent-".to_owned(),
        config: QueueConfig {
            mode: QueueMode::Serial,
            priority: -2,
            concurrency: Some(3),
            paused: false,
            max_wait: Duration::from_secs(30),
            rate: Some(RateLimit {
                tokens: 4,
                per: Duration::from_secs(60),
            }),
            on_error: OnError::Pause,
        },
        created_at: NOW,
        updated_at: NOW,
    };
    let every = StoredQueuePrefix {
        prefix: String::new(),
        config: QueueConfig::default(),
        ..agents.clone()
    };
    queue_prefixes::save(conn, &agents).unwrap();
    queue_prefixes::save(conn, &every).unwrap();
    assert_eq!(
        queue_prefixes::list(conn, "default").unwrap(),
        [every.clone(), agents.clone()]
    );
    let changed = StoredQueuePrefix {
        config: QueueConfig::default(),
        updated_at: later(5),
        ..agents.clone()
    };
    queue_prefixes::save(conn, &changed).unwrap();
    assert_eq!(
        queue_prefixes::get(conn, "default", "agent-").unwrap(),
        Some(changed)
    );
    assert!(queue_prefixes::list(conn, "other").unwrap().is_empty());
    assert!(queue_prefixes::delete(conn, "default", "agent-").unwrap());
    assert!(!queue_prefixes::delete(conn, "default", "agent-").unwrap());
    assert_eq!(queue_prefixes::list(conn, "default").unwrap(), [every]);
}

fn lock_slots_go_to_the_oldest_queued_job(db: &mut Db) {
    let lock = JobLock {
        key: "db".to_owned(),
        slots: 1,
    };
    for (unique, at) in [("b-second", later(1)), ("a-first", NOW)] {
        let mut job = job(unique, at);
        job.status = JobStatus::Queued;
        job.lock = Some(lock.clone());
        db.insert(&job, &[], &[]);
    }
    let conn = &mut db.conn;
    let first = JobId::from_unique("a-first");
    assert_eq!(
        first_queued(conn, "default", "db").unwrap(),
        Some((first.clone(), NOW))
    );
    assert_eq!(first_queued(conn, "default", "other").unwrap(), None);
    assert_eq!(lock_holders(conn, "default", "db").unwrap(), 0);
    hold_lock(conn, "default", "db", &first, NOW).unwrap();
    assert_eq!(lock_holders(conn, "default", "db").unwrap(), 1);
    assert_eq!(lock_holders(conn, "other", "db").unwrap(), 0);
    // A task's slot of its step's lock counts against the same key.
    let task = TaskId::from_unique("t");
    hold_task_lock(conn, "default", "db", &first, &task, NOW).unwrap();
    assert_eq!(lock_holders(conn, "default", "db").unwrap(), 2);
    release_lock(conn, &first).unwrap();
    assert_eq!(lock_holders(conn, "default", "db").unwrap(), 1);
    release_task_lock(conn, &task).unwrap();
    assert_eq!(lock_holders(conn, "default", "db").unwrap(), 0);
}

fn parked_tasks_leave_the_claim_order_and_wait_in_line(db: &mut Db) {
    let job = job("parks", NOW);
    let parked = |seq: u32, since: Timestamp| {
        let mut task = task(&job, seq, "q", 0, NOW);
        task.limits = Some(Box::new(TaskLimits {
            lock: Some("db".to_owned()),
            rate: None,
            slot: None,
            parked: Some(Parked {
                line: Parked::lock_line("db"),
                since,
                reason: "waiting for lock db (1/1 held)".to_owned(),
            }),
        }));
        task
    };
    let mut paused = parked(3, NOW);
    paused.held = true;
    let tasks = [
        parked(1, later(5)),
        parked(2, NOW),
        paused,
        task(&job, 4, "q", 0, NOW),
    ];
    db.insert(&job, &tasks, &[]);
    let conn = &mut db.conn;
    let candidates = claim_candidates(
        conn,
        "default",
        "q",
        &QueueConfig::default(),
        NOW,
        10,
        Pass::Ready,
    )
    .unwrap()
    .0;
    assert_eq!(
        described(candidates),
        ["parks-4"],
        "parked tasks are out of the claim order"
    );
    let line = first_parked(conn, "default", &Parked::lock_line("db"), 10).unwrap();
    let ids: Vec<&str> = line
        .iter()
        .map(|(_, task, _)| &task.as_str()[4..])
        .collect();
    assert_eq!(
        ids,
        ["parks-2", "parks-3", "parks-1"],
        "longest parked first"
    );
    assert!(
        first_parked(conn, "default", &Parked::lock_line("other"), 10)
            .unwrap()
            .is_empty()
    );
    // A parked task reads back parked; its job's pause is its own.
    let state = load_job_state(conn, &job.id).unwrap().unwrap();
    let by_id = |unique: &str| {
        state
            .tasks
            .iter()
            .find(|task| task.id.as_str().ends_with(unique))
            .unwrap()
    };
    assert!(!by_id("parks-2").held);
    assert!(by_id("parks-3").held);
    assert_eq!(by_id("parks-1").limits, tasks[0].limits);
}

fn rate_buckets_read_back_fall_due_and_are_pruned_once_refilled(db: &mut Db) {
    let conn = &mut db.conn;
    let id = rates::BucketId {
        namespace: "default".to_owned(),
        key: "tenant-a".to_owned(),
        limit: RateLimit {
            tokens: 2,
            per: Duration::from_secs(60),
        },
    };
    let other_limit = rates::BucketId {
        limit: RateLimit {
            tokens: 5,
            per: Duration::from_secs(60),
        },
        ..id.clone()
    };
    assert_eq!(
        rates::rate_bucket(conn, &id).unwrap(),
        None,
        "a new bucket is full"
    );
    let bucket = Bucket {
        tokens: 0.0,
        at: NOW,
    };
    rates::save_rate_bucket(conn, &id, bucket).unwrap();
    rates::set_rate_wake(conn, &id, Some(later(30_000))).unwrap();
    assert_eq!(
        rates::rate_bucket(conn, &id).unwrap(),
        Some((bucket, Some(later(30_000))))
    );
    assert_eq!(
        rates::rate_bucket(conn, &other_limit).unwrap(),
        None,
        "a limit has its own"
    );
    // Taking a token keeps the wake-up of the tasks parked on the bucket.
    let taken = Bucket {
        tokens: 0.5,
        at: later(1),
    };
    rates::save_rate_bucket(conn, &id, taken).unwrap();
    assert_eq!(
        rates::rate_bucket(conn, &id).unwrap(),
        Some((taken, Some(later(30_000))))
    );
    assert!(
        rates::due_rate_buckets(conn, later(29_999), 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        rates::due_rate_buckets(conn, later(30_000), 10).unwrap(),
        std::slice::from_ref(&id)
    );
    assert_eq!(
        rates::prune_rate_buckets(conn, later(120_000)).unwrap(),
        0,
        "tasks wait on it"
    );
    rates::set_rate_wake(conn, &id, None).unwrap();
    assert_eq!(
        rates::prune_rate_buckets(conn, later(60_000)).unwrap(),
        0,
        "not refilled"
    );
    assert_eq!(rates::prune_rate_buckets(conn, later(60_001)).unwrap(), 1);
    assert_eq!(rates::rate_bucket(conn, &id).unwrap(), None);
}

fn workflow_versions_read_back(db: &mut Db) {
    let conn = &mut db.conn;
    for (version, steps) in [(1, 1), (2, 2)] {
        let stored = StoredWorkflow {
            namespace: "default".to_owned(),
            name: "wf".to_owned(),
            version,
            definition: json!({"steps": steps}),
            description: Some(format!("version {version}")),
            steps,
            created_at: later(i64::from(version)),
        };
        insert_workflow(conn, &stored).unwrap();
    }
    assert_eq!(latest_version(conn, "default", "wf").unwrap(), Some(2));
    assert_eq!(latest_version(conn, "default", "none").unwrap(), None);
    assert_eq!(
        workflow_version_of(conn, "default", "wf", &json!({"steps": 1})).unwrap(),
        Some(1)
    );
    let first = workflow(conn, "default", "wf", Some(1)).unwrap().unwrap();
    assert_eq!(
        (first.definition, first.description, first.created_at),
        (json!({"steps": 1}), Some("version 1".to_owned()), later(1))
    );
    let latest = workflow(conn, "default", "wf", None).unwrap().unwrap();
    assert_eq!((latest.version, latest.steps), (2, 2));
    let listed = list_workflows(conn, "default").unwrap();
    assert_eq!(
        listed.iter().map(|w| w.version).collect::<Vec<_>>(),
        [2],
        "the latest version of each"
    );
}

fn schedules_read_back_and_fall_due(db: &mut Db) {
    let conn = &mut db.conn;
    let nightly = StoredSchedule {
        namespace: "default".to_owned(),
        name: "nightly".to_owned(),
        workflow: "wf".to_owned(),
        params: json!({"full": true}),
        cron: "0 2 * * *".to_owned(),
        timezone: "Europe/Paris".to_owned(),
        overlap: Overlap::QueueOne,
        catch_up: CatchUp::All { limit: 3 },
        paused: false,
        next_fire_at: Some(later(-1)),
        pending_fire_at: None,
        last_fire_at: Some(later(-86_400_000)),
        last_job_id: Some(JobId::from_unique("last")),
        last_error: Some("refused".to_owned()),
        created_at: NOW,
        updated_at: NOW,
        labels: [("team".to_owned(), "storage".to_owned())].into(),
    };
    let mut later_one = nightly.clone();
    later_one.name = "hourly".to_owned();
    later_one.next_fire_at = Some(later(3_600_000));
    later_one.last_job_id = None;
    let mut paused = nightly.clone();
    paused.name = "paused".to_owned();
    paused.paused = true;
    for schedule in [&nightly, &later_one, &paused] {
        schedules::save(conn, schedule).unwrap();
    }
    assert_eq!(
        schedules::get(conn, "default", "nightly", RowLock::None).unwrap(),
        Some(nightly.clone())
    );
    assert_eq!(
        schedules::get(conn, "default", "nightly", RowLock::Wait).unwrap(),
        Some(nightly.clone())
    );
    assert_eq!(
        schedules::get(conn, "other", "nightly", RowLock::None).unwrap(),
        None
    );
    let names: Vec<String> = schedules::list(conn, "default")
        .unwrap()
        .into_iter()
        .map(|schedule| schedule.name)
        .collect();
    assert_eq!(names, ["hourly", "nightly", "paused"]);
    assert_eq!(
        schedules::due(conn, NOW).unwrap(),
        std::slice::from_ref(&nightly)
    );
    assert_eq!(schedules::next_due(conn).unwrap(), Some(later(-1)));

    // Saved again: everything changes but when it was created.
    let mut changed = nightly.clone();
    changed.cron = "0 3 * * *".to_owned();
    changed.next_fire_at = Some(later(1));
    changed.created_at = later(5);
    changed.updated_at = later(5);
    schedules::save(conn, &changed).unwrap();
    changed.created_at = NOW;
    assert_eq!(
        schedules::get(conn, "default", "nightly", RowLock::None).unwrap(),
        Some(changed)
    );
    assert!(schedules::due(conn, NOW).unwrap().is_empty());

    assert!(schedules::delete(conn, "default", "nightly").unwrap());
    assert!(!schedules::delete(conn, "default", "nightly").unwrap());
    assert_eq!(schedules::next_due(conn).unwrap(), Some(later(3_600_000)));
}

fn webhooks_and_their_deliveries_read_back(db: &mut Db) {
    let hook = Webhook {
        id: "whk_1".to_owned(),
        namespace: "default".to_owned(),
        url: "https://example.com/hook".to_owned(),
        secret: "s".repeat(32),
        workflow: Some("wf".to_owned()),
        states: vec![JobStatus::Failed, JobStatus::Succeeded],
        events: vec![WebhookEvent::JobStatusChanged, WebhookEvent::TaskFailed],
        steps: vec!["build".to_owned(), "deploy".to_owned()],
        created_at: NOW,
    };
    let conn = &mut db.conn;
    webhooks::insert(conn, &hook).unwrap();
    assert_eq!(
        webhooks::get(conn, "default", "whk_1").unwrap(),
        Some(hook.clone())
    );
    assert_eq!(webhooks::get(conn, "other", "whk_1").unwrap(), None);
    // A subscription written before it could choose its events hears of job status changes.
    conn.execute(
        "INSERT INTO webhooks (id, namespace, url, secret, workflow, states, created_at) \
         VALUES ('whk_0', 'older', 'https://example.com/old', 'secret', NULL, '[]', 0)",
        args![],
    )
    .unwrap();
    let older = webhooks::get(conn, "older", "whk_0").unwrap().unwrap();
    assert_eq!(
        (older.events, older.steps),
        (vec![WebhookEvent::JobStatusChanged], vec![])
    );
    assert_eq!(
        webhooks::list(conn, "default").unwrap(),
        std::slice::from_ref(&hook)
    );

    let mut job = job("hooked", NOW);
    job.status = JobStatus::Failed;
    for (at, n) in [(NOW, 1), (later(1), 2)] {
        deliveries::insert(conn, &hook.id, &job, &json!({"n": n}), at).unwrap();
    }
    assert_eq!(deliveries::next_attempt(conn).unwrap(), Some(NOW));
    let due = deliveries::due(conn, NOW, 10).unwrap();
    assert_eq!(due.len(), 1, "the second is not due yet");
    let first = due[0].clone();
    assert_eq!(
        (
            first.job_id.as_str(),
            first.status.as_str(),
            &first.payload,
            first.attempts,
            first.next_attempt_at
        ),
        (job.id.as_str(), "failed", &json!({"n": 1}), 0, Some(NOW))
    );
    deliveries::postpone(conn, first.id, later(60_000)).unwrap();
    assert_eq!(deliveries::next_attempt(conn).unwrap(), Some(later(1)));
    let addressed = deliveries::addressed(conn, first.clone()).unwrap().unwrap();
    assert_eq!(
        (addressed.url, addressed.secret),
        (hook.url.clone(), hook.secret.clone())
    );

    assert_eq!(deliveries::attempts(conn, first.id).unwrap(), Some(0));
    deliveries::record_failed(
        conn,
        first.id,
        1,
        Some(later(2_000)),
        Some(502),
        "bad gateway",
    )
    .unwrap();
    deliveries::record_delivered(conn, first.id, 2, later(3_000), 204).unwrap();
    let second = deliveries::of_webhook(conn, &hook.id, 10).unwrap()[0].id;
    deliveries::record_refused(conn, second, 1, "refused by policy").unwrap();
    let history = deliveries::of_webhook(conn, &hook.id, 10).unwrap();
    let outcomes: Vec<_> = history
        .iter()
        .map(|d| {
            (
                d.attempts,
                d.next_attempt_at,
                d.delivered_at,
                d.last_status,
                d.last_error.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (1, None, None, None, Some("refused by policy")),
            (2, None, Some(later(3_000)), Some(204), None),
        ],
        "newest first"
    );
    assert_eq!(deliveries::next_attempt(conn).unwrap(), None);
    assert_eq!(deliveries::attempts(conn, -1).unwrap(), None);

    // Deleting a subscription takes its pending messages; those done stay.
    deliveries::insert(conn, &hook.id, &job, &json!({"n": 3}), later(2)).unwrap();
    deliveries::delete_pending(conn, &hook.id).unwrap();
    webhooks::delete(conn, &hook.id).unwrap();
    assert_eq!(deliveries::of_webhook(conn, &hook.id, 10).unwrap().len(), 2);
    assert!(webhooks::list(conn, "default").unwrap().is_empty());
    assert!(deliveries::addressed(conn, first).unwrap().is_none());
}

fn tokens_and_audit_entries_read_back(db: &mut Db) {
    let conn = &mut db.conn;
    let worker = Token {
        id: "t1".to_owned(),
        name: "worker".to_owned(),
        namespace: Some("default".to_owned()),
        scopes: vec![Scope::Work, Scope::Read],
        queues: Some(vec!["q".to_owned()]),
        created_at: NOW,
        created_by: "root".to_owned(),
        last_used_at: None,
        revoked_at: None,
    };
    let admin = Token {
        id: "t2".to_owned(),
        name: "admin".to_owned(),
        namespace: None,
        scopes: vec![Scope::Admin],
        queues: None,
        created_at: later(1),
        ..worker.clone()
    };
    tokens::insert(conn, &worker, "hash-1").unwrap();
    tokens::insert(conn, &admin, "hash-2").unwrap();
    assert!(tokens::name_taken(conn, "worker").unwrap());
    assert!(!tokens::name_taken(conn, "nobody").unwrap());
    assert_eq!(tokens::get(conn, "t1").unwrap(), Some(worker.clone()));
    assert_eq!(
        tokens::with_secret_hash(conn, "t2").unwrap(),
        Some((admin.clone(), "hash-2".to_owned()))
    );
    assert_eq!(tokens::get(conn, "t3").unwrap(), None);
    assert_eq!(tokens::list(conn).unwrap(), [worker.clone(), admin.clone()]);
    assert_eq!(tokens::active_count(conn).unwrap(), 2);

    tokens::touch(conn, "t1", later(5)).unwrap();
    assert!(tokens::revoke(conn, "t1", later(6)).unwrap());
    assert!(
        !tokens::revoke(conn, "t1", later(7)).unwrap(),
        "revoked already"
    );
    assert!(!tokens::revoke(conn, "t3", later(7)).unwrap(), "unknown");
    let revoked = tokens::get(conn, "t1").unwrap().unwrap();
    assert_eq!(
        (revoked.last_used_at, revoked.revoked_at),
        (Some(later(5)), Some(later(6)))
    );
    assert_eq!(tokens::active_count(conn).unwrap(), 1);

    let entry = |namespace: &str, action: &str| AuditEntry {
        seq: 0,
        at: Timestamp(0),
        namespace: namespace.to_owned(),
        actor: "admin".to_owned(),
        action: action.to_owned(),
        target: "/api/v1/jobs".to_owned(),
        status: 201,
        reason: Some("because".to_owned()),
    };
    audit::insert(conn, &entry("a", "first"), later(1)).unwrap();
    audit::insert(conn, &entry("b", "second"), later(2)).unwrap();
    audit::insert(conn, &entry("a", "third"), later(3)).unwrap();
    let all = audit::list(conn, None, None, 10).unwrap();
    let actions: Vec<(&str, Timestamp)> = all.iter().map(|e| (e.action.as_str(), e.at)).collect();
    assert_eq!(
        actions,
        [
            ("third", later(3)),
            ("second", later(2)),
            ("first", later(1))
        ],
        "newest first, stamped when written"
    );
    let of_a = audit::list(conn, Some("a"), None, 10).unwrap();
    assert_eq!(
        of_a.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(),
        ["third", "first"]
    );
    let page = audit::list(conn, Some("a"), Some(of_a[0].seq), 1).unwrap();
    assert_eq!(
        page,
        [AuditEntry {
            seq: of_a[1].seq,
            at: later(1),
            ..entry("a", "first")
        }]
    );
}

const DAY: i64 = 86_400_000;

/// The day partitions of `events`, by name (none on SQLite).
fn day_partitions(db: &mut Db) -> Vec<String> {
    if db.conn.backend() == Backend::Sqlite {
        return Vec::new();
    }
    db.conn
        .query_map(
            "SELECT c.relname::TEXT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass('events') AND c.relname <> 'events_default' \
             ORDER BY 1",
            &[],
            |row| row.get::<String>(0),
        )
        .unwrap()
}

/// How many history rows of `job` are stored, reachable or not.
fn stored_events(db: &mut Db, job: &Job) -> i64 {
    db.conn
        .query_value(
            "SELECT COUNT(*) FROM events WHERE job_id = ?1",
            args![job.id.as_str()],
        )
        .unwrap()
}

fn finished(mut job: Job, ended_at: Timestamp) -> Job {
    job.status = JobStatus::Succeeded;
    job.ended_at = Some(ended_at);
    job
}

fn history_partitions_are_made_ahead_and_a_day_retires_whole_after_its_jobs(db: &mut Db) {
    let postgres = db.conn.backend() == Backend::Postgres;
    let made = partitions::make_event_partitions(&mut db.conn, NOW).unwrap();
    if postgres {
        assert_eq!(made.len(), 8, "today and a week ahead: {made:?}");
        assert_eq!(made[0], "events_20231114");
        assert_eq!(made[7], "events_20231121");
    } else {
        assert!(made.is_empty(), "SQLite keeps one table");
    }
    assert!(
        partitions::make_event_partitions(&mut db.conn, NOW)
            .unwrap()
            .is_empty(),
        "made once"
    );
    assert_eq!(day_partitions(db), made);

    // A job of today, and one whose history is older than any partition (the default
    // partition catches it). They are of two namespaces: a day is held by the jobs of each.
    let mut done = finished(job("done", NOW), later(60_000));
    done.namespace = "zeta".to_owned();
    let step = task(&done, 1, "q", 0, NOW);
    db.insert(
        &done,
        std::slice::from_ref(&step),
        &[
            event(NOW, EventKind::JobCreated, None),
            event(later(60_000), EventKind::TaskSucceeded, Some(&step)),
        ],
    );
    let old = finished(job("old", later(-100 * DAY)), later(-100 * DAY + 1));
    db.insert(
        &old,
        &[],
        &[event(later(-100 * DAY), EventKind::JobCreated, None)],
    );

    // While its job is kept, the day stays; the next day, past the retention and empty, goes.
    let cutoff = later(2 * DAY);
    let dropped = partitions::drop_retired_event_partitions(&mut db.conn, cutoff).unwrap();
    if postgres {
        assert_eq!(dropped, ["events_20231115"]);
    } else {
        assert!(dropped.is_empty());
    }
    assert_eq!(stored_events(db, &done), 2);

    assert_eq!(prune_finished(&mut db.conn, cutoff, 10).unwrap(), 2);
    assert_eq!(
        stored_events(db, &old),
        0,
        "the default partition's rows go with their job"
    );
    let dropped = partitions::drop_retired_event_partitions(&mut db.conn, cutoff).unwrap();
    if postgres {
        assert_eq!(dropped, ["events_20231114"]);
        assert_eq!(day_partitions(db), made[2..]);
    } else {
        assert!(dropped.is_empty());
    }
    assert_eq!(stored_events(db, &done), 0, "the day's history is gone");
    assert!(
        partitions::drop_retired_event_partitions(&mut db.conn, cutoff)
            .unwrap()
            .is_empty(),
        "the days not past the retention stay"
    );

    // A day the default partition caught events of moves into its partition when made.
    let later_job = job("later", later(10 * DAY));
    db.insert(
        &later_job,
        &[],
        &[event(later(10 * DAY), EventKind::JobCreated, None)],
    );
    let made = partitions::make_event_partitions(&mut db.conn, later(5 * DAY)).unwrap();
    if postgres {
        assert_eq!(
            made.len(),
            5,
            "the days after the week already made: {made:?}"
        );
        let in_default: i64 = db
            .conn
            .query_value("SELECT COUNT(*) FROM events_default", &[])
            .unwrap();
        assert_eq!(in_default, 0);
    }
    let history = events(&mut db.conn, &later_job, 0, 10).unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].event.at, later(10 * DAY));
}

fn a_long_running_jobs_history_keeps_its_day_partition_past_retention(db: &mut Db) {
    let postgres = db.conn.backend() == Backend::Postgres;
    partitions::make_event_partitions(&mut db.conn, NOW).unwrap();
    let long = job("long", NOW);
    let done = finished(job("done", NOW), later(1_000));
    db.insert(&long, &[], &[event(NOW, EventKind::JobCreated, None)]);
    db.insert(&done, &[], &[event(NOW, EventKind::JobCreated, None)]);
    partitions::make_event_partitions(&mut db.conn, later(40 * DAY)).unwrap();
    let step = task(&long, 1, "q", 0, later(40 * DAY));
    db.insert(
        &long,
        std::slice::from_ref(&step),
        &[event(
            later(40 * DAY),
            EventKind::TaskSucceeded,
            Some(&step),
        )],
    );

    // Thirty days after its start the long job still runs: the other job goes, the day stays.
    let cutoff = later(40 * DAY - 30 * DAY);
    assert_eq!(prune_finished(&mut db.conn, cutoff, 10).unwrap(), 1);
    let dropped = partitions::drop_retired_event_partitions(&mut db.conn, cutoff).unwrap();
    if postgres {
        assert_eq!(
            dropped.len(),
            7,
            "the empty days after the first: {dropped:?}"
        );
    }
    assert!(
        !dropped.contains(&"events_20231114".to_owned()),
        "the long job's first day stays"
    );
    let history = events(&mut db.conn, &long, 0, 10).unwrap();
    assert_eq!(
        history.iter().map(|e| e.event.at).collect::<Vec<_>>(),
        [NOW, later(40 * DAY)],
        "the whole history of the long job"
    );

    // Once it ended past the retention too, its days retire.
    let long = finished(long, later(41 * DAY));
    db.insert(&long, &[], &[]);
    let cutoff = later(80 * DAY);
    assert_eq!(prune_finished(&mut db.conn, cutoff, 10).unwrap(), 1);
    let dropped = partitions::drop_retired_event_partitions(&mut db.conn, cutoff).unwrap();
    if postgres {
        assert!(
            dropped.contains(&"events_20231114".to_owned()),
            "{dropped:?}"
        );
        assert!(
            dropped.contains(&"events_20231224".to_owned()),
            "{dropped:?}"
        );
        assert_eq!(stored_events(db, &long), 0);
        assert_eq!(stored_events(db, &done), 0);
    } else {
        assert!(dropped.is_empty());
    }
}

/// The jobs of `default` in `status`, as the jobs list finds them (on SQLite through the index
/// on status, which a rewrite that left the status alone did not touch).
fn jobs_in_status(db: &mut Db, status: &str) -> Vec<String> {
    let sql = match db.conn.backend() {
        Backend::Sqlite => {
            "SELECT id FROM jobs INDEXED BY jobs_status_created \
             WHERE namespace = 'default' AND status = ?1 ORDER BY id"
        }
        Backend::Postgres => "SELECT id FROM jobs WHERE namespace = 'default' AND status = ?1",
    };
    db.conn
        .query_map(sql, args![status], |row| row.get(0))
        .unwrap()
}

fn a_rewritten_job_row_is_found_by_its_status_also_after_a_rolled_back_rewrite(db: &mut Db) {
    let mut job = job("steps", NOW);
    job.deadline_at = Some(later(60_000));
    db.insert(&job, &[], &[]);
    // A step done: the status and deadline stay, the row's other columns change.
    job.completions = 1;
    db.insert(&job, &[], &[]);
    assert_eq!(
        load_job(&mut db.conn, &job.id)
            .unwrap()
            .unwrap()
            .completions,
        1
    );
    assert_eq!(jobs_in_status(db, "running"), [job.id.to_string()]);
    // A rewrite rolled back leaves the database with the earlier status: writing that rewrite
    // again must set the status, though the connection wrote the same one last.
    db.conn.batch("BEGIN; SAVEPOINT request").unwrap();
    job.status = JobStatus::Succeeded;
    db.insert(&job, &[], &[]);
    db.conn
        .batch("ROLLBACK TO request; RELEASE request; COMMIT")
        .unwrap();
    assert_eq!(jobs_in_status(db, "running"), [job.id.to_string()]);
    db.insert(&job, &[], &[]);
    assert_eq!(jobs_in_status(db, "succeeded"), [job.id.to_string()]);
    assert!(jobs_in_status(db, "running").is_empty());
    if db.conn.backend() == Backend::Sqlite {
        let check: String = db
            .conn
            .query_value("PRAGMA integrity_check", args![])
            .unwrap();
        assert_eq!(check, "ok");
    }
}

#[test]
fn every_column_a_job_upsert_sets_that_an_sqlite_index_uses_is_left_alone_when_unchanged() {
    let mut db = Db::sqlite();
    let indexes: Vec<String> = db
        .conn
        .query_map(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' \
             AND sql IS NOT NULL",
            args![],
            |row| row.get(0),
        )
        .unwrap();
    let (_, updated) = JOB_WRITE.upsert.unwrap();
    for column in updated {
        let indexed = indexes.iter().any(|sql| {
            sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|word| word == *column)
        });
        assert_eq!(
            indexed,
            JOB_INDEXED_UPDATES.contains(column),
            "{column}: an index on jobs uses it: {indexed}"
        );
    }
}

fn the_oldest_starving_tasks_come_even_past_the_priorities_the_first_tasks_reached(db: &mut Db) {
    let job = job("ages", NOW);
    // Starving past 60 s: `a` barely, at the top priority; `b` and `m` at 5, `c` at 0.
    let tasks = [
        task(&job, 1, "q", 10, later(-61_000)),
        task(&job, 2, "q", 5, later(-200_000)),
        task(&job, 3, "q", 5, later(-150_000)),
        task(&job, 4, "q", 0, later(-100_000)),
    ];
    db.insert(&job, &tasks, &[]);
    let config = QueueConfig {
        max_wait: Duration::from_secs(60),
        ..QueueConfig::default()
    };
    let (candidates, _) =
        claim_candidates(&mut db.conn, "default", "q", &config, NOW, 2, Pass::Ready).unwrap();
    assert_eq!(
        described(starbridge_core::dispatch::order(candidates, 2)),
        ["ages-2 (starving)", "ages-3 (starving)"],
        "the two oldest starving tasks, though the priority order read `a` and `b` first and \
         `m` shares `b`'s priority"
    );
}
