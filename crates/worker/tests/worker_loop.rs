//! Tests of the worker loop against a small in-process fake of the server's task endpoints
//! (poll with the successes it carries, heartbeat, complete, fail, check-later) over an
//! in-memory list of tasks.
//!
//! The fake reports everything it receives on a channel, before answering, so a test can wait for
//! exactly the request it expects; timeouts here only keep a broken test from hanging.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use starbridge_api::{
    BatchItem, CheckLaterRequest, CompleteRequest, CompleteTask, CompleteTasks,
    CompleteTasksResponse, FailRequest, FieldProblem, HeartbeatRequest, HeartbeatResponse,
    JobStatus, LeasedTask, PollRequest, PollResponse, Problem, ReportResponse, TaskKind,
    TaskStatus, Timestamp, paths,
};
use starbridge_worker::shell::ShellExecutor;
use starbridge_worker::{Client, Outcome, TaskContext, Worker, WorkerBuilder};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

/// What the fake server received.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Polled {
        max_tasks: u32,
        /// Tasks leased and not yet reported when the poll came in.
        outstanding: usize,
    },
    PollRefused,
    Heartbeat {
        task: String,
    },
    ReportRefused {
        task: String,
    },
    Completed {
        task: String,
        output: Value,
        logs: Option<Value>,
    },
    Failed {
        task: String,
        message: String,
        retryable: bool,
        logs: Option<Value>,
    },
    CheckLater {
        task: String,
        after_ms: u64,
        progress: Option<Value>,
    },
}

impl Event {
    fn is_report(&self) -> bool {
        matches!(
            self,
            Event::Completed { .. } | Event::Failed { .. } | Event::CheckLater { .. }
        )
    }
}

#[derive(Default)]
struct Fake {
    pending: Mutex<VecDeque<LeasedTask>>,
    task_added: Notify,
    outstanding: AtomicUsize,
    /// Answer this many polls with 503.
    failing_polls: AtomicU32,
    /// Answer this many reports with 503.
    failing_reports: AtomicU32,
    /// Tasks whose heartbeats (and batched completions) get 409 (the lease is stale).
    stale_leases: Mutex<HashSet<String>>,
    /// Batch completion requests received.
    batches: AtomicUsize,
    /// Successes received with polls.
    carried: AtomicUsize,
    /// Answer this many polls that carry successes with 503, taking none of them.
    failing_carrying_polls: AtomicU32,
    /// Refuse polls that carry successes, as a server from before them does.
    predates_carried_completions: AtomicBool,
    /// Hold polls that carry successes until `release_carrying` (`held` wakes for each).
    hold_carrying: AtomicBool,
    carrying_released: Notify,
    held: Notify,
    /// Polls being answered now, and the most at once.
    polls_in_flight: AtomicUsize,
    most_polls_in_flight: AtomicUsize,
    events: Mutex<Option<mpsc::UnboundedSender<Event>>>,
}

impl Fake {
    fn record(&self, event: Event) {
        if let Some(events) = self.events.lock().expect("events lock").as_ref() {
            let _ = events.send(event);
        }
    }

    fn push(&self, task: LeasedTask) {
        self.pending.lock().expect("pending lock").push_back(task);
        self.task_added.notify_waiters();
    }

    fn take(&self, max: usize) -> Vec<LeasedTask> {
        let mut pending = self.pending.lock().expect("pending lock");
        let count = max.min(pending.len());
        let taken: Vec<LeasedTask> = pending.drain(..count).collect();
        self.outstanding.fetch_add(taken.len(), Ordering::SeqCst);
        taken
    }

    fn reported(&self) {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
    }

    /// True when this report should be refused with a 503.
    fn refuse_report(&self, task: &str) -> bool {
        let refused = count_down(&self.failing_reports);
        if refused {
            self.record(Event::ReportRefused {
                task: task.to_owned(),
            });
        }
        refused
    }

    fn release_carrying(&self) {
        self.hold_carrying.store(false, Ordering::SeqCst);
        self.carrying_released.notify_waiters();
    }

