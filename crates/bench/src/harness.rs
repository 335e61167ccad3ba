//! The benchmark's harness: an embedded server on a fresh database, worker-SDK workers with no-op
//! handlers that record every invocation, and the HTTP calls the workloads make (submit, list,
//! read a job), all over loopback in this process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use starbridge_api as api;
use starbridge_api::client::{self, Client};
use starbridge_server::scratch::ScratchSchema;
use starbridge_server::{Durability, Engine, Server, StoreOptions, SystemClock};
use starbridge_worker::{Outcome, TaskContext, Worker};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::BenchArgs;
use super::report::{SQLITE_DURABILITY, SQLITE_RELAXED};
use super::stats::{DatabaseSize, Latencies, Scrape, Usage};

/// An HTTP client of the server at `url`.
fn client_of(url: &str) -> Result<Client> {
    Client::new(url.to_owned()).with_context(|| format!("cannot make a client of {url}"))
}

/// The queue and command of every benchmark step.
pub(crate) const QUEUE: &str = "bench";
pub(crate) const COMMAND: &str = "noop";

/// How long a wait may go without a task run before the benchmark stops waiting.
const STALL: Duration = Duration::from_secs(60);
/// How often long phases print their progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Most jobs per page of `GET /api/v1/jobs`.
const PAGE: u32 = 500;
/// How long the benchmark's workers long-poll. A stopped worker abandons its poll, which the
/// server holds until this ends (and may hand it tasks nobody will run until their lease
/// lapses): `stop_workers` waits this long for them.
const POLL_WAIT: Duration = Duration::from_millis(500);
/// How long stopping the workers and the server may take before they are left behind.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// Where the benchmark's database lives.
pub(crate) struct Database {
    pub(crate) url: String,
    /// When the embedded store answers a change (`--durability`).
    pub(crate) durability: Durability,
    place: Place,
    keep: bool,
}

enum Place {
    /// A SQLite file, in a temporary folder unless `--database` named it.
    Sqlite {
        path: PathBuf,
        temp: Option<tempfile::TempDir>,
    },
    /// A fresh schema on the PostgreSQL server `--database` named.
    Postgres(ScratchSchema),
    /// Whatever the external servers (`--servers`) were started with; `--database` may name
    /// their SQLite file, for its size.
    External { sqlite: Option<PathBuf> },
}

