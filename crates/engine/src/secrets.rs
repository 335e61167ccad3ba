//! Secrets the engine hands out once and keeps only as hashes: API tokens' and callback
//! tokens' random parts, their SHA-256, and comparing a presented one in constant time.

use sha2::{Digest, Sha256};

/// 244 random bits as 64 hex digits (two version-4 UUIDs).
pub(crate) fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The SHA-256 of a secret, in hex: what the store keeps instead of it.
pub(crate) fn hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Equal strings, compared in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(constant_time_eq(&hash("abc"), &hash("abc")));
        assert!(!constant_time_eq(&hash("abc"), &hash("abd")));
        assert!(!constant_time_eq("abc", "abcd"));
    }

    #[test]
    fn random_secrets_are_long_and_differ() {
        let (a, b) = (random_hex(), random_hex());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
