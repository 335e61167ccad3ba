//! What a failed database call says about the database's ability to take writes: its disk is
//! full, it is read-only, or it cannot be reached. The store's errors carry it (`Error::Full`,
//! `Error::ReadOnly`, `Error::Unavailable`), so a refused request's 503 can say why, and the
//! writer records it for `/healthz` (see `health`).
//!
//! The rules are small pure functions over what each backend reports, tested as data below.

use std::path::Path;

use rusqlite::ErrorCode;

/// Why the database refuses writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteFault {
    /// The disk holding the database is full.
    Full,
    /// The database, or the filesystem it lives on, is read-only.
    ReadOnly,
    /// The database cannot be reached, or fails writes for another reason.
    Unavailable,
}

impl WriteFault {
    /// The name `/healthz` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteFault::Full => "full",
            WriteFault::ReadOnly => "read_only",
            WriteFault::Unavailable => "unavailable",
        }
    }

    /// What it means, for an operator.
    pub fn explain(self) -> &'static str {
        match self {
            WriteFault::Full => "the disk holding the database is full",
            WriteFault::ReadOnly => {
                "the database is read-only (its filesystem was remounted read-only, or \
                 PostgreSQL refuses writes)"
            }
            WriteFault::Unavailable => "the database cannot be reached or fails writes",
        }
    }
}

/// SQLite: the fault a failed call reports, from its result code (extended codes share their
/// primary code's class: `SQLITE_READONLY_*` are all read-only). SQLite reports a write the
/// filesystem refused as read-only (`EROFS`) as a plain I/O error, or as cannot-open for a file
/// it cannot create; `read_only_filesystem` (asked only then) says whether that is the cause.
pub fn sqlite_fault(
    code: ErrorCode,
    read_only_filesystem: impl FnOnce() -> bool,
) -> Option<WriteFault> {
    match code {
        ErrorCode::DiskFull => Some(WriteFault::Full),
        ErrorCode::ReadOnly => Some(WriteFault::ReadOnly),
        ErrorCode::SystemIoFailure | ErrorCode::CannotOpen => {
            read_only_filesystem().then_some(WriteFault::ReadOnly)
        }
        _ => None,
    }
}

/// A failed file operation of our own (syncing SQLite's write-ahead log): the fault its error
/// reports; one the filesystem neither ran out of space for nor refused as read-only leaves the
/// database out of reach.
pub fn io_fault(error: &std::io::Error) -> WriteFault {
    match error.kind() {
        std::io::ErrorKind::StorageFull => WriteFault::Full,
        std::io::ErrorKind::ReadOnlyFilesystem => WriteFault::ReadOnly,
        _ => WriteFault::Unavailable,
    }
}

/// PostgreSQL: the fault an error's SQLSTATE reports. `None` (no SQLSTATE) is the client's own
/// failure: a lost or refused connection.
pub fn postgres_fault(sqlstate: Option<&str>) -> Option<WriteFault> {
    let Some(code) = sqlstate else {
        return Some(WriteFault::Unavailable);
    };
    match code {
        // read_only_sql_transaction: a standby, or `default_transaction_read_only`.
        "25006" => Some(WriteFault::ReadOnly),
        // too_many_connections: the server refuses the connection itself.
        "53300" => Some(WriteFault::Unavailable),
        // Class 53, insufficient resources: disk_full (53100) and its kin.
        _ if code.starts_with("53") => Some(WriteFault::Full),
        // Connection exceptions; the server shutting down or restarting.
        _ if code.starts_with("08") || code.starts_with("57P") => Some(WriteFault::Unavailable),
        _ => None,
    }
}