    /// Waits while polls that carry successes are held.
    async fn carrying_may_pass(&self) {
        loop {
            let released = self.carrying_released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.hold_carrying.load(Ordering::SeqCst) {
                return;
            }
            self.held.notify_one();
            released.await;
        }
    }
}

/// Counts a poll as in flight while it lives (an answer, or the worker cutting it off).
struct PollInFlight<'a>(&'a AtomicUsize);

impl<'a> PollInFlight<'a> {
    fn enter(fake: &'a Fake) -> Self {
        let now = fake.polls_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        fake.most_polls_in_flight.fetch_max(now, Ordering::SeqCst);
        PollInFlight(&fake.polls_in_flight)
    }
}

impl Drop for PollInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Takes one from `counter` unless it is 0; true when it did.
fn count_down(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = Problem {
        kind: "about:blank".to_owned(),
        title: status.canonical_reason().unwrap_or("error").to_owned(),
        status: status.as_u16(),
        detail: detail.to_owned(),
        errors: Vec::new(),
        limit: None,
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        Json(body),
    )
        .into_response()
}

/// How a server refuses a body field it does not know.
fn unknown_field(field: &str) -> Response {
    let message = format!("unknown field `{field}`, expected one of `worker_id`, `queues`");
    let body = Problem {
        kind: "/problems/invalid-request".to_owned(),
        title: "Invalid request".to_owned(),
        status: 400,
        detail: format!("body: {message}"),
        errors: vec![FieldProblem {
            field: "body".to_owned(),
            message,
        }],
        limit: None,
    };
    let content_type = [(header::CONTENT_TYPE, "application/problem+json")];
    (StatusCode::BAD_REQUEST, content_type, Json(body)).into_response()
}

fn accepted(status: TaskStatus) -> Response {
    Json(ReportResponse {
        task_status: status.into(),
        job_status: JobStatus::Running.into(),
    })
    .into_response()
}

async fn poll(State(fake): State<Arc<Fake>>, Json(request): Json<PollRequest>) -> Response {
    let _in_flight = PollInFlight::enter(&fake);
    if count_down(&fake.failing_polls) {
        fake.record(Event::PollRefused);
        return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
    }
    if !request.complete.is_empty() {
        fake.carrying_may_pass().await;
        if count_down(&fake.failing_carrying_polls) {
            fake.record(Event::PollRefused);
            return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
        }
        if fake.predates_carried_completions.load(Ordering::SeqCst) {
            fake.record(Event::PollRefused);
            return unknown_field("complete");
        }
        fake.carried
            .fetch_add(request.complete.len(), Ordering::SeqCst);
    }
    // The successes it carries are reported before it claims, each as the batch form would
    // (one refused while the server restarts, as a report on its own would be).
    let reports = request
        .complete
        .into_iter()
        .map(|task| {
            if fake.refuse_report(&task.id) {
                return BatchItem::Refused {
                    error: Problem {
                        kind: "/problems/unavailable".into(),
                        title: "Service Unavailable".into(),
                        status: 503,
                        detail: "restarting".into(),
                        errors: Vec::new(),
                        limit: None,
                    },
                };
            }
            complete_item(&fake, task)
        })
        .collect();
    let max_tasks = request.max_tasks.unwrap_or(1);
    fake.record(Event::Polled {
        max_tasks,
        outstanding: fake.outstanding.load(Ordering::SeqCst),
    });
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
    let max = usize::try_from(max_tasks).unwrap_or(usize::MAX);
    let waited = tokio::time::timeout(wait, async {
        loop {
            let added = fake.task_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let tasks = fake.take(max);
            if !tasks.is_empty() {
                return tasks;
            }
            added.await;
        }
    })
    .await;
    Json(PollResponse {
        tasks: waited.unwrap_or_default(),
        max_output_bytes: 256 * 1024,
        reports,
    })
    .into_response()
}