impl Database {
    fn choose(args: &BenchArgs) -> Result<Database> {
        if !args.servers.is_empty() {
            let sqlite = match &args.database {
                Some(url) if !url.starts_with("postgres") => {
                    Some(starbridge_server::sqlite_path(url)?)
                }
                _ => None,
            };
            return Ok(Database {
                durability: Durability::Full,
                url: args
                    .database
                    .clone()
                    .unwrap_or_else(|| "as the external servers were started".to_owned()),
                place: Place::External { sqlite },
                keep: true,
            });
        }
        if let Some(url) = &args.database {
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                let mut schema = ScratchSchema::create_on(url, "bench").map_err(|error| {
                    anyhow::anyhow!("cannot make a schema for the benchmark on {url}: {error}")
                })?;
                if args.keep {
                    schema.keep();
                }
                return Ok(Database {
                    durability: args.durability,
                    url: schema.url.clone(),
                    place: Place::Postgres(schema),
                    keep: args.keep,
                });
            }
            let path = starbridge_server::sqlite_path(url)?;
            if path.exists() && !args.reuse {
                bail!(
                    "{} exists: the benchmark wants a fresh database (pass --reuse to run in it \
                     anyway, in a namespace of its own)",
                    path.display()
                );
            }
            return Ok(Database {
                durability: args.durability,
                url: url.clone(),
                place: Place::Sqlite { path, temp: None },
                keep: true,
            });
        }
        let temp = tempfile::Builder::new()
            .prefix("starbridge-bench-")
            .tempdir()
            .context("cannot make a temporary folder for the database")?;
        let path = temp.path().join("bench.db");
        Ok(Database {
            durability: args.durability,
            url: format!("sqlite://{}", path.display()),
            place: Place::Sqlite {
                path,
                temp: Some(temp),
            },
            keep: args.keep,
        })
    }

    /// Whether the database is a PostgreSQL server on this machine (its CPU is then measured).
    pub(crate) fn is_postgres_here(&self) -> bool {
        starbridge_server::is_postgres_url(&self.url)
            && starbridge_server::postgres_is_on_this_machine(&self.url)
    }

    /// True when the database stays after the run.
    pub(crate) fn kept(&self) -> bool {
        self.keep
    }

    /// What every acknowledged change is durable against, as the database is set up.
    pub(crate) fn durability(&self) -> String {
        match &self.place {
            Place::Sqlite { .. } => match self.durability {
                Durability::Full => SQLITE_DURABILITY.to_owned(),
                Durability::Relaxed => SQLITE_RELAXED.to_owned(),
            },
            Place::Postgres(schema) => {
                let relaxed = match self.durability {
                    Durability::Full => "",
                    Durability::Relaxed => {
                        ", relaxed: the store's sessions run synchronous_commit=off, the last \
                         changes acknowledged may be lost if PostgreSQL or the machine stops"
                    }
                };
                match schema.durability() {
                    Ok(settings) => format!("postgresql {settings}{relaxed}"),
                    Err(error) => format!("postgresql (settings unreadable: {error}){relaxed}"),
                }
            }
            Place::External { .. } => "as the external servers were started".to_owned(),
        }
    }

    /// The database's size now: SQLite's file and write-ahead log, or the PostgreSQL schema's
    /// tables with their indexes (the server's WAL is shared, so not counted).
    pub(crate) fn size(&self) -> DatabaseSize {
        match &self.place {
            Place::Sqlite { path, .. } => DatabaseSize::of(path),
            Place::Postgres(schema) => DatabaseSize {
                db_bytes: schema.size_bytes().unwrap_or(0),
                wal_bytes: 0,
            },
            Place::External { sqlite: Some(path) } => DatabaseSize::of(path),
            Place::External { sqlite: None } => DatabaseSize::default(),
        }
    }

    fn finish(self) -> Result<()> {
        match self.place {
            Place::Sqlite {
                temp: Some(temp), ..
            } => {
                if self.keep {
                    let _ = temp.keep();
                } else {
                    temp.close()
                        .context("cannot remove the temporary database folder")?;
                }
            }
            // Dropping the schema removes it, unless kept.
            Place::Sqlite { temp: None, .. } | Place::Postgres(_) | Place::External { .. } => {}
        }
        Ok(())
    }
}

/// Maps `Instant`s to wall-clock milliseconds, to compare them with the server's timestamps (the
/// server runs in this process and reads the same system clock).
#[derive(Clone, Copy)]
pub(crate) struct WallClock {
    anchor: Instant,
    anchor_ms: f64,
}

impl WallClock {
    fn new() -> WallClock {
        let anchor = Instant::now();
        let anchor_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64() * 1000.0);
        WallClock { anchor, anchor_ms }
    }

    /// Milliseconds since the Unix epoch at `at`.
    pub(crate) fn epoch_ms(&self, at: Instant) -> f64 {
        if at >= self.anchor {
            self.anchor_ms + (at - self.anchor).as_secs_f64() * 1000.0
        } else {
            self.anchor_ms - (self.anchor - at).as_secs_f64() * 1000.0
        }
    }
}

/// What the no-op handler saw of one task.
#[derive(Debug, Clone)]
pub(crate) struct TaskRun {
    pub(crate) job_id: String,
    /// When the handler was first invoked for the task.
    pub(crate) first_start: Instant,
    /// When its last invocation returned.
    pub(crate) last_end: Instant,
    /// Time spent inside the handler, all invocations together.
    pub(crate) handler_time: Duration,
    /// `(attempt, invocations)` for each attempt the handler was invoked with.
    pub(crate) attempts: Vec<(u32, u32)>,
}

