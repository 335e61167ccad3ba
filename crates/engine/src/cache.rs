//! Compiled workflow versions, kept in memory. A version never changes once stored, so a cached
//! entry is always right; it saves re-parsing the definition and the params schema per request.
//! Beside them, the latest version of each workflow as the writer last read it: a hint that lets
//! a submit make its job ready before it reaches the writer, which checks the hint still holds
//! (see `commands::submit::prepare`).

use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use starbridge_core::Workflow;
use starbridge_core::definition::Problem;
use starbridge_store::db::Conn;

use crate::{Error, Result};
use starbridge_store::rows;

/// A workflow version ready to run.
pub struct Compiled {
    pub workflow: Workflow,
    pub version: u32,
    params_validator: Option<jsonschema::Validator>,
}

impl Compiled {
    pub(crate) fn new(workflow: Workflow, version: u32) -> Result<Compiled> {
        let params_validator = match &workflow.params_schema {
            None => None,
            Some(schema) => Some(jsonschema::validator_for(schema).map_err(|error| {
                Error::Invalid(vec![Problem {
                    field: "params".to_owned(),
                    message: format!("not a valid JSON Schema: {error}"),
                }])
            })?),
        };
        Ok(Compiled {
            workflow,
            version,
            params_validator,
        })
    }

    /// Checks job params against the workflow's schema, naming each offending field.
    pub fn check_params(&self, params: &serde_json::Value) -> Result<()> {
        let Some(validator) = &self.params_validator else {
            return Ok(());
        };
        let problems: Vec<Problem> = validator
            .iter_errors(params)
            .map(|error| {
                let pointer = error.instance_path().to_string();
                Problem {
                    field: format!("params{}", pointer.replace('/', ".")),
                    message: error.to_string(),
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(problems))
        }
    }
}

/// (namespace, workflow name, version).
pub(crate) type Key = (String, String, u32);

#[derive(Default)]
pub(crate) struct WorkflowCache {
    entries: Mutex<HashMap<Key, Arc<Compiled>>>,
    /// (namespace, workflow name) -> its latest version, as the writer last read it.
    latest: Mutex<HashMap<(String, String), u32>>,
}

impl WorkflowCache {
    /// The compiled version, loading it from `conn` on a miss.
    pub(crate) fn get(
        &self,
        conn: &mut dyn Conn,
        namespace: &str,
        name: &str,
        version: u32,
    ) -> Result<Arc<Compiled>> {
        self.get_noting(conn, namespace, name, version, &mut Vec::new())
    }

    /// The same inside a write transaction, which may read a version it stored itself: the key
    /// of a version loaded now goes to `loaded`, so that it can be forgotten if the transaction
    /// (or the request's savepoint) rolls back and the version number is reused.
    pub(crate) fn get_noting(
        &self,
        conn: &mut dyn Conn,
        namespace: &str,
        name: &str,
        version: u32,
        loaded: &mut Vec<Key>,
    ) -> Result<Arc<Compiled>> {
        let key = (namespace.to_owned(), name.to_owned(), version);
        if let Some(found) = self.lock().get(&key) {
            return Ok(found.clone());
        }
        let stored = rows::workflow(conn, namespace, name, Some(version))?.ok_or_else(|| {
            Error::NotFound(format!("workflow {name} version {version} not found"))
        })?;
        let workflow = Workflow::from_value(name, stored.definition).map_err(|error| {
            Error::Corrupt(format!("stored definition of {name} v{version}: {error}"))
        })?;
        let compiled = Arc::new(Compiled::new(workflow, version)?);
        self.lock().insert(key.clone(), compiled.clone());
        loaded.push(key);
        Ok(compiled)
    }

    /// The compiled version if it is cached (no database needed).
    pub(crate) fn cached(
        &self,
        namespace: &str,
        name: &str,
        version: u32,
    ) -> Option<Arc<Compiled>> {
        self.lock()
            .get(&(namespace.to_owned(), name.to_owned(), version))
            .cloned()
    }

    /// Drops versions loaded by a write that was rolled back.
    pub(crate) fn forget(&self, keys: &[Key]) {
        if keys.is_empty() {
            return;
        }
        let mut entries = self.lock();
        for key in keys {
            entries.remove(key);
        }
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
        self.latest_hints().clear();
    }

    /// Notes the latest version of a workflow as the writer just read it (`None`: it has none).
    pub(crate) fn note_latest(&self, namespace: &str, name: &str, latest: Option<u32>) {
        let key = (namespace.to_owned(), name.to_owned());
        let mut hints = self.latest_hints();
        match latest {
            Some(version) => hints.insert(key, version),
            None => hints.remove(&key),
        };
    }

    /// The latest version of a workflow as the writer last read it: perhaps no longer so.
    pub(crate) fn latest_hint(&self, namespace: &str, name: &str) -> Option<u32> {
        self.latest_hints()
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn latest_hints(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), u32>> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Compiled>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