async fn heartbeat(
    State(fake): State<Arc<Fake>>,
    Path(task): Path<String>,
    Json(_request): Json<HeartbeatRequest>,
) -> Response {
    if fake.stale_leases.lock().expect("lock").contains(&task) {
        return problem(StatusCode::CONFLICT, "the lease is stale");
    }
    fake.record(Event::Heartbeat { task });
    Json(HeartbeatResponse {
        lease_expires_at: Timestamp::now(),
    })
    .into_response()
}

async fn complete(
    State(fake): State<Arc<Fake>>,
    Path(task): Path<String>,
    Json(request): Json<CompleteRequest>,
) -> Response {
    if fake.refuse_report(&task) {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
    }
    fake.reported();
    fake.record(Event::Completed {
        task,
        output: request.output,
        logs: request.logs,
    });
    accepted(TaskStatus::Succeeded)
}

/// The batch form: each item is handled as `complete` would; a whole batch may be refused.
async fn complete_many(
    State(fake): State<Arc<Fake>>,
    Json(request): Json<CompleteTasks>,
) -> Response {
    fake.batches.fetch_add(1, Ordering::SeqCst);
    if let Some(first) = request.tasks.first()
        && fake.refuse_report(&first.id)
    {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
    }
    let items = request
        .tasks
        .into_iter()
        .map(|task| complete_item(&fake, task))
        .collect();
    Json(CompleteTasksResponse { items }).into_response()
}

/// One success of a batch or of a poll: refused when its lease is stale.
fn complete_item(fake: &Fake, task: CompleteTask) -> BatchItem<ReportResponse> {
    if fake
        .stale_leases
        .lock()
        .expect("stale lock")
        .contains(&task.id)
    {
        return BatchItem::Refused {
            error: Problem {
                kind: "/problems/conflict".into(),
                title: "Conflict".into(),
                status: 409,
                detail: "stale lease".into(),
                errors: Vec::new(),
                limit: None,
            },
        };
    }
    fake.reported();
    fake.record(Event::Completed {
        task: task.id,
        output: task.output,
        logs: task.logs,
    });
    BatchItem::Done(ReportResponse {
        task_status: TaskStatus::Succeeded.into(),
        job_status: JobStatus::Running.into(),
    })
}

async fn fail(
    State(fake): State<Arc<Fake>>,
    Path(task): Path<String>,
    Json(request): Json<FailRequest>,
) -> Response {
    if fake.refuse_report(&task) {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
    }
    fake.reported();
    fake.record(Event::Failed {
        task,
        message: request.error.message,
        retryable: request.error.retryable,
        logs: request.logs,
    });
    accepted(TaskStatus::Failed)
}

async fn check_later(
    State(fake): State<Arc<Fake>>,
    Path(task): Path<String>,
    Json(request): Json<CheckLaterRequest>,
) -> Response {
    if fake.refuse_report(&task) {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "restarting");
    }
    fake.reported();
    fake.record(Event::CheckLater {
        task,
        after_ms: request.after_ms,
        progress: request.progress,
    });
    accepted(TaskStatus::Waiting)
}

/// A running fake server and the events it records.
struct Server {
    fake: Arc<Fake>,
    events: mpsc::UnboundedReceiver<Event>,
    client: Client,
    _serving: JoinHandle<()>,
}

impl Server {
    async fn start() -> Self {
        let fake = Arc::new(Fake::default());
        let (sender, events) = mpsc::unbounded_channel();
        *fake.events.lock().expect("events lock") = Some(sender);
        let router = Router::new()
            .route(paths::TASKS_POLL, post(poll))
            .route(paths::TASK_HEARTBEAT, post(heartbeat))
            .route(paths::TASK_COMPLETE, post(complete))
            .route(paths::TASKS_COMPLETE, post(complete_many))
            .route(paths::TASK_FAIL, post(fail))
            .route(paths::TASK_CHECK_LATER, post(check_later))
            .with_state(Arc::clone(&fake));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let address = listener.local_addr().expect("local address");
        let serving = tokio::spawn(async move {
            axum::serve(listener, router)
                .await
                .expect("fake server runs");
        });
        let client = Client::new(format!("http://{address}")).expect("valid base url");
        Server {
            fake,
            events,
            client,
            _serving: serving,
        }
    }