/// One handler invocation, as the handler recorded it.
struct Invocation {
    task_id: String,
    job_id: String,
    attempt: u32,
    start: Instant,
    end: Instant,
}

/// Every handler invocation, per task id. A handler only appends its invocation to a log (no
/// hashing, no map growing on the runtime threads the server shares while a phase runs); the
/// log is folded into the per-task map when it is read, after a phase.
#[derive(Default)]
pub(crate) struct Recorder {
    log: Mutex<Vec<Invocation>>,
    tasks: Mutex<HashMap<String, TaskRun>>,
    invocations: AtomicU64,
}

impl Recorder {
    pub(crate) fn record(&self, task: &TaskContext, start: Instant, end: Instant) {
        let invocation = Invocation {
            task_id: task.id().to_owned(),
            job_id: task.job_id().to_owned(),
            attempt: task.attempt(),
            start,
            end,
        };
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(invocation);
        self.invocations.fetch_add(1, Ordering::Relaxed);
    }

    /// Handler invocations so far.
    pub(crate) fn invocations(&self) -> u64 {
        self.invocations.load(Ordering::Relaxed)
    }

    /// Runs `read` on the record of every task.
    pub(crate) fn read<R>(&self, read: impl FnOnce(&HashMap<String, TaskRun>) -> R) -> R {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let logged = std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner));
        for invocation in logged {
            fold(&mut tasks, invocation);
        }
        read(&tasks)
    }
}

/// Adds one invocation to its task's record.
fn fold(tasks: &mut HashMap<String, TaskRun>, invocation: Invocation) {
    let Invocation {
        task_id,
        job_id,
        attempt,
        start,
        end,
    } = invocation;
    let run = tasks.entry(task_id).or_insert_with(|| TaskRun {
        job_id,
        first_start: start,
        last_end: end,
        handler_time: Duration::ZERO,
        attempts: Vec::new(),
    });
    run.first_start = run.first_start.min(start);
    run.handler_time += end - start;
    run.last_end = run.last_end.max(end);
    match run.attempts.iter_mut().find(|(a, _)| *a == attempt) {
        Some((_, count)) => *count += 1,
        None => run.attempts.push((attempt, 1)),
    }
}

/// The HTTP API of the server (or servers, taken in turn), in the benchmark's namespace. Cheap
/// to clone.
#[derive(Clone)]
pub(crate) struct Api {
    /// One client a server, each in the benchmark's namespace.
    clients: Arc<[Client]>,
    next: Arc<AtomicUsize>,
}

impl Api {
    /// The client of the next server in turn.
    fn client(&self) -> &Client {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        &self.clients[index % self.clients.len()]
    }

    pub(crate) async fn apply(&self, name: &str, definition: &str) -> Result<()> {
        self.client()
            .apply_workflow(name, definition)
            .await
            .with_context(|| format!("cannot apply workflow {name}"))?;
        Ok(())
    }

    /// Submits one job with empty params; returns its id.
    pub(crate) async fn submit(&self, workflow: &str) -> Result<String, client::Error> {
        let request = api::SubmitJob {
            workflow: Some(workflow.to_owned()),
            params: Some(json!({})),
            ..Default::default()
        };
        self.client().submit_for_id(&request).await
    }

    /// Submits `count` jobs with empty params in one request (`POST /jobs/batch`); returns each
    /// job's id or why it was refused.
    pub(crate) async fn submit_batch(
        &self,
        workflow: &str,
        count: usize,
    ) -> Result<Vec<Result<String, String>>, client::Error> {
        let job = api::SubmitJob {
            workflow: Some(workflow.to_owned()),
            params: Some(json!({})),
            ..Default::default()
        };
        let request = api::SubmitJobs {
            jobs: vec![job; count],
        };
        let answer = self.client().submit_batch(&request).await?;
        Ok(answer
            .items
            .into_iter()
            .map(|item| match item {
                api::BatchItem::Done(job) => Ok(job.id),
                api::BatchItem::Refused { error } => Err(error.detail),
            })
            .collect())
    }