/// Whether the filesystem holding `path` refuses writes (`EROFS`): the file is opened for
/// appending, which changes nothing in it.
pub fn read_only_filesystem(path: &Path) -> bool {
    match std::fs::OpenOptions::new().append(true).open(path) {
        Ok(_) => false,
        Err(error) => error.kind() == std::io::ErrorKind::ReadOnlyFilesystem,
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::ffi;

    use super::*;

    /// The code SQLite reports for an extended result code.
    fn code(extended: std::os::raw::c_int) -> ErrorCode {
        ffi::Error::new(extended).code
    }

    #[test]
    fn sqlite_full_is_full_and_every_read_only_code_is_read_only() {
        assert_eq!(
            sqlite_fault(code(ffi::SQLITE_FULL), || false),
            Some(WriteFault::Full)
        );
        for extended in [
            ffi::SQLITE_READONLY,
            ffi::SQLITE_READONLY_RECOVERY,
            ffi::SQLITE_READONLY_CANTLOCK,
            ffi::SQLITE_READONLY_ROLLBACK,
            ffi::SQLITE_READONLY_DBMOVED,
            ffi::SQLITE_READONLY_CANTINIT,
            ffi::SQLITE_READONLY_DIRECTORY,
        ] {
            assert_eq!(
                sqlite_fault(code(extended), || false),
                Some(WriteFault::ReadOnly),
                "extended code {extended}"
            );
        }
    }

    #[test]
    fn an_sqlite_io_error_is_read_only_only_when_the_filesystem_refuses_writes() {
        for extended in [
            ffi::SQLITE_IOERR_WRITE,
            ffi::SQLITE_IOERR_FSYNC,
            ffi::SQLITE_IOERR_SHMSIZE,
            ffi::SQLITE_CANTOPEN,
        ] {
            assert_eq!(
                sqlite_fault(code(extended), || true),
                Some(WriteFault::ReadOnly),
                "extended code {extended}"
            );
            assert_eq!(sqlite_fault(code(extended), || false), None);
        }
    }

    #[test]
    fn other_sqlite_failures_are_no_fault_and_do_not_look_at_the_filesystem() {
        for extended in [
            ffi::SQLITE_CONSTRAINT_UNIQUE,
            ffi::SQLITE_BUSY,
            ffi::SQLITE_CORRUPT,
            ffi::SQLITE_ERROR,
        ] {
            let fault = sqlite_fault(code(extended), || {
                panic!("the filesystem is asked only about I/O errors")
            });
            assert_eq!(fault, None, "extended code {extended}");
        }
    }

    #[test]
    fn a_failed_sync_of_our_own_is_full_read_only_or_out_of_reach_by_its_error() {
        use std::io::{Error, ErrorKind};
        assert_eq!(
            io_fault(&Error::from(ErrorKind::StorageFull)),
            WriteFault::Full
        );
        assert_eq!(
            io_fault(&Error::from(ErrorKind::ReadOnlyFilesystem)),
            WriteFault::ReadOnly
        );
        assert_eq!(
            io_fault(&Error::other("input/output error")),
            WriteFault::Unavailable
        );
    }

    #[test]
    fn postgres_disk_full_and_insufficient_resources_are_full_read_only_transactions_read_only() {
        for full in ["53100", "53000", "53200", "53400"] {
            assert_eq!(postgres_fault(Some(full)), Some(WriteFault::Full), "{full}");
        }
        assert_eq!(postgres_fault(Some("25006")), Some(WriteFault::ReadOnly));
    }

    #[test]
    fn a_lost_postgres_connection_is_unavailable_and_other_errors_are_no_fault() {
        for lost in [
            None,
            Some("08006"),
            Some("08001"),
            Some("57P01"),
            Some("53300"),
        ] {
            assert_eq!(
                postgres_fault(lost),
                Some(WriteFault::Unavailable),
                "{lost:?}"
            );
        }
        for other in ["23505", "40001", "42P01", "57014", "22003"] {
            assert_eq!(postgres_fault(Some(other)), None, "{other}");
        }
    }

    #[test]
    fn a_writable_file_is_not_on_a_read_only_filesystem_and_a_missing_one_is_not_either() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("db");
        std::fs::write(&file, b"x").unwrap();
        assert!(!read_only_filesystem(&file));
        assert!(!read_only_filesystem(&dir.path().join("missing")));
        assert_eq!(std::fs::read(&file).unwrap(), b"x", "nothing was changed");
    }
}
