//! The writer's set statements on SQLite (`Conn::execute_set`), bound where their values are.
//!
//! A set of 64 task rows binds 2,688 values. rusqlite binds every text with `SQLITE_TRANSIENT`,
//! so SQLite copies each one (past the connection's lookaside, a `malloc` and a `free` of the
//! C library's), and it clears every binding when a statement goes back to its cache: together
//! with building the list of values first, a tenth of a drain's writer (`perf`). Here the
//! statements are prepared once, their values bound with `SQLITE_STATIC` (SQLite reads the
//! caller's text while the statement runs) and unbound again before `execute` returns, so no
//! statement holds a pointer past the values' life. That clearing leaves every parameter NULL,
//! as a newly prepared statement's are, so a NULL value is not bound at all.
//!
//! This is the store's only unsafe code: the few calls of SQLite's C interface that rusqlite
//! does not offer in this form, each with the reason it is sound.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};

use rusqlite::{Connection, ffi};

use crate::db::Arg;

/// Most statements kept prepared; the writer's sets use a few dozen texts (tables, chunk
/// sizes, the job columns an upsert leaves alone).
const KEPT: usize = 64;

/// Prepared set statements of one connection, found by their text. They must be finalized
/// before the connection is closed: `SqliteConn` clears them when it is dropped.
#[derive(Default)]
pub(super) struct SetStatements {
    prepared: Vec<SetStatement>,
}

struct SetStatement {
    /// The text's address and length, which find it first (the writer's texts live as long
    /// as its connection): a text of 30 KB is compared only once found, and never hashed.
    address: usize,
    text: Box<str>,
    handle: NonNull<ffi::sqlite3_stmt>,
}

// SAFETY: the statements belong to one connection and are used only through `&mut` of the
// `SqliteConn` holding both, which moves between threads as a whole, as rusqlite's
// `Connection` and its cached statements do (SQLite is built thread-safe).
unsafe impl Send for SetStatements {}

impl SetStatements {
    /// Runs `sql` with `args` bound in order; returns how many rows it changed.
    pub(super) fn execute<'a>(
        &mut self,
        conn: &Connection,
        sql: &str,
        args: &mut dyn Iterator<Item = Arg<'a>>,
    ) -> rusqlite::Result<u64> {
        // SAFETY: the handle is used only for calls on this connection while `conn` is
        // borrowed, on this thread, and never closed here.
        let db = unsafe { conn.handle() };
        let statement = self.prepared(db, sql)?;
        let ran = bind_all(db, statement, args).and_then(|()| step(db, statement));
        // SAFETY: `statement` is a live statement of `db`. Resetting it ends its run (its
        // error, if any, was taken by `step`), and clearing its bindings leaves it no pointer
        // into `args`' text, which lives only for this call.
        unsafe {
            ffi::sqlite3_reset(statement.as_ptr());
            ffi::sqlite3_clear_bindings(statement.as_ptr());
        }
        ran
    }

    /// The prepared statement of `sql`, prepared now if it is not kept yet.
    fn prepared(
        &mut self,
        db: *mut ffi::sqlite3,
        sql: &str,
    ) -> rusqlite::Result<NonNull<ffi::sqlite3_stmt>> {
        let address = sql.as_ptr() as usize;
        if let Some(kept) = self
            .prepared
            .iter()
            .find(|kept| kept.address == address && *kept.text == *sql)
        {
            return Ok(kept.handle);
        }
        let length = c_int::try_from(sql.len()).map_err(|_| rusqlite::Error::InvalidQuery)?;
        let mut handle = ptr::null_mut();
        // SAFETY: `sql` is valid for `length` bytes (not NUL-terminated, which an explicit
        // length allows); `handle` receives the new statement, owned by this set from here on.
        let code = unsafe {
            ffi::sqlite3_prepare_v3(
                db,
                sql.as_ptr().cast(),
                length,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut handle,
                ptr::null_mut(),
            )
        };
        if code != ffi::SQLITE_OK {
            return Err(failure(db, code));
        }
        // No statement (the text held only a comment or white space): nothing to run.
        let handle = NonNull::new(handle).ok_or(rusqlite::Error::InvalidQuery)?;
        if self.prepared.len() >= KEPT {
            self.prepared.remove(0);
        }
        self.prepared.push(SetStatement {
            address,
            text: sql.into(),
            handle,
        });
        Ok(handle)
    }
}

impl Drop for SetStatement {
    fn drop(&mut self) {
        // SAFETY: the statement is live and owned by this entry alone; its connection is still
        // open (`SqliteConn` drops its set statements first).
        unsafe {
            ffi::sqlite3_finalize(self.handle.as_ptr());
        }
    }
}