    fn worker(&self) -> WorkerBuilder {
        Worker::builder(self.client.clone())
            .worker_id("w1")
            .queues(["q"])
            .retry_backoff(Duration::from_millis(10), Duration::from_millis(50))
    }

    /// The next event received.
    async fn next_event(&mut self) -> Event {
        within(self.events.recv())
            .await
            .expect("the fake server keeps its event sender")
    }

    /// The next report received (complete, fail, check-later), and the events before it.
    async fn next_report(&mut self) -> (Event, Vec<Event>) {
        let mut before = Vec::new();
        loop {
            let event = self.next_event().await;
            if event.is_report() {
                return (event, before);
            }
            before.push(event);
        }
    }

    /// The reports among the events received so far.
    fn reports_received(&mut self) -> Vec<Event> {
        self.received()
            .into_iter()
            .filter(Event::is_report)
            .collect()
    }

    /// Every event received so far (call after the worker stopped).
    fn received(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            events.push(event);
        }
        events
    }
}

/// A worker running in the background until `stop` is called.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<()>,
}

impl Running {
    fn start(worker: Worker) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(worker.run(async move {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            run,
        }
    }

    /// Asks the worker to shut down and waits until `run` returns.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        within(&mut self.run)
            .await
            .expect("the worker loop does not panic");
    }
}

/// Awaits `future`, failing the test if it hangs (a guard, not a timing assertion).
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("timed out: the test is stuck")
}

fn leased(id: &str, command: &str, lease_ms: u64) -> LeasedTask {
    LeasedTask {
        id: id.to_owned(),
        lease_token: format!("lease-{id}"),
        job_id: "job_1".to_owned(),
        step: format!("step-{id}"),
        kind: TaskKind::Step.into(),
        item: None,
        queue: "q".to_owned(),
        command: command.to_owned(),
        input: json!({"n": 1}),
        attempt: 1,
        idempotency_key: format!("key-{id}"),
        lease_expires_at: Timestamp::now(),
        lease_ms,
        progress: None,
        callback_token: format!("sbc_{id}"),
        traceparent: None,
    }
}

fn completed(task: &str, output: Value) -> Event {
    Event::Completed {
        task: task.to_owned(),
        output,
        logs: None,
    }
}

#[tokio::test]
async fn no_more_handlers_run_at_once_than_the_concurrency() {
    let mut server = Server::start().await;
    for i in 0..6 {
        server.fake.push(leased(&format!("t{i}"), "work", 30_000));
    }
    let gate = Arc::new(Semaphore::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let most_running = Arc::new(AtomicUsize::new(0));
    let (started, mut starts) = mpsc::unbounded_channel::<String>();
    let handler = {
        let (gate, running, most_running) = (gate.clone(), running.clone(), most_running.clone());
        move |task: TaskContext| {
            let (gate, running, most_running) =
                (gate.clone(), running.clone(), most_running.clone());
            let started = started.clone();
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most_running.fetch_max(now, Ordering::SeqCst);
                let _ = started.send(task.id().to_owned());
                gate.acquire().await.expect("gate open").forget();
                running.fetch_sub(1, Ordering::SeqCst);
                Outcome::complete(json!({}))
            }
        }
    };
    let worker = server
        .worker()
        .concurrency(2)
        .handler("q", "work", handler)
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    within(starts.recv()).await.expect("a first handler starts");
    within(starts.recv())
        .await
        .expect("a second handler starts");
    assert_eq!(running.load(Ordering::SeqCst), 2);
    // Let one handler finish at a time: each frees the slot for exactly one more.
    for _ in 0..4 {
        gate.add_permits(1);
        within(starts.recv()).await.expect("another handler starts");
    }
    gate.add_permits(2);
    let mut reports = 0;
    while reports < 6 {
        let (report, _) = server.next_report().await;
        assert!(matches!(report, Event::Completed { .. }), "{report:?}");
        reports += 1;
    }
    worker.stop().await;

    assert_eq!(most_running.load(Ordering::SeqCst), 2);
    for event in server.received() {
        if let Event::Polled {
            max_tasks,
            outstanding,
        } = event
        {
            assert!(
                max_tasks >= 1 && max_tasks as usize + outstanding <= 2,
                "polled for {max_tasks} with {outstanding} running"
            );
        }
    }
}

