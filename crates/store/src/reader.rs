//! A small pool of read connections, used from blocking threads so reads never stall the async
//! runtime or wait behind the writer.

use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::Connection;

use crate::{Error, Result, open_connection};

const MAX_IDLE: usize = 8;

pub(crate) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    pub(crate) fn new(path: PathBuf) -> ReadPool {
        ReadPool {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(crate) async fn read<T, F>(self: &std::sync::Arc<Self>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool.take()?;
            let result = work(&conn);
            pool.put(conn);
            result
        })
        .await
        .map_err(|error| Error::Unavailable(format!("read task failed: {error}")))?
    }

    fn take(&self) -> Result<Connection> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => open_connection(&self.path),
        }
    }

    fn put(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}
