//! Secrets the engine hands out once and keeps only as hashes: API tokens' and callback
//! tokens' random parts, their SHA-256, and comparing a presented one in constant time.

use sha2::{Digest, Sha256};

/// 256 random bits from the operating system, as 64 hex digits.
pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source answers");
    hex(&bytes)
}

/// The SHA-256 of a secret, in hex: what the store keeps instead of it.
pub(crate) fn hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
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
    fn hashes_are_the_sha256_in_lowercase_hex() {
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn random_secrets_are_long_and_differ() {
        let (a, b) = (random_hex(), random_hex());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