#[tokio::test]
async fn a_long_handler_is_heartbeated_until_it_finishes() {
    let mut server = Server::start().await;
    // A 300 ms lease: heartbeats every 100 ms.
    server.fake.push(leased("t1", "slow", 300));
    let release = Arc::new(Notify::new());
    let handler = {
        let release = release.clone();
        move |_task: TaskContext| {
            let release = release.clone();
            async move {
                release.notified().await;
                Outcome::complete(json!({"done": true}))
            }
        }
    };
    let worker = server
        .worker()
        .handler("q", "slow", handler)
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let mut heartbeats = 0;
    while heartbeats < 3 {
        match server.next_event().await {
            Event::Heartbeat { task } => {
                assert_eq!(task, "t1");
                heartbeats += 1;
            }
            Event::Polled { .. } => {}
            other => panic!("unexpected {other:?} before the handler was released"),
        }
    }
    release.notify_one();
    let (report, _) = server.next_report().await;
    assert_eq!(report, completed("t1", json!({"done": true})));
    worker.stop().await;
}

#[tokio::test]
async fn a_stale_lease_on_heartbeat_cancels_the_handler_and_drops_its_report() {
    let mut server = Server::start().await;
    server
        .fake
        .stale_leases
        .lock()
        .expect("lock")
        .insert("t1".to_owned());
    server.fake.push(leased("t1", "slow", 300));
    let (cancelled, mut cancellations) = mpsc::unbounded_channel::<()>();
    let handler = move |task: TaskContext| {
        let cancelled = cancelled.clone();
        async move {
            task.cancelled().await;
            assert!(task.is_cancelled());
            let _ = cancelled.send(());
            Outcome::complete(json!({"too": "late"}))
        }
    };
    let worker = server
        .worker()
        .handler("q", "slow", handler)
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    within(cancellations.recv())
        .await
        .expect("the handler sees the cancellation");
    // Shutdown waits for the task's supervisor, so a report would have arrived by now.
    worker.stop().await;
    let events = server.received();
    assert!(
        !events.iter().any(Event::is_report),
        "reported despite a stale lease: {events:?}"
    );
}

