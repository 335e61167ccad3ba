//! The web UI in a real headless Chromium, driven over the W3C WebDriver protocol
//! (`chromedriver`), against a real server on `127.0.0.1:0` whose tasks the test itself claims
//! and reports as a worker would. Screenshots of the main pages are written to
//! `target/ui-screenshots/`.
//!
//! Without `chromium` and `chromedriver` on the machine the tests say so and pass; with the
//! environment variable `CI` set they fail instead (`.ci/run` installs both).

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use starbridge_engine::Engine;
use starbridge_server::Server;
use tokio::time::Instant;

/// Longest wait for anything the browser or the server should do.
const DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two checks of a condition that is not met yet.
const POLL: Duration = Duration::from_millis(100);

/// One browser test at a time: each starts its own Chromium.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// The browser and its driver, or `None` (the test is skipped) when they are not installed
/// outside CI.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = on_path(&["chromedriver"]);
    match (chromium, driver) {
        (Some(chromium), Some(driver)) => Some((chromium, driver)),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "chromium and chromedriver are required in CI: apt-get install chromium chromium-driver"
            )
        }
        _ => {
            eprintln!(
                "skipping the browser test: chromium and chromedriver are not installed \
                 (apt-get install chromium chromium-driver)"
            );
            None
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    target.join("ui-screenshots")
}

