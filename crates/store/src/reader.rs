//! A bounded pool of read connections, used from blocking threads so reads never stall the async
//! runtime or wait behind the writer. A connection that broke (the database restarted) is
//! dropped instead of returned, and the next read opens a fresh one.

use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::db::Conn;
use crate::{Connect, Error, Result};

pub struct ReadPool {
    connect: Connect,
    idle: Mutex<Vec<Box<dyn Conn>>>,
    /// One permit per connection that may be open at once.
    permits: Semaphore,
}

impl ReadPool {
    pub fn new(connect: Connect, size: usize) -> ReadPool {
        ReadPool {
            connect,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(size.max(1)),
        }
    }

    pub async fn read<T, F>(self: &Arc<Self>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn Conn) -> Result<T> + Send + 'static,
    {
        let permit = self.permits.acquire().await.map_err(|_| Error::Closed)?;
        let pool = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut conn = pool.take()?;
            let result = work(conn.as_mut());
            pool.put(conn);
            result
        })
        .await
        .map_err(|error| Error::Unavailable(format!("read task failed: {error}")))?;
        drop(permit);
        result
    }

    fn take(&self) -> Result<Box<dyn Conn>> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(conn) if conn.is_usable() => Ok(conn),
            _ => (self.connect)(),
        }
    }

    fn put(&self, conn: Box<dyn Conn>) {
        if conn.is_usable() {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
    }
}

impl Drop for ReadPool {
    /// Closes the idle connections on a thread of their own: closing a PostgreSQL client
    /// blocks, which is not allowed on the async runtime that usually drops the store.
    fn drop(&mut self) {
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !idle.is_empty() {
            std::thread::spawn(move || drop(idle));
        }
    }
}