/// Binds `args` to the statement's parameters in order, texts where they are.
fn bind_all<'a>(
    db: *mut ffi::sqlite3,
    statement: NonNull<ffi::sqlite3_stmt>,
    args: &mut dyn Iterator<Item = Arg<'a>>,
) -> rusqlite::Result<()> {
    let statement = statement.as_ptr();
    // SAFETY: a live statement.
    let expected = unsafe { ffi::sqlite3_bind_parameter_count(statement) };
    let mut index: c_int = 0;
    for arg in args {
        index += 1;
        if index > expected {
            break;
        }
        // SAFETY: a live statement and a parameter it has. A text is bound `SQLITE_STATIC`:
        // SQLite reads it in place until the binding is cleared, which `execute` does before
        // the text's lifetime `'a` (longer than this call) can end.
        let code = unsafe {
            match arg {
                // Every parameter is NULL already: a statement is prepared so, and `execute`
                // clears its bindings after each run. A row of 42 task columns holds about 25.
                Arg::Null => ffi::SQLITE_OK,
                Arg::Int(value) => ffi::sqlite3_bind_int64(statement, index, value),
                Arg::Real(value) => ffi::sqlite3_bind_double(statement, index, value),
                Arg::Text(text) => ffi::sqlite3_bind_text64(
                    statement,
                    index,
                    text.as_ptr().cast(),
                    text.len() as u64,
                    ffi::SQLITE_STATIC(),
                    ffi::SQLITE_UTF8 as u8,
                ),
            }
        };
        if code != ffi::SQLITE_OK {
            return Err(failure(db, code));
        }
    }
    if index == expected {
        Ok(())
    } else {
        Err(rusqlite::Error::InvalidParameterCount(
            usize::try_from(index).unwrap_or_default(),
            usize::try_from(expected).unwrap_or_default(),
        ))
    }
}

/// Runs the bound statement to its end; returns how many rows it changed.
fn step(db: *mut ffi::sqlite3, statement: NonNull<ffi::sqlite3_stmt>) -> rusqlite::Result<u64> {
    // SAFETY: a live statement with every parameter bound.
    match unsafe { ffi::sqlite3_step(statement.as_ptr()) } {
        // SAFETY: a live connection.
        ffi::SQLITE_DONE => Ok(unsafe { ffi::sqlite3_changes64(db) }.unsigned_abs()),
        ffi::SQLITE_ROW => Err(rusqlite::Error::ExecuteReturnedResults),
        code => Err(failure(db, code)),
    }
}

/// The error of a failed call on `db`, as rusqlite reports it (the extended code and message).
fn failure(db: *mut ffi::sqlite3, code: c_int) -> rusqlite::Error {
    // SAFETY: a live connection; the message is a NUL-terminated string SQLite owns, copied
    // at once.
    let (extended, message) = unsafe {
        let message = ffi::sqlite3_errmsg(db);
        let message =
            (!message.is_null()).then(|| CStr::from_ptr(message).to_string_lossy().into_owned());
        (ffi::sqlite3_extended_errcode(db), message)
    };
    // The extended code belongs to this failure when it refines the one returned.
    let code = if extended & 0xff == code & 0xff {
        extended
    } else {
        code
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(code), message)
}

#[cfg(test)]
mod tests {
    use super::super::SqliteConn;
    use crate::Error;
    use crate::db::{Arg, Conn, Queries, args};

    fn connection() -> (tempfile::TempDir, SqliteConn) {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = SqliteConn::open(&dir.path().join("sets.db")).unwrap();
        conn.batch("CREATE TABLE t (id TEXT PRIMARY KEY, n INTEGER, x REAL, note TEXT NOT NULL)")
            .unwrap();
        (dir, conn)
    }