#[tokio::test]
async fn a_report_refused_with_503_is_retried_until_accepted() {
    let mut server = Server::start().await;
    server.fake.failing_reports.store(2, Ordering::SeqCst);
    server.fake.push(leased("t1", "work", 30_000));
    let worker = server
        .worker()
        .handler("q", "work", |task: TaskContext| async move {
            Outcome::complete(json!({"input": task.input().clone()}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let (report, before) = server.next_report().await;
    assert_eq!(report, completed("t1", json!({"input": {"n": 1}})));
    let refused: Vec<&Event> = before
        .iter()
        .filter(|event| matches!(event, Event::ReportRefused { .. }))
        .collect();
    assert_eq!(
        refused,
        [
            &Event::ReportRefused { task: "t1".into() },
            &Event::ReportRefused { task: "t1".into() },
        ]
    );
    worker.stop().await;
}

#[tokio::test]
async fn on_an_older_server_successes_are_batched_answered_retried_and_a_stale_one_dropped() {
    let mut server = Server::start().await;
    server
        .fake
        .predates_carried_completions
        .store(true, Ordering::SeqCst);
    server.fake.failing_reports.store(1, Ordering::SeqCst);
    server
        .fake
        .stale_leases
        .lock()
        .expect("stale lock")
        .insert("t3".into());
    for i in 0..6 {
        server.fake.push(leased(&format!("t{i}"), "work", 30_000));
    }
    let worker = server
        .worker()
        .concurrency(6)
        .batch_completions(true)
        .handler("q", "work", |task: TaskContext| async move {
            Outcome::complete(json!({"id": task.id()}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);
    let mut done = Vec::new();
    while done.len() < 5 {
        if let (Event::Completed { task, output, .. }, _) = server.next_report().await {
            assert_eq!(output, json!({"id": task}));
            done.push(task);
        }
    }
    worker.stop().await;
    done.sort();
    assert_eq!(done, ["t0", "t1", "t2", "t4", "t5"]);
    let more: Vec<Event> = server.reports_received();
    assert_eq!(
        more,
        [],
        "a task was reported twice or the stale one was kept"
    );
    // The refused batch was sent again; every request went to the batch endpoint.
    assert!(server.fake.batches.load(Ordering::SeqCst) >= 2);
    assert_eq!(server.fake.carried.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_success_rides_on_the_next_poll_and_one_whose_poll_failed_is_reported_on_its_own() {
    let mut server = Server::start().await;
    server
        .fake
        .failing_carrying_polls
        .store(1, Ordering::SeqCst);
    server.fake.push(leased("t1", "work", 30_000));
    server.fake.push(leased("t2", "work", 30_000));
    let worker = server
        .worker()
        .concurrency(1)
        .handler("q", "work", |task: TaskContext| async move {
            Outcome::complete(json!({"id": task.id()}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);
    let (first, before) = server.next_report().await;
    assert_eq!(first, completed("t1", json!({"id": "t1"})));
    assert!(before.contains(&Event::PollRefused), "{before:?}");
    assert_eq!(
        server.fake.carried.load(Ordering::SeqCst),
        0,
        "t1 went on its own"
    );
    let (second, _) = server.next_report().await;
    assert_eq!(second, completed("t2", json!({"id": "t2"})));
    assert_eq!(
        server.fake.carried.load(Ordering::SeqCst),
        1,
        "t2 rode on a poll"
    );
    let more: Vec<Event> = server.reports_received();
    assert_eq!(more, [], "a success was reported twice");
    // The poll that carried t2 still waits for work: stopping cuts it off, and t2's success is
    // sent again on its own (a real server answers it as the first time).
    worker.stop().await;
    let resent: Vec<Event> = server.reports_received();
    assert_eq!(resent, [completed("t2", json!({"id": "t2"}))]);
}

#[tokio::test]
async fn a_success_finishing_while_a_poll_waits_for_work_rides_a_poll_of_its_own_at_once() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "work", 30_000));
    let worker = server
        .worker()
        .concurrency(4)
        .handler("q", "work", |task: TaskContext| async move {
            Outcome::complete(json!({"id": task.id()}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);
    let (report, before) = server.next_report().await;
    assert_eq!(report, completed("t1", json!({"id": "t1"})));
    // The first poll found one task for four slots, so the next one, for the other three, waits
    // for work; t1's slot started a third, which carried its success (a poll is recorded after
    // the successes it carried).
    assert_eq!(
        before,
        [
            Event::Polled {
                max_tasks: 4,
                outstanding: 0
            },
            Event::Polled {
                max_tasks: 3,
                outstanding: 1
            },
        ]
    );
    assert_eq!(
        server.next_event().await,
        Event::Polled {
            max_tasks: 1,
            outstanding: 0
        }
    );
    assert_eq!(server.fake.carried.load(Ordering::SeqCst), 1);
    server.fake.push(leased("t2", "work", 30_000));
    let (second, _) = server.next_report().await;
    assert_eq!(second, completed("t2", json!({"id": "t2"})));
    assert_eq!(server.fake.carried.load(Ordering::SeqCst), 2);
    assert_eq!(server.reports_received(), [], "a success went on its own");
    worker.stop().await;
}

#[tokio::test]
async fn successes_finishing_while_a_poll_of_their_own_is_out_wait_for_it_and_go_together() {
    let mut server = Server::start().await;
    for id in ["t1", "t2", "t3"] {
        server.fake.push(leased(id, "work", 30_000));
    }
    server.fake.hold_carrying.store(true, Ordering::SeqCst);
    // t2 and t3 finish only once t1's poll is out; each says so as it returns.
    let gate = Arc::new(Semaphore::new(0));
    let finishing = Arc::new(Semaphore::new(0));
    let (handler_gate, handler_finishing) = (Arc::clone(&gate), Arc::clone(&finishing));
    let worker = server
        .worker()
        .concurrency(4)
        .handler("q", "work", move |task: TaskContext| {
            let (gate, finishing) = (Arc::clone(&handler_gate), Arc::clone(&handler_finishing));
            async move {
                if task.id() != "t1" {
                    gate.acquire().await.expect("gate open").forget();
                    finishing.add_permits(1);
                }
                Outcome::complete(json!({"id": task.id()}))
            }
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);
    // The first poll took all three tasks for four slots; the next waits for work with the
    // last slot, and t1's success went on a poll of its own, held by the server.
    within(server.fake.held.notified()).await;
    gate.add_permits(2);
    within(finishing.acquire_many(2))
        .await
        .expect("open")
        .forget();
    tokio::task::yield_now().await;
    server.fake.release_carrying();
    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(server.next_report().await.0);
    }
    reports.sort_by_key(|report| format!("{report:?}"));
    assert_eq!(
        reports,
        ["t1", "t2", "t3"].map(|id| completed(id, json!({ "id": id })))
    );
    assert_eq!(server.fake.carried.load(Ordering::SeqCst), 3);
    assert_eq!(
        server.fake.most_polls_in_flight.load(Ordering::SeqCst),
        2,
        "beside the poll waiting for work, one poll of successes at a time"
    );
    assert_eq!(server.reports_received(), [], "a success went on its own");
    worker.stop().await;
}

#[tokio::test]
async fn poll_errors_are_retried_without_stopping_the_worker() {
    let mut server = Server::start().await;
    server.fake.failing_polls.store(3, Ordering::SeqCst);
    server.fake.push(leased("t1", "work", 30_000));
    let worker = server
        .worker()
        .handler("q", "work", |_task: TaskContext| async {
            Outcome::complete(json!({}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let (report, before) = server.next_report().await;
    assert_eq!(report, completed("t1", json!({})));
    let refused = before
        .iter()
        .filter(|event| **event == Event::PollRefused)
        .count();
    assert_eq!(refused, 3);
    worker.stop().await;
}

#[tokio::test]
async fn a_panicking_handler_is_reported_as_a_retryable_failure() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "explode", 30_000));
    let worker = server
        .worker()
        .handler("q", "explode", |task: TaskContext| async move {
            if task.attempt() > 0 {
                panic!("boom in {}", task.step());
            }
            Outcome::complete(json!({}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let (report, _) = server.next_report().await;
    assert_eq!(
        report,
        Event::Failed {
            task: "t1".into(),
            message: "handler panicked: boom in step-t1".into(),
            retryable: true,
            logs: None,
        }
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_command_without_handler_is_a_permanent_failure() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "mystery", 30_000));
    let worker = server
        .worker()
        .handler("q", "known", |_task: TaskContext| async {
            Outcome::complete(json!({}))
        })
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let (report, _) = server.next_report().await;
    assert_eq!(
        report,
        Event::Failed {
            task: "t1".into(),
            message: "no handler for command mystery on queue q in worker w1".into(),
            retryable: false,
            logs: None,
        }
    );
    worker.stop().await;
}

#[tokio::test]
async fn outcomes_are_reported_with_their_logs_and_the_fallback_runs_other_commands() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "done", 30_000));
    server.fake.push(leased("t2", "broken", 30_000));
    server.fake.push(leased("t3", "later", 30_000));
    server
        .fake
        .push(leased("t4", r#"echo "$STARBRIDGE_INPUT""#, 30_000));
    let worker = server
        .worker()
        .concurrency(1)
        .handler("q", "done", |_task: TaskContext| async {
            Outcome::complete(json!({"ok": 1})).with_logs(json!({"lines": ["a"]}))
        })
        .handler("q", "broken", |_task: TaskContext| async {
            Outcome::fail_permanently("bad input").with_logs(json!("trace"))
        })
        .handler("q", "later", |_task: TaskContext| async {
            Outcome::CheckLater {
                after: Duration::from_millis(1500),
                progress: Some(json!({"phase": 2})),
            }
        })
        .fallback("q", ShellExecutor::new())
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    let mut reports = Vec::new();
    while reports.len() < 4 {
        reports.push(server.next_report().await.0);
    }
    worker.stop().await;
    assert_eq!(
        reports[0],
        Event::Completed {
            task: "t1".into(),
            output: json!({"ok": 1}),
            logs: Some(json!({"lines": ["a"]})),
        }
    );
    assert_eq!(
        reports[1],
        Event::Failed {
            task: "t2".into(),
            message: "bad input".into(),
            retryable: false,
            logs: Some(json!("trace")),
        }
    );
    assert_eq!(
        reports[2],
        Event::CheckLater {
            task: "t3".into(),
            after_ms: 1500,
            progress: Some(json!({"phase": 2})),
        }
    );
    let Event::Completed { task, output, logs } = &reports[3] else {
        panic!("the shell task completes: {:?}", reports[3]);
    };
    assert_eq!(task, "t4");
    assert_eq!(output, &json!({"n": 1}));
    let logs = logs.as_ref().expect("the shell executor sends logs");
    assert_eq!(logs["stdout"], "{\"n\":1}\n");
    assert_eq!(logs["exit_code"], 0);
}

#[tokio::test]
async fn graceful_shutdown_waits_for_running_handlers_to_finish_and_report() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "work", 30_000));
    let (started, mut starts) = mpsc::unbounded_channel::<()>();
    let handler = move |task: TaskContext| {
        let started = started.clone();
        async move {
            let _ = started.send(());
            // Finishes only once shutdown has begun.
            task.shutting_down().await;
            Outcome::complete(json!({"finished": "after shutdown began"}))
        }
    };
    let worker = server
        .worker()
        .handler("q", "work", handler)
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    within(starts.recv()).await.expect("the handler starts");
    worker.stop().await;
    let reports: Vec<Event> = server.reports_received();
    assert_eq!(
        reports,
        [completed("t1", json!({"finished": "after shutdown began"}))]
    );
}

#[tokio::test]
async fn handlers_still_running_after_the_grace_period_are_cancelled_and_abandoned() {
    let mut server = Server::start().await;
    server.fake.push(leased("t1", "stuck", 30_000));
    let (started, mut starts) = mpsc::unbounded_channel::<()>();
    let (dropped, mut drops) = mpsc::unbounded_channel::<bool>();

    /// Tells whether the task was cancelled when the handler's future is dropped.
    struct OnDrop(TaskContext, mpsc::UnboundedSender<bool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.1.send(self.0.is_cancelled());
        }
    }

    let handler = move |task: TaskContext| {
        let (started, dropped) = (started.clone(), dropped.clone());
        async move {
            let _guard = OnDrop(task, dropped);
            let _ = started.send(());
            std::future::pending::<()>().await;
            Outcome::complete(json!({}))
        }
    };
    let worker = server
        .worker()
        .shutdown_grace(Duration::from_millis(100))
        .handler("q", "stuck", handler)
        .build()
        .expect("valid worker");
    let worker = Running::start(worker);

    within(starts.recv()).await.expect("the handler starts");
    worker.stop().await;
    let cancelled = within(drops.recv())
        .await
        .expect("the abandoned handler is dropped");
    assert!(cancelled, "the task is cancelled before being abandoned");
    let events = server.received();
    assert!(
        !events.iter().any(Event::is_report),
        "an abandoned task is not reported: {events:?}"
    );
}