/// A WebDriver session in a headless Chromium.
struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    async fn start(chromium: &PathBuf, chromedriver: &PathBuf) -> Browser {
        let port = free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().unwrap();
        starbridge_server::tls::install_crypto_provider();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(response) = ready
                && let Ok(status) = response.json::<Value>().await
                && status["value"]["ready"] == true
            {
                break;
            }
            assert!(started.elapsed() < DEADLINE, "chromedriver did not start");
            tokio::time::sleep(POLL).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        Browser {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            _profile: profile,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        self.try_command(method, path, body)
            .await
            .unwrap_or_else(|(error, message)| panic!("webdriver {path}: {error}: {message}"))
    }

    /// A WebDriver command's value, or its error and message.
    async fn try_command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> Result<Value, (Value, Value)> {
        let url = format!("{}{path}", self.session);
        let request = self.http.request(method, &url);
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        match answer["value"].get("error") {
            Some(error) => Err((error.clone(), answer["value"]["message"].clone())),
            None => Ok(answer["value"].clone()),
        }
    }

    async fn quit(&self) {
        let _ = self.http.delete(&self.session).send().await;
    }

    async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    /// Runs a script in the page and returns its value.
    async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    async fn element(&self, css: &str) -> String {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned()
    }

    /// Clicks an element. A live page may swap the element for a fresh copy between finding and
    /// clicking it (a stale element): then the fresh one is found and clicked.
    async fn click(&self, css: &str) {
        let started = Instant::now();
        loop {
            let id = self.element(css).await;
            let path = format!("/element/{id}/click");
            match self
                .try_command(reqwest::Method::POST, &path, json!({}))
                .await
            {
                Ok(_) => return,
                Err((error, _)) if error == "stale element reference" => {
                    assert!(started.elapsed() < DEADLINE, "{css} stays stale");
                }
                Err((error, message)) => panic!("webdriver {path}: {error}: {message}"),
            }
        }
    }

    /// Types `text` into a field, as the keyboard would, after emptying it.
    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/clear"),
            json!({}),
        )
        .await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            json!({"text": text}),
        )
        .await;
    }

    /// Waits until `script` returns `expected`, re-checking until the deadline.
    async fn wait_for(&self, what: &str, script: &str, expected: Value) {
        let started = Instant::now();
        loop {
            let value = self.eval(script).await;
            if value == expected {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{what}: still {value}, expected {expected}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the action dialog shows exactly these fields (`data-field` names, in order).
    async fn wait_for_fields(&self, what: &str, fields: &str) {
        self.wait_for(
            what,
            "return [...document.querySelectorAll('#act [data-field]')].filter(f => getComputedStyle(f).display !== 'none').map(f => f.dataset.field).join(' ')",
            json!(fields),
        )
        .await;
    }

    /// Clicks the action button `button`, checks that its dialog asks for `fields`, types `text`
    /// into the field `input` and confirms.
    async fn confirm(&self, button: &str, fields: &str, input: &str, text: &str) {
        self.click(button).await;
        self.wait_for_fields(&format!("the fields of {button}"), fields)
            .await;
        self.type_into(input, text).await;
        self.click("#act-ok").await;
    }

    /// Whether the page has an element with this id.
    async fn has(&self, id: &str) -> bool {
        let script = format!("return document.getElementById('{id}') !== null");
        self.eval(&script).await == json!(true)
    }

    /// Presses a key (a WebDriver key code such as `\u{E007}`, Enter) where the focus is.
    async fn press(&self, key: &str) {
        self.command(
            reqwest::Method::POST,
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
                {"type": "keyDown", "value": key},
                {"type": "keyUp", "value": key}
            ]}]}),
        )
        .await;
    }

    async fn screenshot(&self, name: &str) {
        let data = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let png = decode_base64(data.as_str().unwrap());
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut bits = 0u32;
        for (i, digit) in chunk.iter().enumerate() {
            bits |= u32::from(*digit) << (18 - 6 * i);
        }
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// A running server on a fresh store, and an HTTP client playing the worker.
struct Setup {
    base: String,
    store: Engine,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Engine::open(&format!("sqlite://{}", dir.path().join("ui.db").display())).unwrap();
        let server = Server::bind(store.clone(), "127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Setup {
            base,
            store,
            http: {
                starbridge_server::tls::install_crypto_provider();
                reqwest::Client::new()
            },
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap_or(Value::Null)
    }

    async fn apply(&self, name: &str, definition: Value) {
        self.call(
            reqwest::Method::PUT,
            &format!("/api/v1/workflows/{name}"),
            definition,
        )
        .await;
    }

    /// Applies `scratch`: one step, `only`, on queue `ui`.
    async fn apply_scratch(&self) {
        let definition = json!({"steps": [{"id": "only", "queue": "ui", "command": "c"}]});
        self.apply("scratch", definition).await;
    }

    async fn submit(&self, workflow: &str) -> String {
        let job = self
            .call(
                reqwest::Method::POST,
                "/api/v1/jobs",
                json!({"workflow": workflow, "params": {}}),
            )
            .await;
        job["id"].as_str().unwrap().to_owned()
    }

    /// Claims one task of `queue`, waiting for it to be ready.
    async fn claim(&self, queue: &str) -> (String, String) {
        let answer = self
            .call(
                reqwest::Method::POST,
                "/api/v1/tasks/poll",
                json!({"worker_id": "browser-test-worker", "queues": [queue], "max_tasks": 1, "wait_ms": 20000}),
            )
            .await;
        let task = &answer["tasks"][0];
        assert!(task.is_object(), "no task ready on {queue}: {answer}");
        (
            task["id"].as_str().unwrap().to_owned(),
            task["lease_token"].as_str().unwrap().to_owned(),
        )
    }

    async fn complete(&self, (task, lease): &(String, String)) {
        self.call(
            reqwest::Method::POST,
            &format!("/api/v1/tasks/{task}/complete"),
            json!({"lease_token": lease, "output": {"done": true}}),
        )
        .await;
    }

    async fn fail(&self, (task, lease): &(String, String)) {
        self.call(
            reqwest::Method::POST,
            &format!("/api/v1/tasks/{task}/fail"),
            json!({"lease_token": lease, "error": {"message": "disk full on db-7", "retryable": false}}),
        )
        .await;
    }
}

/// Runs `body` with a browser and a server, then closes both even when `body` panics.
async fn with_browser<F, Fut>(body: F)
where
    F: FnOnce(std::sync::Arc<Browser>, std::sync::Arc<Setup>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some((chromium, chromedriver)) = tools() else {
        return;
    };
    let _one_at_a_time = BROWSER.lock().await;
    let browser = std::sync::Arc::new(Browser::start(&chromium, &chromedriver).await);
    let setup = std::sync::Arc::new(Setup::start().await);
    let outcome = tokio::spawn(body(browser.clone(), setup.clone())).await;
    browser.quit().await;
    if let Ok(setup) = std::sync::Arc::try_unwrap(setup) {
        setup.stop().await;
    }
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

fn node_state(step: &str) -> String {
    format!(
        "const n = document.querySelector('#graph [data-step=\"{step}\"]'); \
         return n ? [n.dataset.state, n.getAttribute('class'), n.textContent.includes(n.dataset.state.replace('_', ' '))] : null;"
    )
}

fn shown(state: &str) -> Value {
    json!([state, format!("node st-{state}"), true])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_job_page_recolours_a_node_when_its_task_completes() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "two_steps",
                json!({"steps": [
                    {"id": "fetch", "queue": "ui", "command": "fetch"},
                    {"id": "store", "queue": "ui", "command": "store"}
                ]}),
            )
            .await;
        let job = setup.submit("two_steps").await;
        let fetch = setup.claim("ui").await;
        browser.open(&format!("{}/ui/jobs/{job}", setup.base)).await;
        browser
            .wait_for(
                "fetch shown running",
                &node_state("fetch"),
                shown("running"),
            )
            .await;
        browser
            .wait_for(
                "store shown waiting",
                &node_state("store"),
                shown("waiting"),
            )
            .await;
        // The legend names every state in words, beside its colour.
        let legend = browser
            .eval("return document.querySelector('.legend').textContent")
            .await;
        for word in [
            "succeeded",
            "running",
            "ready",
            "waiting",
            "failed",
            "compensating",
        ] {
            assert!(legend.as_str().unwrap().contains(word), "{legend}");
        }
        browser.screenshot("job-running").await;
        // A marker that a reload would lose.
        browser
            .eval("window.sbMarker = 'same page'; return null")
            .await;
        setup.complete(&fetch).await;
        browser
            .wait_for(
                "fetch shown succeeded",
                &node_state("fetch"),
                shown("succeeded"),
            )
            .await;
        browser
            .wait_for("store shown ready", &node_state("store"), shown("ready"))
            .await;
        assert_eq!(browser.eval("return window.sbMarker").await, "same page");
        browser.screenshot("job-step-done").await;
        let store = setup.claim("ui").await;
        setup.complete(&store).await;
        browser
            .wait_for(
                "job shown succeeded",
                "return document.getElementById('summary').dataset.status",
                json!("succeeded"),
            )
            .await;
        assert_eq!(browser.eval("return window.sbMarker").await, "same page");
        // A node is a link the keyboard reaches: Enter opens its step's task panels.
        let focused = browser
            .eval(
                "const a = document.querySelector('#graph [data-step=\"store\"] a'); a.focus(); \
                 return document.activeElement === a",
            )
            .await;
        assert_eq!(focused, true);
        browser.press("\u{E007}").await;
        browser
            .wait_for(
                "the store step opened",
                "return location.hash === '#step-store' && document.querySelector('#step-store details').open",
                json!(true),
            )
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_on_a_failed_job_runs_the_failed_step_again() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "migrate",
                json!({"steps": [
                    {"id": "copy", "queue": "ui", "command": "copy"},
                    {"id": "switch", "queue": "ui", "command": "switch"}
                ]}),
            )
            .await;
        let job = setup.submit("migrate").await;
        let copy = setup.claim("ui").await;
        setup.fail(&copy).await;
        browser
            .open(&format!("{}/ui/jobs/{job}", setup.base))
            .await;
        browser
            .wait_for("copy shown failed", &node_state("copy"), shown("failed"))
            .await;
        let why = browser
            .eval("return document.getElementById('summary').textContent")
            .await;
        assert!(why.as_str().unwrap().contains("disk full on db-7"), "{why}");
        browser.screenshot("job-failed").await;
        browser.click("#act-retry").await;
        browser
            .wait_for("copy shown ready", &node_state("copy"), shown("ready"))
            .await;
        browser
            .wait_for(
                "job shown running",
                "return document.getElementById('summary').dataset.status",
                json!("running"),
            )
            .await;
        let copy = setup.claim("ui").await;
        browser
            .wait_for("copy shown running", &node_state("copy"), shown("running"))
            .await;
        setup.complete(&copy).await;
        let switch = setup.claim("ui").await;
        setup.complete(&switch).await;
        browser
            .wait_for(
                "job shown succeeded",
                "return document.getElementById('summary').dataset.status",
                json!("succeeded"),
            )
            .await;
        // The retry is in the history with who asked.
        let history = browser
            .eval("return document.getElementById('events').textContent")
            .await;
        assert!(history.as_str().unwrap().contains("web-ui"), "{history}");
        browser.screenshot("job-retried").await;
        // A refused action shows the API's reason: pausing a finished job.
        browser
            .eval(
                "const b = document.createElement('button'); b.id = 'late-pause'; \
                 b.dataset.url = '/api/v1/jobs/' + document.querySelector('#summary .mono').textContent + '/pause'; \
                 b.textContent = 'Pause'; document.getElementById('actions').append(b); return null",
            )
            .await;
        browser.click("#late-pause").await;
        browser
            .wait_for(
                "refusal shown",
                "const t = document.getElementById('toast').textContent; return t.startsWith('Refused: ') && t.length > 12",
                json!(true),
            )
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_a_failed_task_with_an_edited_output_lets_the_job_go_on() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "provision",
                json!({"steps": [
                    {"id": "reserve", "queue": "ui", "command": "reserve"},
                    {"id": "create", "queue": "ui", "command": "create",
                     "input": {"reservation": "${{ steps.reserve.output.reservation }}"}}
                ]}),
            )
            .await;
        let job = setup.submit("provision").await;
        let reserve = setup.claim("ui").await;
        setup.fail(&reserve).await;
        browser
            .open(&format!("{}/ui/jobs/{job}", setup.base))
            .await;
        browser
            .wait_for("reserve shown failed", &node_state("reserve"), shown("failed"))
            .await;
        browser.click(&format!("#skip-{}", reserve.0)).await;
        browser
            .wait_for(
                "the dialog open",
                "return document.getElementById('act').open",
                json!(true),
            )
            .await;
        // Only the fields a skip needs are shown.
        browser.wait_for_fields("the skip's fields", "output reason").await;
        browser
            .type_into("#act-output", "{\"reservation\": \"r-9\"")
            .await;
        browser.type_into("#act-reason", "reserved by hand in the console").await;
        browser.click("#act-ok").await;
        browser
            .wait_for(
                "bad JSON explained",
                "return document.getElementById('act-error').textContent.startsWith('The output is not JSON')",
                json!(true),
            )
            .await;
        browser
            .type_into("#act-output", "{\"reservation\": \"r-9\"}")
            .await;
        browser.screenshot("skip-dialog").await;
        browser.click("#act-ok").await;
        browser
            .wait_for(
                "the dialog closed",
                "return document.getElementById('act').open",
                json!(false),
            )
            .await;
        browser
            .wait_for("reserve shown succeeded", &node_state("reserve"), shown("succeeded"))
            .await;
        browser
            .wait_for("create shown ready", &node_state("create"), shown("ready"))
            .await;
        // The next step gets the output typed in the dialog.
        let create = setup.claim("ui").await;
        let job_view = setup
            .call(
                reqwest::Method::GET,
                &format!("/api/v1/jobs/{job}"),
                Value::Null,
            )
            .await;
        let input = job_view["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == create.0.as_str())
            .map(|t| t["input"].clone());
        assert_eq!(input, Some(json!({"reservation": "r-9"})));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_job_page_links_to_its_children_and_each_child_back() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "shard",
                json!({"steps": [{"id": "work", "queue": "ui", "command": "migrate"}]}),
            )
            .await;
        setup
            .apply(
                "cluster",
                json!({"steps": [{"id": "per_shard", "workflow": "shard", "for_each": "${{ [1, 2] }}"}]}),
            )
            .await;
        let parent = setup.submit("cluster").await;
        let view = setup
            .call(reqwest::Method::GET, &format!("/api/v1/jobs/{parent}"), Value::Null)
            .await;
        let children: Vec<String> = view["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(children.len(), 2, "{view:#}");
        browser.open(&format!("{}/ui/jobs/{parent}", setup.base)).await;
        browser
            .wait_for(
                "the children listed",
                "return [...document.querySelectorAll('#children a')].map(a => a.textContent)",
                json!(children),
            )
            .await;
        browser.screenshot("parent-children").await;
        browser.click("#children li:first-child a").await;
        browser
            .wait_for(
                "the child's page, linking back",
                "return document.getElementById('parent-link') ? [location.pathname, document.getElementById('parent-link').textContent] : null",
                json!([format!("/ui/jobs/{}", children[0]), parent]),
            )
            .await;
        browser.click("#parent-link").await;
        browser
            .wait_for(
                "back on the parent",
                "return location.pathname",
                json!(format!("/ui/jobs/{parent}")),
            )
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_a_waiting_step_from_the_approvals_page() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "migrate",
                json!({"steps": [
                    {"id": "ask", "approval": {"prompt": "Migrate cluster eu-1 now?"}},
                    {"id": "run", "queue": "ui", "command": "migrate"}
                ]}),
            )
            .await;
        let job = setup.submit("migrate").await;
        let view = setup
            .call(reqwest::Method::GET, &format!("/api/v1/jobs/{job}"), Value::Null)
            .await;
        let task = view["tasks"][0]["id"].as_str().unwrap().to_owned();
        browser.open(&format!("{}/ui/approvals", setup.base)).await;
        browser
            .wait_for(
                "the prompt listed",
                "return document.getElementById('approvals').textContent.includes('Migrate cluster eu-1 now?')",
                json!(true),
            )
            .await;
        browser.screenshot("approvals").await;
        browser.click(&format!("#approve-{task}")).await;
        browser
            .wait_for_fields("the comment asked for", "comment")
            .await;
        browser.type_into("#act-comment", "window agreed with the owners").await;
        browser.click("#act-ok").await;
        browser
            .wait_for(
                "the approval gone from the list",
                "return document.getElementById('approvals').textContent.includes('Nothing waits')",
                json!(true),
            )
            .await;
        let view = setup
            .call(reqwest::Method::GET, &format!("/api/v1/jobs/{job}"), Value::Null)
            .await;
        let ask = &view["tasks"][0];
        assert_eq!(ask["status"], "succeeded", "{view:#}");
        assert_eq!(ask["output"]["approved"], true);
        assert_eq!(ask["output"]["comment"], "window agreed with the owners");
        assert_eq!(view["tasks"][1]["status"], "ready");
        browser.open(&format!("{}/ui/jobs/{job}", setup.base)).await;
        browser
            .wait_for("ask shown succeeded", &node_state("ask"), shown("succeeded"))
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_list_counts_filters_and_pages_through_many_jobs() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "nightly",
                json!({"description": "Back up and verify", "params": {"type": "object", "properties": {"cluster": {"type": "string"}, "full": {"type": "boolean"}}}, "steps": [
                    {"id": "backup", "queue": "batch", "command": "backup"},
                    {"id": "verify", "queue": "batch", "command": "verify", "for_each": "${{ [1, 2, 3] }}"},
                    {"id": "report", "queue": "batch", "command": "report", "depends_on": ["backup"]},
                    {"id": "notify", "queue": "batch", "command": "notify", "depends_on": ["verify", "report"]}
                ]}),
            )
            .await;
        setup
            .apply("adhoc", json!({"steps": [{"id": "run", "queue": "batch", "command": "run"}]}))
            .await;
        for i in 0..260 {
            let workflow = if i % 13 == 0 { "adhoc" } else { "nightly" };
            setup
                .store
                .submit(
                    "default",
                    starbridge_engine::Submit {
                        workflow: Some(workflow.to_owned()),
                        key: Some(format!("run-{i:03}")),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
        }
        browser.open(&format!("{}/", setup.base)).await;
        let count = "return document.querySelector('#counts a').textContent";
        browser
            .wait_for("all counted", count, json!("all 260"))
            .await;
        let rows = "return document.querySelectorAll('#jobs tr').length";
        assert_eq!(browser.eval(rows).await, 50);
        let first = "return document.querySelector('#jobs td.mono').textContent";
        assert_eq!(browser.eval(first).await, "run-259");
        browser.screenshot("jobs-list").await;
        browser.click("#next-page").await;
        browser
            .wait_for("second page", first, json!("run-209"))
            .await;
        assert_eq!(browser.eval(rows).await, 50);
        // Filters: a workflow, and a key prefix.
        browser
            .open(&format!("{}/?workflow=adhoc", setup.base))
            .await;
        browser.wait_for("adhoc counted", count, json!("all 20")).await;
        assert_eq!(browser.eval(rows).await, 20);
        browser.open(&format!("{}/?q=run-12", setup.base)).await;
        browser
            .wait_for("prefix counted", count, json!("all 10"))
            .await;
        // The first page follows new jobs without a reload.
        browser.open(&format!("{}/", setup.base)).await;
        browser.eval("window.sbMarker = 1; return null").await;
        setup.submit("adhoc").await;
        browser.wait_for("new job counted", count, json!("all 261")).await;
        assert_eq!(browser.eval("return window.sbMarker").await, 1);
        // The other main pages, for the screenshots.
        browser
            .open(&format!("{}/ui/workflows/nightly", setup.base))
            .await;
        let nodes = "return document.querySelectorAll('.graph [data-step]').length";
        assert_eq!(browser.eval(nodes).await, 4);
        let fields = "return [...document.querySelectorAll('#submit-job [data-param]')].map(f => f.dataset.param).join(' ')";
        assert_eq!(browser.eval(fields).await, "cluster full");
        browser.screenshot("workflow").await;
        // Submitting from the generated form leads to the new job's page.
        browser.type_into("#param-cluster", "main-eu").await;
        browser.click("#param-full").await;
        browser.click("#submit-job button[type=submit]").await;
        browser
            .wait_for(
                "the new job's page",
                "return location.pathname.startsWith('/ui/jobs/job_') && !!document.getElementById('summary')",
                json!(true),
            )
            .await;
        let params = browser
            .eval("return JSON.parse(document.querySelector('#params').textContent)")
            .await;
        assert_eq!(params, json!({"cluster": "main-eu", "full": true}));
        // A worker takes a task: the queues page shows it.
        setup.claim("batch").await;
        browser.open(&format!("{}/ui/queues", setup.base)).await;
        let depth = "return document.querySelector('#queues tr td:nth-child(3)').textContent";
        assert_eq!(browser.eval(depth).await, "261");
        let started = "return document.querySelector('#queues tr td:nth-child(6)').textContent";
        assert_eq!(browser.eval(started).await, "1");
        let worker = "return document.querySelector('#workers tr').textContent";
        let worker = browser.eval(worker).await;
        assert!(
            worker.as_str().unwrap().starts_with("browser-test-workerbatch"),
            "{worker}"
        );
        browser.screenshot("queues").await;
        // Schedules: the next fire times, and pause from the page.
        setup
            .call(
                reqwest::Method::PUT,
                "/api/v1/schedules/nightly-eu",
                json!({"workflow": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris"}),
            )
            .await;
        browser.open(&format!("{}/ui/schedules", setup.base)).await;
        let fires = "return document.querySelector('#schedules tr td:nth-child(5)').innerHTML.split('<br>').length";
        assert_eq!(browser.eval(fires).await, 5);
        browser.screenshot("schedules").await;
        browser.click("#schedule-pause-nightly-eu").await;
        browser
            .wait_for(
                "schedule shown paused",
                "return document.querySelector('#schedules .badge').textContent",
                json!("paused"),
            )
            .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_list_filters_by_labels_and_a_job_page_links_its_labels() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "nightly",
                json!({"labels": {"team": "storage"}, "steps": [{"id": "backup", "queue": "batch", "command": "backup"}]}),
            )
            .await;
        let mut prod = String::new();
        for (key, env) in [("a", "prod"), ("b", "dev"), ("c", "")] {
            let labels = [("env".to_owned(), env.to_owned())]
                .into_iter()
                .filter(|(_, value)| !value.is_empty())
                .collect();
            let submitted = setup
                .store
                .submit(
                    "default",
                    starbridge_engine::Submit {
                        workflow: Some("nightly".to_owned()),
                        key: Some(key.to_owned()),
                        labels,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            if env == "prod" {
                prod = submitted.state.job.id.to_string();
            }
        }
        browser.open(&format!("{}/", setup.base)).await;
        let count = "return document.querySelector('#counts a').textContent";
        browser.wait_for("all counted", count, json!("all 3")).await;
        // Labels typed into the filter: one, then two that a job must both carry.
        browser.type_into("#f-label", "env=prod").await;
        browser.press("\u{E007}").await;
        browser.wait_for("prod counted", count, json!("all 1")).await;
        let first = "return document.querySelector('#jobs td.mono').textContent";
        assert_eq!(browser.eval(first).await, "a");
        browser.type_into("#f-label", "team=storage, env=dev").await;
        browser.press("\u{E007}").await;
        browser.wait_for("dev counted", count, json!("all 1")).await;
        assert_eq!(browser.eval(first).await, "b");
        browser.screenshot("jobs-label-filter").await;
        browser.type_into("#f-label", "Env=dev").await;
        browser.press("\u{E007}").await;
        browser
            .wait_for(
                "the refusal shown",
                "const e = document.querySelector('.filters + .error, p.error'); return e ? e.textContent.startsWith('label: ') : false",
                json!(true),
            )
            .await;
        // A job page shows its labels, each a link to the jobs that carry it.
        browser
            .open(&format!("{}/ui/jobs/{prod}", setup.base))
            .await;
        let labels = "return [...document.querySelectorAll('#labels a')].map(a => a.textContent).join(' ')";
        assert_eq!(browser.eval(labels).await, "env=prod team=storage");
        browser.click("#labels a:last-child").await;
        browser
            .wait_for("storage counted", count, json!("all 3"))
            .await;
        assert_eq!(
            browser.eval("return document.querySelector('#f-label').value").await,
            "team=storage"
        );
    })
    .await;
}

/// Per-host queues (a fan-out whose queue is `agent-${{ item }}`) are grouped by the part of
/// their name before the last `-`, a group lists its queues, the search box filters on the
/// server, and pages hold at most 100 queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queues_page_groups_per_host_queues_and_searches_them() {
    with_browser(|browser, setup| async move {
        setup
            .apply(
                "per_host",
                json!({"steps": [
                    {"id": "each", "queue": "agent-${{ item }}", "command": "tune", "for_each": "${{ params.hosts }}"}
                ]}),
            )
            .await;
        setup
            .apply(
                "other",
                json!({"steps": [
                    {"id": "a", "queue": "db-main", "command": "c"},
                    {"id": "b", "queue": "db-replica", "command": "c"},
                    {"id": "c", "queue": "batch", "command": "c"}
                ]}),
            )
            .await;
        let hosts: Vec<String> = ["eu", "us"]
            .iter()
            .flat_map(|region| (1..=75).map(move |n| format!("{region}-{n}")))
            .collect();
        setup
            .call(
                reqwest::Method::POST,
                "/api/v1/jobs",
                json!({"workflow": "per_host", "params": {"hosts": hosts}}),
            )
            .await;
        setup
            .call(
                reqwest::Method::PUT,
                "/api/v1/queues/agent-eu-*",
                json!({"mode": "serial"}),
            )
            .await;
        browser.open(&format!("{}/ui/queues", setup.base)).await;
        let groups = "return [...document.querySelectorAll('#queue-groups tr')].map(r => [...r.children].map(c => c.textContent).slice(0, 3).join(' ')).join(', ')";
        assert_eq!(
            browser.eval(groups).await,
            "agent-eu-* 75 75, agent-us-* 75 75, db-* 2 0"
        );
        let patterns = "return [...document.querySelectorAll('#queue-prefixes th')].map(c => c.textContent).join(' ')";
        assert_eq!(browser.eval(patterns).await, "agent-eu-*");
        let rows = "return document.querySelectorAll('#queues tr').length";
        assert_eq!(browser.eval(rows).await, 100, "a page of 100 of 153 queues");
        browser.screenshot("queues-groups").await;
        let first = "return document.querySelector('#queues th').textContent";
        assert_eq!(browser.eval(first).await, "agent-eu-1");
        browser.click("#queues-next").await;
        browser
            .wait_for("the second page", rows, json!(53))
            .await;

        // A group lists its queues; the search narrows them.
        browser.open(&format!("{}/ui/queues", setup.base)).await;
        browser.click("#queue-groups a[data-group='agent-us-']").await;
        browser
            .wait_for("the group's queues", rows, json!(75))
            .await;
        let caption = "return document.querySelector('#queues-caption').textContent";
        assert_eq!(browser.eval(caption).await, "Queues of agent-us-*");
        let names = "return [...document.querySelectorAll('#queues th')].map(c => c.textContent).join(' ')";
        browser.type_into("#f-queue", "US-7").await;
        browser.press("\u{E007}").await;
        browser
            .wait_for(
                "the search within the group",
                names,
                json!("agent-us-7 agent-us-70 agent-us-71 agent-us-72 agent-us-73 agent-us-74 agent-us-75"),
            )
            .await;
        assert_eq!(
            browser.eval(caption).await,
            "Queues of agent-us-* matching “US-7”"
        );
        // The search alone spans every group; a queue shows the settings it follows.
        browser
            .open(&format!("{}/ui/queues?q=eu-1", setup.base))
            .await;
        let first_row = "const r = document.querySelector('#queues tr'); return [r.children[0].textContent, r.children[7].textContent, r.children[11].textContent]";
        browser
            .wait_for(
                "a serial queue following its pattern",
                first_row,
                json!(["agent-eu-1", "serial", "agent-eu-*"]),
            )
            .await;
        assert_eq!(browser.eval(rows).await, 11, "eu-1 and eu-10 to eu-19, and no other");
        browser.screenshot("queues-search").await;
        browser.click("#queues-clear").await;
        browser.wait_for("every queue again", rows, json!(100)).await;
    })
    .await;
}
#[tokio::test]
async fn delete_on_a_finished_job_removes_it_and_goes_to_the_job_list() {
    with_browser(|browser, setup| async move {
        setup.apply_scratch().await;
        let job = setup.submit("scratch").await;
        let page = format!("{}/ui/jobs/{job}", setup.base);
        browser.open(&page).await;
        let delete = "return document.getElementById('act-delete') !== null";
        assert_eq!(
            browser.eval(delete).await,
            json!(false),
            "a running job has no Delete"
        );
        setup
            .call(
                reqwest::Method::POST,
                &format!("/api/v1/jobs/{job}/cancel"),
                json!({}),
            )
            .await;
        browser.open(&page).await;
        browser.click("#act-delete").await;
        browser.type_into("#act-reason", "cleanup").await;
        browser.click("#act-ok").await;
        browser
            .wait_for("the job list shown", "return location.pathname", json!("/"))
            .await;
        let answer = reqwest::get(format!("{}/api/v1/jobs/{job}", setup.base))
            .await
            .unwrap();
        assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
    })
    .await;
}

/// The status of job `id` as the API tells it.
async fn job_status(setup: &Setup, id: &str) -> Value {
    let job = setup
        .call(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}"),
            Value::Null,
        )
        .await;
    job["status"].clone()
}

