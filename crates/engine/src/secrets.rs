//! Secrets the engine hands out once and keeps only as hashes: API tokens' and callback
//! tokens' random parts, their SHA-256, and comparing a presented one in constant time.

use rand::Rng;
use sha2::{Digest, Sha256};

/// 256 random bits from the operating system, as 64 hex digits.
pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source answers");
    hex(&bytes)
}

/// Random bytes for the attempts a claim may start (a lease token and a callback secret
/// each), drawn before the claim reaches the writer thread from the calling thread's
/// cryptographically secure generator (`rand::rng()`: ChaCha seeded and periodically reseeded
/// from the operating system), which costs a fraction of a system call per claim; the writer
/// then spends nothing on randomness per task.
#[derive(Debug, Clone)]
pub(crate) struct AttemptSecrets {
    bytes: Vec<u8>,
}

/// One attempt's secrets: the lease token a worker reports with, and the secret of its callback
/// token, of which the store keeps only the hash.
pub(crate) struct AttemptSecret {
    pub(crate) lease_token: String,
    pub(crate) callback_secret: String,
}

impl AttemptSecrets {
    const LEASE: usize = 16;
    const CALLBACK: usize = 32;

    /// Enough for `attempts` attempts.
    pub(crate) fn for_attempts(attempts: u32) -> AttemptSecrets {
        let mut bytes = vec![0u8; attempts as usize * (Self::LEASE + Self::CALLBACK)];
        rand::rng().fill_bytes(&mut bytes);
        AttemptSecrets { bytes }
    }

    /// The secrets of the claim's `index`th attempt (from 0); past those drawn, fresh ones.
    pub(crate) fn attempt(&self, index: usize) -> AttemptSecret {
        let width = Self::LEASE + Self::CALLBACK;
        match self.bytes.get(index * width..(index + 1) * width) {
            Some(drawn) => AttemptSecret {
                lease_token: lease_token(&drawn[..Self::LEASE]),
                callback_secret: hex(&drawn[Self::LEASE..]),
            },
            None => {
                let mut drawn = [0u8; Self::LEASE];
                getrandom::fill(&mut drawn).expect("the operating system's random source answers");
                AttemptSecret {
                    lease_token: lease_token(&drawn),
                    callback_secret: random_hex(),
                }
            }
        }
    }
}

/// A lease token from its 128 random bits: 25 base-36 digits (every task row keeps its
/// attempt's token, 7 bytes shorter than in hex).
fn lease_token(drawn: &[u8]) -> String {
    let mut bits = [0u8; 16];
    bits.copy_from_slice(drawn);
    starbridge_core::ids::base36(u128::from_le_bytes(bits), LEASE_TOKEN_DIGITS)
}

/// Base-36 digits of a lease token: enough for any 128-bit number.
const LEASE_TOKEN_DIGITS: usize = 25;

/// The SHA-256 of a secret, in hex: what the store keeps instead of it.
pub(crate) fn hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

/// What a task row keeps of its attempt's callback secret: the first 128 bits of its SHA-256,
/// in hex (a presented token's full `hash` starts with it). Every claim stores one, and 128 bits
/// of the digest of a 256-bit random secret leave finding a token that matches as far out of
/// reach as the whole digest does, in half the bytes.
pub(crate) fn callback_hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes())[..CALLBACK_HASH_BYTES])
}

/// Bytes of a stored callback digest (128 bits).
const CALLBACK_HASH_BYTES: usize = 16;

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
    fn a_callback_digest_is_the_first_128_bits_of_the_sha256() {
        assert_eq!(callback_hash("abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert!(hash("abc").starts_with(&callback_hash("abc")));
    }

    #[test]
    fn each_attempt_of_a_claim_gets_its_own_secrets_even_past_those_drawn() {
        let secrets = AttemptSecrets::for_attempts(2);
        let attempts: Vec<AttemptSecret> = (0..3).map(|i| secrets.attempt(i)).collect();
        for attempt in &attempts {
            assert_eq!(attempt.lease_token.len(), LEASE_TOKEN_DIGITS);
            assert_eq!(attempt.callback_secret.len(), 64);
        }
        let mut all: Vec<&str> = attempts
            .iter()
            .flat_map(|a| [a.lease_token.as_str(), a.callback_secret.as_str()])
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6, "no secret repeats");
        let again = secrets.attempt(1);
        assert_eq!(
            (again.lease_token, again.callback_secret),
            (
                attempts[1].lease_token.clone(),
                attempts[1].callback_secret.clone()
            ),
            "a claim run again hands out the same secrets"
        );
    }

    #[test]
    fn random_secrets_are_long_and_differ() {
        let (a, b) = (random_hex(), random_hex());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
