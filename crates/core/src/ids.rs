//! Typed identifiers. Ids are made outside the core (the engine owns randomness) and passed in;
//! the newtypes make a mixed-up id a compile error.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! typed_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// Builds an id from its unique part (for example a UUIDv7 in simple form).
            pub fn from_unique(unique: &str) -> Self {
                Self(format!("{}_{unique}", $prefix))
            }

            /// Accepts a full id (`prefix_…`) as given by a client; `None` when the prefix or
            /// characters are wrong.
            pub fn parse(text: &str) -> Option<Self> {
                let unique = text.strip_prefix(concat!($prefix, "_"))?;
                let well_formed = !unique.is_empty()
                    && unique.len() <= 64
                    && unique.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                well_formed.then(|| Self(text.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

typed_id!(
    /// A job: one run of a workflow.
    JobId,
    "job"
);
typed_id!(
    /// A task: one step's execution (or one fan-out item, or one compensation) inside a job.
    TaskId,
    "tsk"
);

/// The unique part of a fresh id, made from a version 7 UUID (as its 128-bit number): its 48 bits
/// of Unix milliseconds and the next 64 of its counter and random bits, as 22 lowercase base-36
/// digits. The number is offset by one in its leading digit, so the first digit is never `0`:
/// fresh ids sort in the UUIDs' order, and after every id of the earlier form (the UUID's 32
/// hexadecimal digits, which begin with `0` until the year 2527). Version and variant bits carry
/// nothing and are left out; 22 digits instead of 32 save 10 bytes wherever an id is stored.
pub fn compact_unique(uuid_v7: u128) -> String {
    const WIDTH: u32 = 22;
    let millis = uuid_v7 >> 80;
    let rand_a = (uuid_v7 >> 64) & 0xfff;
    let rand_b = uuid_v7 & ((1 << 62) - 1);
    let ordered = (millis << 64) | (rand_a << 52) | (rand_b >> 10);
    base36(ordered + 36u128.pow(WIDTH - 1), WIDTH as usize)
}

/// `value` as `width` lowercase base-36 digits, zeros first; the digits of a value too large
/// for `width` are cut off at the front. 25 digits hold any 128-bit value (a random token's
/// 128 bits in 25 characters, not 32 hexadecimal ones).
pub fn base36(mut value: u128, width: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = vec![b'0'; width];
    for digit in digits.iter_mut().rev() {
        *digit = DIGITS[(value % 36) as usize];
        value /= 36;
    }
    digits.into_iter().map(char::from).collect()
}

/// Where the core gets fresh task ids from. The engine supplies UUIDv7-based ids; tests supply
/// counters, so every plan is reproducible.
pub trait IdSource {
    fn task_id(&mut self) -> TaskId;
    /// A child job's id (a sub-workflow step's attempt).
    fn job_id(&mut self) -> JobId;
}

/// A deterministic id source for tests and simulations.
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: u64,
}

impl IdSource for SequentialIds {
    fn task_id(&mut self) -> TaskId {
        self.next += 1;
        TaskId::from_unique(&format!("{:08}", self.next))
    }

    fn job_id(&mut self) -> JobId {
        self.next += 1;
        JobId::from_unique(&format!("c{:08}", self.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_only_the_right_prefix() {
        let id = JobId::from_unique("0190abc");
        assert_eq!(JobId::parse(id.as_str()), Some(id));
        assert_eq!(JobId::parse("tsk_0190abc"), None);
        assert_eq!(JobId::parse("job_"), None);
        assert_eq!(JobId::parse("job_a/b"), None);
    }

    /// A version 7 UUID's number from its parts (version and variant bits set as a UUID has them).
    fn uuid_v7(millis: u128, rand_a: u128, rand_b: u128) -> u128 {
        (millis << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    }

    #[test]
    fn base36_writes_every_128_bit_number_in_25_digits_zeros_first() {
        assert_eq!(base36(0, 3), "000");
        assert_eq!(base36(35, 2), "0z");
        assert_eq!(base36(36, 2), "10");
        assert_eq!(base36(u128::MAX, 25), "f5lxx1zz5pnorynqglhzmsp33");
    }

    #[test]
    fn compact_ids_keep_the_order_of_their_uuids_and_follow_the_older_form() {
        let now = 1_795_800_589_043;
        let uuids = [
            uuid_v7(0, 0, 0),
            uuid_v7(now, 0, 0),
            uuid_v7(now, 0, 1 << 10),
            uuid_v7(now, 1, 0),
            uuid_v7(now, 0xfff, (1 << 62) - 1),
            uuid_v7(now + 1, 0, 0),
            uuid_v7((1 << 48) - 1, 0xfff, (1 << 62) - 1),
        ];
        let compact: Vec<String> = uuids.iter().map(|&u| compact_unique(u)).collect();
        for pair in compact.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
        }
        for unique in &compact {
            assert_eq!(unique.len(), 22, "{unique}");
            assert!(
                unique
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
            );
            assert!(!unique.starts_with('0'), "{unique}");
            assert!(JobId::parse(&format!("job_{unique}")).is_some());
        }
        let older_form = format!("{:032x}", uuid_v7(now + 1_000_000, 0xfff, 0));
        assert!(
            older_form < compact[1],
            "{older_form} sorts before {}",
            compact[1]
        );
    }

    #[test]
    fn compact_ids_differ_in_the_bits_a_uuid_varies() {
        let now = 1_795_800_589_043;
        let base = compact_unique(uuid_v7(now, 0, 0));
        // The lowest 10 random bits are left out; the next one shows.
        assert_eq!(compact_unique(uuid_v7(now, 0, (1 << 10) - 1)), base);
        assert_ne!(compact_unique(uuid_v7(now, 0, 1 << 10)), base);
        assert_ne!(compact_unique(uuid_v7(now, 1 << 11, 0)), base);
    }
}