    /// Every job of the namespace (with `status`, only those), page by page.
    pub(crate) async fn list_jobs(
        &self,
        status: Option<api::JobStatus>,
    ) -> Result<Vec<api::JobSummary>> {
        self.list_jobs_of(None, status).await
    }

    /// Every job of the namespace (of `workflow`, with `status`, when given), page by page.
    pub(crate) async fn list_jobs_of(
        &self,
        workflow: Option<&str>,
        status: Option<api::JobStatus>,
    ) -> Result<Vec<api::JobSummary>> {
        let mut jobs = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let query = api::JobListQuery {
                workflow: workflow.map(str::to_owned),
                status: status.map(api::Open::Known),
                limit: Some(PAGE),
                cursor: cursor.take(),
                ..api::JobListQuery::default()
            };
            let page = self
                .client()
                .jobs(&query)
                .await
                .context("cannot list jobs")?;
            jobs.extend(page.items);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(jobs),
            }
        }
    }

    /// One job with its tasks.
    pub(crate) async fn job(&self, id: &str) -> Result<api::JobView> {
        self.client()
            .job(id)
            .await
            .with_context(|| format!("cannot read job {id}"))
    }

    /// True while some job of the namespace has not ended.
    async fn unfinished(&self) -> Result<bool> {
        for &status in api::JobStatus::ALL.iter().filter(|s| !s.is_terminal()) {
            let query = api::JobListQuery {
                status: Some(status.into()),
                limit: Some(1),
                ..api::JobListQuery::default()
            };
            let page = self
                .client()
                .jobs(&query)
                .await
                .context("cannot list unfinished jobs")?;
            if !page.items.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A submitted job and the moment its submit was planned (or sent, when not paced).
pub(crate) struct SubmittedJob {
    pub(crate) id: String,
    pub(crate) planned: Instant,
}

/// What a round of submissions did.
pub(crate) struct Submission {
    pub(crate) jobs: Vec<SubmittedJob>,
    /// Submits that failed, as messages.
    pub(crate) errors: Vec<String>,
    /// Request to answer, per submit.
    pub(crate) request_latency: Latencies,
    pub(crate) first_send: Instant,
    pub(crate) last_answer: Instant,
    /// The longest a submit was sent after its planned time (paced submissions).
    pub(crate) max_lag: Duration,
}

impl Submission {
    /// An empty round that starts now, for `count` jobs.
    pub(crate) fn starting(count: usize) -> Submission {
        let now = Instant::now();
        Submission {
            jobs: Vec::with_capacity(count),
            errors: Vec::new(),
            request_latency: Latencies::new(),
            first_send: now,
            last_answer: now,
            max_lag: Duration::ZERO,
        }
    }

    pub(crate) fn seconds(&self) -> f64 {
        self.last_answer
            .saturating_duration_since(self.first_send)
            .as_secs_f64()
    }
}

/// An arrival schedule: submit `i` is planned at `start + i / rate`.
#[derive(Clone, Copy)]
pub(crate) struct Pace {
    pub(crate) start: Instant,
    pub(crate) rate: f64,
}

impl Pace {
    fn planned(&self, index: usize) -> Instant {
        self.start + Duration::from_secs_f64(index as f64 / self.rate)
    }
}

/// Prints a counter's progress to stderr every few seconds until dropped.
struct Ticker(JoinHandle<()>);

impl Ticker {
    fn start(label: String, done: Arc<AtomicUsize>, total: usize) -> Ticker {
        Ticker(tokio::spawn(async move {
            loop {
                tokio::time::sleep(PROGRESS_EVERY).await;
                eprintln!(
                    "bench: {label}: {}/{total}",
                    done.load(Ordering::Relaxed).min(total)
                );
            }
        }))
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A submit request and its answer.
struct Answer {
    /// The index of its first job in the round.
    first: usize,
    planned: Instant,
    sent: Instant,
    answered: Instant,
    submitted: Result<Vec<Result<String, String>>, client::Error>,
}

impl Answer {
    fn add_to(self, out: &mut SubmitterResult) {
        out.latency.record(self.answered - self.sent);
        out.first_send = Some(
            out.first_send
                .map_or(self.sent, |first| first.min(self.sent)),
        );
        out.last_answer = Some(
            out.last_answer
                .map_or(self.answered, |last| last.max(self.answered)),
        );
        out.max_lag = out
            .max_lag
            .max(self.sent.saturating_duration_since(self.planned));
        match self.submitted {
            Ok(items) => {
                for (offset, item) in items.into_iter().enumerate() {
                    match item {
                        Ok(id) => out.jobs.push(SubmittedJob {
                            id,
                            planned: self.planned,
                        }),
                        Err(error) => out
                            .errors
                            .push(format!("submit {} refused: {error}", self.first + offset)),
                    }
                }
            }
            Err(error) => out.errors.push(format!(
                "the submit request from job {} failed: {error}",
                self.first
            )),
        }
    }
}

/// What one submitting task's requests did.
struct SubmitterResult {
    jobs: Vec<SubmittedJob>,
    errors: Vec<String>,
    latency: Latencies,
    first_send: Option<Instant>,
    last_answer: Option<Instant>,
    max_lag: Duration,
}

impl SubmitterResult {
    fn new() -> SubmitterResult {
        SubmitterResult {
            jobs: Vec::new(),
            errors: Vec::new(),
            latency: Latencies::new(),
            first_send: None,
            last_answer: None,
            max_lag: Duration::ZERO,
        }
    }

    /// The round the submitting tasks' results make together.
    fn round(count: usize, results: Vec<SubmitterResult>) -> Submission {
        let mut submission = Submission::starting(count);
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for result in results {
            submission.jobs.extend(result.jobs);
            submission.errors.extend(result.errors);
            submission.request_latency.add(&result.latency);
            submission.max_lag = submission.max_lag.max(result.max_lag);
            first = match (first, result.first_send) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            last = last.max(result.last_answer);
        }
        submission.first_send = first.unwrap_or(submission.first_send);
        submission.last_answer = last.unwrap_or(submission.last_answer);
        submission
    }
}

/// How jobs are sent.
#[derive(Clone, Copy)]
pub(crate) enum Sending {
    /// One job per request, as fast as the submitters go.
    Single,
    /// `n` jobs per request (`POST /jobs/batch`), as fast as the submitters go.
    Batch(usize),
}

/// Sends one submit request for jobs `first..end` (one job: `POST /jobs`).
async fn send_submit(
    api: &Api,
    workflow: &str,
    first: usize,
    end: usize,
) -> Result<Vec<Result<String, String>>, client::Error> {
    if end - first == 1 {
        api.submit(workflow).await.map(|id| vec![Ok(id)])
    } else {
        api.submit_batch(workflow, end - first).await
    }
}

/// Submits `count` jobs of `workflow` from `submitters` concurrent clients as `sending` says,
/// each client sending its next request once the last one was answered (a closed loop).
pub(crate) async fn submit_jobs(
    api: &Api,
    workflow: &str,
    count: usize,
    submitters: usize,
    sending: Sending,
    label: &str,
) -> Result<Submission> {
    let per_request = match sending {
        Sending::Single => 1,
        Sending::Batch(size) => size.max(1),
    };
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let _ticker = Ticker::start(label.to_owned(), done.clone(), count);
    let mut set = JoinSet::new();
    for _ in 0..submitters.min(count) {
        let (api, workflow) = (api.clone(), workflow.to_owned());
        let (next, done) = (next.clone(), done.clone());
        set.spawn(async move {
            let mut out = SubmitterResult::new();
            loop {
                let first = next.fetch_add(per_request, Ordering::Relaxed);
                if first >= count {
                    return out;
                }
                let end = (first + per_request).min(count);
                let sent = Instant::now();
                let submitted = send_submit(&api, &workflow, first, end).await;
                Answer {
                    first,
                    planned: sent,
                    sent,
                    answered: Instant::now(),
                    submitted,
                }
                .add_to(&mut out);
                done.fetch_add(end - first, Ordering::Relaxed);
            }
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = set.join_next().await {
        results.push(joined.context("a submitter failed")?);
    }
    Ok(SubmitterResult::round(count, results))
}

/// Most paced submits waiting for their answers at once, so that a server that falls far
/// behind does not make the benchmark open connections without end.
pub(crate) const PACED_IN_FLIGHT: usize = 512;

/// Submits `count` jobs of `workflow`, one per request, each at its planned time whether or not
/// earlier ones were answered (an open loop, as independent callers arrive): a slow answer
/// delays no later submit. Past `PACED_IN_FLIGHT` unanswered submits, the next waits for one,
/// and its lag from the planned time counts in every latency measured from it.
pub(crate) async fn submit_paced(
    api: &Api,
    workflow: &str,
    count: usize,
    pace: Pace,
    label: &str,
) -> Result<Submission> {
    let done = Arc::new(AtomicUsize::new(0));
    let _ticker = Ticker::start(label.to_owned(), done.clone(), count);
    let mut out = SubmitterResult::new();
    let mut set: JoinSet<Answer> = JoinSet::new();
    for index in 0..count {
        while let Some(answered) = set.try_join_next() {
            answered.context("a submit failed")?.add_to(&mut out);
        }
        if set.len() >= PACED_IN_FLIGHT
            && let Some(answered) = set.join_next().await
        {
            answered.context("a submit failed")?.add_to(&mut out);
        }
        let planned = pace.planned(index);
        tokio::time::sleep_until(planned.into()).await;
        let (api, workflow, done) = (api.clone(), workflow.to_owned(), done.clone());
        set.spawn(async move {
            let sent = Instant::now();
            let submitted = send_submit(&api, &workflow, index, index + 1).await;
            done.fetch_add(1, Ordering::Relaxed);
            Answer {
                first: index,
                planned,
                sent,
                answered: Instant::now(),
                submitted,
            }
        });
    }
    while let Some(answered) = set.join_next().await {
        answered.context("a submit failed")?.add_to(&mut out);
    }
    Ok(SubmitterResult::round(count, vec![out]))
}

/// Workers running in this process and how to stop them.
struct RunningWorkers {
    stop: watch::Sender<bool>,
    handles: Vec<JoinHandle<()>>,
}

/// A server running in this process, and how to stop it.
struct Embedded {
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), starbridge_server::Error>>,
}

/// The server (embedded, or external ones), its database and the benchmark's workers.
pub(crate) struct Bench {
    pub(crate) api: Api,
    pub(crate) namespace: String,
    pub(crate) database: Database,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) clock: WallClock,
    /// The servers' base URLs: the embedded one, or those `--servers` named.
    servers: Vec<String>,
    /// `None` when the servers run in processes of their own.
    embedded: Option<Embedded>,
    workers: usize,
    concurrency: usize,
    batch_completions: bool,
    running: Mutex<Option<RunningWorkers>>,
}

impl Bench {
    /// Opens the database and starts the server on a free loopback port, or checks that the
    /// external servers answer (workers come later).
    pub(crate) async fn start(args: &BenchArgs) -> Result<Bench> {
        let database = Database::choose(args)?;
        let (servers, embedded) = if args.servers.is_empty() {
            let options = StoreOptions {
                durability: database.durability,
                ..StoreOptions::default()
            };
            let store = Engine::open_with(&database.url, options, Arc::new(SystemClock))
                .with_context(|| format!("cannot open {}", database.url))?;
            let server = Server::bind(store, "127.0.0.1:0").await?;
            let url = format!("http://{}", server.local_addr());
            let (stop, mut stopped) = watch::channel(false);
            let server = tokio::spawn(server.run(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }));
            (vec![url], Some(Embedded { stop, server }))
        } else {
            for url in &args.servers {
                client_of(url)?
                    .health()
                    .await
                    .with_context(|| format!("the server at {url} does not answer"))?;
            }
            (args.servers.clone(), None)
        };
        let clock = WallClock::new();
        // A namespace of the run's own, so a reused database's older jobs are not counted.
        let namespace = format!("bench-{}", clock.anchor_ms as u64);
        let clients = servers
            .iter()
            .map(|url| Ok(client_of(url)?.with_namespace(Some(namespace.clone()))))
            .collect::<Result<Vec<_>>>()?;
        let api = Api {
            clients: clients.into(),
            next: Arc::new(AtomicUsize::new(0)),
        };
        eprintln!(
            "bench: server{} at {}, database {}, namespace {namespace}",
            if servers.len() > 1 { "s" } else { "" },
            servers.join(", "),
            database.url
        );
        Ok(Bench {
            api,
            namespace,
            database,
            recorder: Arc::new(Recorder::default()),
            clock,
            servers,
            embedded,
            workers: args.workers,
            concurrency: args.concurrency,
            batch_completions: args.batch.is_some(),
            running: Mutex::new(None),
        })
    }

    /// True when the servers run in processes of their own.
    pub(crate) fn external(&self) -> bool {
        self.embedded.is_none()
    }

    /// Starts the workers: each its own HTTP client, polling the benchmark queue with a no-op
    /// handler that records its invocation.
    pub(crate) fn start_workers(&self) -> Result<()> {
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::with_capacity(self.workers);
        for index in 0..self.workers {
            let recorder = self.recorder.clone();
            let handler = move |task: TaskContext| {
                let recorder = recorder.clone();
                async move {
                    let start = Instant::now();
                    let outcome = Outcome::complete(json!({}));
                    recorder.record(&task, start, Instant::now());
                    outcome
                }
            };
            let url = &self.servers[index % self.servers.len()];
            let worker = Worker::builder(client_of(url)?)
                .worker_id(format!("bench-worker-{index}"))
                .namespace(self.namespace.clone())
                .concurrency(self.concurrency)
                .batch_completions(self.batch_completions)
                .poll_wait(POLL_WAIT)
                .handler(QUEUE, COMMAND, handler)
                .build()?;
            let mut stopped = stopped.clone();
            handles.push(tokio::spawn(worker.run(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            })));
        }
        let previous = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(RunningWorkers { stop, handles });
        if previous.is_some() {
            bail!("the workers were started twice");
        }
        Ok(())
    }

    /// Stops the workers started last (they finish and report what they hold); they may be
    /// started again.
    pub(crate) async fn stop_workers(&self) -> Result<()> {
        let running = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(running) = running {
            let _ = running.stop.send(true);
            for handle in running.handles {
                match tokio::time::timeout(STOP_TIMEOUT, handle).await {
                    Ok(joined) => joined.context("a worker failed")?,
                    Err(_) => bail!("a worker did not stop within {STOP_TIMEOUT:?}"),
                }
            }
            // Let the server end the polls the workers abandoned.
            tokio::time::sleep(POLL_WAIT * 2).await;
        }
        Ok(())
    }

    /// CPU time so far (this process, and the external servers'), the servers' store writer
    /// counters and their peak memory, read from their `/metrics`.
    pub(crate) async fn usage(&self) -> Result<Usage> {
        let mut scrapes = Vec::with_capacity(self.servers.len());
        for url in &self.servers {
            let text = client_of(url)?
                .metrics()
                .await
                .with_context(|| format!("cannot read the metrics of {url}"))?;
            scrapes.push(Scrape::parse(&text));
        }
        Ok(Usage::new(
            &scrapes,
            self.external(),
            self.database.is_postgres_here(),
        ))
    }

    /// A new HTTP client of a server (of the first, when there are several).
    pub(crate) fn client(&self) -> Result<Client> {
        client_of(&self.servers[0])
    }

    /// Waits until the handler has run `expected` times in all and no job of the namespace is
    /// unfinished. Returns false when nothing moved for a minute: the correctness check then
    /// names what is stuck.
    pub(crate) async fn wait_until_done(&self, expected: u64, label: &str) -> Result<bool> {
        let mut count = self.recorder.invocations();
        let mut last_move = Instant::now();
        let mut last_print = Instant::now();
        loop {
            let now_count = self.recorder.invocations();
            if now_count != count {
                count = now_count;
                last_move = Instant::now();
            }
            if count >= expected && !self.api.unfinished().await? {
                return Ok(true);
            }
            if last_move.elapsed() >= STALL {
                eprintln!(
                    "bench: {label}: nothing ran for {}s with {count}/{expected} tasks run; \
                     giving up waiting",
                    STALL.as_secs()
                );
                return Ok(false);
            }
            if last_print.elapsed() >= PROGRESS_EVERY {
                eprintln!("bench: {label}: {count}/{expected} tasks run");
                last_print = Instant::now();
            }
            let pause = if count >= expected { 2 } else { 10 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Stops the workers and the embedded server, and removes the temporary database unless
    /// kept.
    pub(crate) async fn stop(self) -> Result<()> {
        self.stop_workers().await?;
        if let Some(embedded) = self.embedded {
            let _ = embedded.stop.send(true);
            match tokio::time::timeout(STOP_TIMEOUT, embedded.server).await {
                Ok(joined) => joined.context("the server task failed")??,
                Err(_) => bail!("the server did not stop within {STOP_TIMEOUT:?}"),
            }
        }
        self.database.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(task_id: &str, job_id: &str, attempt: u32) -> TaskContext {
        let task = serde_json::from_value(json!({
            "id": task_id, "lease_token": "lease", "job_id": job_id, "step": "noop",
            "kind": "step", "queue": QUEUE, "command": COMMAND, "input": {},
            "attempt": attempt, "idempotency_key": format!("{job_id}/noop"),
            "lease_expires_at": "2026-12-06T00:00:00Z", "lease_ms": 30_000,
            "callback_token": "sbc_1",
        }))
        .unwrap();
        TaskContext::new(task)
    }

    #[test]
    fn invocations_recorded_before_and_after_a_read_count_per_task_and_attempt() {
        let recorder = Recorder::default();
        let at = Instant::now();
        let ms = Duration::from_millis;
        recorder.record(&context("tsk_a", "job_a", 1), at + ms(5), at + ms(7));
        recorder.record(&context("tsk_b", "job_b", 1), at, at + ms(1));
        let first = recorder.read(|runs| runs.len());
        recorder.record(&context("tsk_a", "job_a", 2), at + ms(1), at + ms(2));
        recorder.record(&context("tsk_a", "job_a", 2), at + ms(8), at + ms(9));

        assert_eq!(first, 2);
        assert_eq!(recorder.invocations(), 4);
        recorder.read(|runs| {
            let a = &runs["tsk_a"];
            assert_eq!(a.job_id, "job_a");
            assert_eq!(a.attempts, vec![(1, 1), (2, 2)]);
            assert_eq!(a.first_start, at + ms(1));
            assert_eq!(a.last_end, at + ms(9));
            assert_eq!(a.handler_time, ms(4));
            assert_eq!(runs["tsk_b"].attempts, vec![(1, 1)]);
        });
    }
}
