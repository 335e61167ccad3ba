//! Helpers the end-to-end test files share. Each test file is a crate of its own and uses only
//! some of them.
#![allow(dead_code)]

use std::process::Child;

/// A loopback port nothing listens on at the moment.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process killed when the test ends, however it ends.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