/// Chooses `action` and the jobs (`selected` rows or the whole `filter`) in the job list's bulk
/// bar, clicks Act… and waits for the dialog, which shows the jobs counted.
async fn ask_bulk(browser: &Browser, scope: &str, action: &str) -> Value {
    browser
        .eval(&format!(
            "document.getElementById('bulk-scope').value = '{scope}'; \
             document.getElementById('bulk-action').value = '{action}'; return null;"
        ))
        .await;
    browser.click("#bulk-go").await;
    browser
        .wait_for(
            "the bulk dialog open",
            "return document.getElementById('act').open",
            json!(true),
        )
        .await;
    browser
        .eval("return document.getElementById('act-matched').textContent")
        .await
}

/// What the bulk bar says the action did: matched, affected, refused.
const BULK_RESULT: &str = "const n = (id) => { const e = document.getElementById(id); return e ? Number(e.textContent) : null; }; \
     return [n('bulk-matched'), n('bulk-affected'), n('bulk-refused')];";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_on_the_job_list_confirm_the_count_and_show_what_they_did() {
    with_browser(|browser, setup| async move {
        setup.apply_scratch().await;
        let mut jobs = Vec::new();
        for _ in 0..3 {
            jobs.push(setup.submit("scratch").await);
        }
        browser.open(&format!("{}/", setup.base)).await;
        // Two rows ticked, cancelled: the dialog counts them before anything changes.
        for job in &jobs[..2] {
            browser.click(&format!("#pick-{job}")).await;
        }
        browser
            .wait_for(
                "two selected",
                "return document.getElementById('bulk-count').textContent",
                json!("2 selected"),
            )
            .await;
        assert_eq!(ask_bulk(&browser, "selected", "cancel").await, json!("2"));
        browser.wait_for_fields("the cancel's fields", "compensate reason").await;
        assert_eq!(job_status(&setup, &jobs[0]).await, "running");
        browser.type_into("#act-reason", "not needed").await;
        browser.screenshot("bulk-dialog").await;
        browser.click("#act-ok").await;
        browser
            .wait_for("the cancel's result", BULK_RESULT, json!([2, 2, 0]))
            .await;
        for job in &jobs[..2] {
            assert_eq!(job_status(&setup, job).await, "cancelled");
        }
        assert_eq!(job_status(&setup, &jobs[2]).await, "running");

        // Every row of the page, paused: the two cancelled jobs are refused and listed.
        browser
            .wait_for(
                "the list shows the cancelled jobs",
                "return document.querySelectorAll('#jobs .s-cancelled').length",
                json!(2),
            )
            .await;
        browser.click("#select-page").await;
        browser
            .wait_for(
                "three selected",
                "return document.getElementById('bulk-count').textContent",
                json!("3 selected"),
            )
            .await;
        assert_eq!(ask_bulk(&browser, "selected", "pause").await, json!("3"));
        browser.click("#act-ok").await;
        browser
            .wait_for("the pause's result", BULK_RESULT, json!([3, 1, 2]))
            .await;
        browser
            .wait_for(
                "the refusals listed",
                "return [...document.querySelectorAll('#bulk-result li')].map(li => li.textContent.includes('only a running job can be paused')).length",
                json!(2),
            )
            .await;
        assert_eq!(job_status(&setup, &jobs[2]).await, "paused");
        browser.screenshot("bulk-result").await;

        // Every job the filter matches (the cancelled ones), rerun from a step named in the dialog.
        browser
            .open(&format!("{}/?status=cancelled", setup.base))
            .await;
        assert_eq!(ask_bulk(&browser, "filter", "rerun").await, json!("2"));
        browser.click("#act-ok").await;
        browser
            .wait_for(
                "a missing step refused",
                "return document.getElementById('act-error').textContent",
                json!("Refused: step: required with rerun: name the step"),
            )
            .await;
        browser.type_into("#act-step-name", "only").await;
        browser.click("#act-ok").await;
        browser
            .wait_for("the rerun's result", BULK_RESULT, json!([2, 2, 0]))
            .await;
        for job in &jobs[..2] {
            assert_eq!(job_status(&setup, job).await, "running");
        }

        // Every row, their step skipped with the output typed in the dialog.
        browser.open(&format!("{}/", setup.base)).await;
        browser.click("#select-page").await;
        assert_eq!(ask_bulk(&browser, "selected", "skip").await, json!("3"));
        browser
            .wait_for_fields("the skip's fields", "step-name output reason")
            .await;
        browser.type_into("#act-step-name", "only").await;
        browser.type_into("#act-output", "{\"by\": \"hand\"}").await;
        browser.click("#act-ok").await;
        browser
            .wait_for("the skip's result", BULK_RESULT, json!([3, 3, 0]))
            .await;
        for (job, status) in jobs.iter().zip(["succeeded", "succeeded", "paused"]) {
            let view = setup
                .call(
                    reqwest::Method::GET,
                    &format!("/api/v1/jobs/{job}"),
                    Value::Null,
                )
                .await;
            assert_eq!(view["status"], status, "{view}");
            assert_eq!(view["tasks"][0]["output"], json!({"by": "hand"}));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_and_fail_on_a_task_revoke_its_lease_then_fail_it_for_good() {
    with_browser(|browser, setup| async move {
        setup.apply_scratch().await;
        let job = setup.submit("scratch").await;
        let (task, _) = setup.claim("ui").await;
        browser
            .open(&format!("{}/ui/jobs/{job}", setup.base))
            .await;
        browser
            .wait_for("only shown running", &node_state("only"), shown("running"))
            .await;
        let open_panel = format!("document.getElementById('task-{task}').open = true; return null;");
        browser.eval(&open_panel).await;
        assert!(
            browser.has(&format!("fail-{task}")).await,
            "a running task can be failed"
        );
        let requeue = format!("#requeue-{task}");
        browser
            .confirm(&requeue, "reason", "#act-reason", "the worker host is draining")
            .await;
        browser
            .wait_for("only shown ready", &node_state("only"), shown("ready"))
            .await;
        browser.eval(&open_panel).await;
        assert!(
            !browser.has(&format!("requeue-{task}")).await,
            "a ready task holds no lease to revoke"
        );
        let fail = format!("#fail-{task}");
        browser
            .confirm(&fail, "error reason", "#act-message", "the provider lost the volume")
            .await;
        browser
            .wait_for("only shown failed", &node_state("only"), shown("failed"))
            .await;
        let view = setup
            .call(
                reqwest::Method::GET,
                &format!("/api/v1/jobs/{job}"),
                Value::Null,
            )
            .await;
        assert_eq!(view["status"], "failed");
        assert_eq!(
            view["tasks"][0]["error"],
            json!({"message": "the provider lost the volume", "retryable": false, "kind": "operator"})
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_the_first_nav_entry_and_charts_what_ran() {
    with_browser(|browser, setup| async move {
        setup.apply_scratch().await;
        for _ in 0..3 {
            setup.submit("scratch").await;
        }
        for succeed in [true, true, false] {
            let task = setup.claim("ui").await;
            if succeed {
                setup.complete(&task).await;
            } else {
                setup.fail(&task).await;
            }
        }
        browser.open(&format!("{}/", setup.base)).await;
        let first = "return document.querySelector('header nav a').textContent";
        assert_eq!(browser.eval(first).await, "Dashboard");
        browser.click("header nav a[href='/ui/dashboard']").await;
        // The page re-reads itself; the rollup counts what ran a few seconds later.
        let totals = "const s = document.querySelector('section[data-kind=\"workflow\"][data-name=\"scratch\"]'); \
                      return s ? ['started', 'succeeded', 'failed'].map(c => s.querySelector('td.' + c).textContent).join(' ') : null";
        browser
            .wait_for("the workflow's totals", totals, json!("3 2 1"))
            .await;
        let charts = "return [...document.querySelectorAll('section[data-kind=\"queue\"][data-name=\"ui\"] svg')].map(s => s.getAttribute('aria-label')).join(', ')";
        assert_eq!(
            browser.eval(charts).await,
            "per minute, duration, ready tasks, oldest wait"
        );
        let drawn = "const p = document.querySelector('section[data-kind=\"workflow\"] path[data-series=\"succeeded\"]'); \
                     return p.getBBox().width > 0 && p.getAttribute('d').startsWith('M')";
        assert_eq!(browser.eval(drawn).await, true);
        browser.screenshot("dashboard").await;
        browser.click("a[href='/ui/dashboard?window=1d']").await;
        let current = "const a = document.querySelector('.window a[aria-current]'); return a ? a.textContent : null";
        browser
            .wait_for("the day's window", current, json!("last day"))
            .await;
        browser
            .wait_for("the day's totals", totals, json!("3 2 1"))
            .await;
    })
    .await;
}
