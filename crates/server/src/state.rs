//! What every handler shares: the engine, authentication, limits and the network policies.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use starbridge_core::destination::DestinationPolicy;
use starbridge_engine::Engine;

use crate::limits::Limits;

/// What every handler shares. Each request clones it (every extractor and middleware that
/// takes `State` does), so it is one reference count however many parts it holds; a change
/// through `DerefMut` (while a server is being set up) copies the parts first if they are
/// shared.
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

/// The parts of an [`AppState`].
#[derive(Clone)]
pub struct AppParts {
    pub engine: Engine,
    pub auth: Arc<Auth>,
    pub limits: Arc<Limits>,
    /// Where webhooks may be delivered (`--webhook-allow` opens more than the default).
    pub webhook_policy: Arc<DestinationPolicy>,
    /// Host names requests may be addressed to without authentication (see `guard`).
    pub allowed_hosts: Arc<[String]>,
}

impl Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

impl DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut AppParts {
        Arc::make_mut(&mut self.0)
    }
}

impl AppState {
    /// A server without authentication (for loopback use and tests), with the default limits.
    pub fn new(engine: Engine) -> AppState {
        AppState::with_limits(engine, Limits::default())
    }

    /// A server without authentication, with these limits.
    pub fn with_limits(engine: Engine, limits: Limits) -> AppState {
        AppState(Arc::new(AppParts {
            engine,
            auth: Arc::new(Auth::default()),
            limits: Arc::new(limits),
            webhook_policy: Arc::default(),
            allowed_hosts: Arc::new([]),
        }))
    }

    /// A server that requires an API token on every request but health and the API document.
    pub fn with_auth(engine: Engine) -> AppState {
        let mut state = AppState::new(engine);
        state.auth = Arc::new(Auth::required());
        state
    }
}

/// A token's last-used time is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Whether requests must carry a token, and when each token's use was last recorded.
#[derive(Default)]
pub struct Auth {
    required: bool,
    touched: Mutex<HashMap<String, Instant>>,
}

impl Auth {
    /// Every request (but health and the API document) must carry a token.
    pub fn required() -> Auth {
        Auth {
            required: true,
            touched: Mutex::default(),
        }
    }

    pub fn is_required(&self) -> bool {
        self.required
    }

    /// True when the token's use should be written now (at most once per `TOUCH_EVERY`).
    pub(crate) fn due_for_touch(&self, id: &str) -> bool {
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match touched.get(id) {
            Some(at) if now.duration_since(*at) < TOUCH_EVERY => false,
            _ => {
                touched.insert(id.to_owned(), now);
                true
            }
        }
    }
}