    fn rows(conn: &mut SqliteConn) -> Vec<(String, Option<i64>, Option<f64>, String)> {
        (conn as &mut dyn Conn)
            .query_map("SELECT id, n, x, note FROM t ORDER BY id", args![], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .unwrap()
    }

    #[test]
    fn a_set_binds_every_kind_of_value_in_place_and_runs_again_with_new_ones() {
        let (_dir, mut conn) = connection();
        let sql = "INSERT INTO t (id, n, x, note) VALUES (?1, ?2, ?3, ?4), (?5, ?6, ?7, ?8) \
                   ON CONFLICT (id) DO UPDATE SET n = excluded.n, note = excluded.note"
            .to_owned();
        // Text with a NUL and non-ASCII characters binds by its length, as it is.
        let first = ["a".to_owned(), "b".to_owned(), "x\0y é".to_owned()];
        let values = [
            Arg::Text(&first[0]),
            Arg::Int(1),
            Arg::Real(0.5),
            Arg::Text(&first[2]),
            Arg::Text(&first[1]),
            Arg::Null,
            Arg::Null,
            Arg::Text(""),
        ];
        assert_eq!(conn.execute_set(&sql, &mut values.into_iter()).unwrap(), 2);
        let second = ["a".to_owned(), "c".to_owned(), "again".to_owned()];
        let values = [
            Arg::Text(&second[0]),
            Arg::Int(7),
            Arg::Null,
            Arg::Text(&second[2]),
            Arg::Text(&second[1]),
            Arg::Int(-3),
            Arg::Real(2.25),
            Arg::Text(&second[2]),
        ];
        assert_eq!(conn.execute_set(&sql, &mut values.into_iter()).unwrap(), 2);
        assert_eq!(
            rows(&mut conn),
            vec![
                ("a".to_owned(), Some(7), Some(0.5), "again".to_owned()),
                ("b".to_owned(), None, None, String::new()),
                ("c".to_owned(), Some(-3), Some(2.25), "again".to_owned()),
            ]
        );
    }

    #[test]
    fn a_null_where_the_run_before_bound_a_value_is_written_as_null() {
        let (_dir, mut conn) = connection();
        let sql = "INSERT INTO t (id, n, x, note) VALUES (?1, ?2, ?3, ?4)".to_owned();
        let values = [Arg::Text("a"), Arg::Int(5), Arg::Real(1.5), Arg::Text("x")];
        conn.execute_set(&sql, &mut values.into_iter()).unwrap();
        let values = [Arg::Text("b"), Arg::Null, Arg::Null, Arg::Text("y")];
        conn.execute_set(&sql, &mut values.into_iter()).unwrap();
        assert_eq!(
            rows(&mut conn),
            vec![
                ("a".to_owned(), Some(5), Some(1.5), "x".to_owned()),
                ("b".to_owned(), None, None, "y".to_owned()),
            ]
        );
    }

    #[test]
    fn a_text_at_the_address_of_an_earlier_one_runs_as_written() {
        let (_dir, mut conn) = connection();
        let mut sql = "INSERT INTO t (id, note) VALUES (?1, ?2)".to_owned();
        conn.execute_set(&sql, &mut [Arg::Text("a"), Arg::Text("first")].into_iter())
            .unwrap();
        // The same buffer, the same length, another statement: it is prepared anew.
        let address = sql.as_ptr();
        sql.clear();
        sql.push_str("INSERT INTO t (note, id) VALUES (?1, ?2)");
        assert_eq!(sql.as_ptr(), address);
        conn.execute_set(&sql, &mut [Arg::Text("second"), Arg::Text("b")].into_iter())
            .unwrap();
        let notes = rows(&mut conn);
        assert_eq!(notes[1].0, "b");
        assert_eq!(notes[1].3, "second");
    }

    #[test]
    fn a_failed_set_reports_its_cause_and_leaves_the_statement_usable() {
        let (_dir, mut conn) = connection();
        let sql = "INSERT INTO t (id, note) VALUES (?1, ?2)".to_owned();
        let refused = conn
            .execute_set(&sql, &mut [Arg::Text("a"), Arg::Null].into_iter())
            .unwrap_err();
        match refused {
            Error::Database(error) => {
                assert!(error.message.contains("NOT NULL"), "{}", error.message);
            }
            other => panic!("a constraint is a database error: {other:?}"),
        }
        let short = conn
            .execute_set(&sql, &mut [Arg::Text("a")].into_iter())
            .unwrap_err();
        assert!(short.to_string().contains("parameter"), "{short}");
        let long = conn
            .execute_set(
                &sql,
                &mut [Arg::Text("a"), Arg::Text("b"), Arg::Text("c")].into_iter(),
            )
            .unwrap_err();
        assert!(long.to_string().contains("parameter"), "{long}");
        assert_eq!(
            conn.execute_set(&sql, &mut [Arg::Text("a"), Arg::Text("kept")].into_iter())
                .unwrap(),
            1
        );
        assert_eq!(rows(&mut conn).len(), 1);
    }

    #[test]
    fn more_texts_than_are_kept_prepared_still_run_and_the_connection_closes() {
        let (dir, mut conn) = connection();
        let texts: Vec<String> = (0..super::KEPT + 8)
            .map(|n| format!("INSERT INTO t (id, n, note) VALUES (?1, {n}, ?2)"))
            .collect();
        for (n, sql) in texts.iter().enumerate() {
            let id = format!("{n:03}");
            conn.execute_set(sql, &mut [Arg::Text(&id), Arg::Text("x")].into_iter())
                .unwrap();
        }
        assert_eq!(conn.sets.prepared.len(), super::KEPT);
        // Dropping the connection finalizes its statements first (rusqlite would panic on a
        // connection that does not close); the file is then whole for the next one.
        drop(conn);
        let mut again = SqliteConn::open(&dir.path().join("sets.db")).unwrap();
        assert_eq!(rows(&mut again).len(), super::KEPT + 8);
    }
}
