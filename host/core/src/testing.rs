//! Helpers for other crates' property tests, behind the `testing` feature: enabled only as a
//! dev-dependency feature by the crates whose tests use them, never in a build that ships.
//!
//! [`mutation`] and [`apply`] change a valid encoding (a signed plugin bundle, a catalog
//! envelope, a keyring file) a little, so a test can check that every change is refused by
//! name or leaves the same thing.

use proptest::prelude::*;
use proptest::sample::Index;

/// One change to a byte string.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR the byte at the position with a non-zero mask.
    Flip(Index, u8),
    /// Overwrite the byte at the position.
    Set(Index, u8),
    /// Cut the string at the position.
    Truncate(Index),
    /// Add bytes at the end.
    Append(Vec<u8>),
    /// Insert bytes at the position (the end included).
    Insert(Index, Vec<u8>),
    /// Remove up to this many bytes from the position on.
    Remove(Index, usize),
}

/// Any [`Mutation`], flips the likeliest. What is appended or inserted is one byte, a few bytes,
/// a few printable characters (for text encodings) or a run of up to 600 bytes (more than a tar
/// block); what is removed is one byte, a few, or up to 1 KiB.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let added = prop_oneof![
        1 => any::<u8>().prop_map(|byte| vec![byte]),
        2 => prop::collection::vec(any::<u8>(), 1..32),
        2 => "[ -~]{1,32}".prop_map(String::into_bytes),
        2 => prop::collection::vec(any::<u8>(), 1..600),
    ];
    let removed = prop_oneof![1 => Just(1usize), 2 => 1usize..64, 2 => 1usize..1024];
    prop_oneof![
        4 => (any::<Index>(), 1u8..).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set(at, byte)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => added.clone().prop_map(Mutation::Append),
        1 => (any::<Index>(), added).prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        1 => (any::<Index>(), removed).prop_map(|(at, len)| Mutation::Remove(at, len)),
    ]
}

/// Apply `mutation` to `bytes`; a change at a position of an empty string changes nothing.
pub fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len().max(1);
    match mutation {
        Mutation::Flip(at, mask) if !bytes.is_empty() => bytes[at.index(len)] ^= mask,
        Mutation::Set(at, byte) if !bytes.is_empty() => bytes[at.index(len)] = *byte,
        Mutation::Truncate(at) => bytes.truncate(at.index(len)),
        Mutation::Append(more) => bytes.extend_from_slice(more),
        Mutation::Insert(at, more) => {
            let at = at.index(bytes.len() + 1);
            bytes.splice(at..at, more.iter().copied());
        }
        Mutation::Remove(at, n) if !bytes.is_empty() => {
            let at = at.index(len);
            bytes.drain(at..(at + n).min(bytes.len()));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    /// An index that picks position `at` of a string `len` long.
    fn index_of(at: usize, len: usize) -> Index {
        let mut runner = TestRunner::deterministic();
        loop {
            let index = any::<Index>().new_tree(&mut runner).unwrap().current();
            if index.index(len) == at {
                return index;
            }
        }
    }

    #[test]
    fn each_mutation_changes_the_bytes_as_named() {
        let changed = |mutation: Mutation| {
            let mut bytes = b"abcd".to_vec();
            apply(&mut bytes, &mutation);
            bytes
        };
        assert_eq!(changed(Mutation::Flip(index_of(1, 4), 0x20)), b"aBcd");
        assert_eq!(changed(Mutation::Set(index_of(3, 4), b'!')), b"abc!");
        assert_eq!(changed(Mutation::Truncate(index_of(2, 4))), b"ab");
        assert_eq!(changed(Mutation::Append(b"ef".to_vec())), b"abcdef");
        assert_eq!(changed(Mutation::Insert(index_of(4, 5), b"ef".to_vec())), b"abcdef");
        assert_eq!(changed(Mutation::Insert(index_of(0, 5), b"ef".to_vec())), b"efabcd");
        assert_eq!(changed(Mutation::Remove(index_of(1, 4), 2)), b"ad");
        assert_eq!(changed(Mutation::Remove(index_of(2, 4), 100)), b"ab");
    }

    #[test]
    fn an_empty_string_takes_only_what_adds_bytes() {
        for mutation in [Mutation::Flip(index_of(0, 1), 1), Mutation::Set(index_of(0, 1), 1), Mutation::Remove(index_of(0, 1), 3)] {
            let mut bytes = Vec::new();
            apply(&mut bytes, &mutation);
            assert!(bytes.is_empty(), "{mutation:?}");
        }
        let mut bytes = Vec::new();
        apply(&mut bytes, &Mutation::Insert(index_of(0, 1), vec![7]));
        assert_eq!(bytes, [7]);
    }

    proptest! {
        /// A flip always changes the string; nothing but a truncation or a removal shortens it.
        #[test]
        fn flips_change_and_only_cuts_shorten(bytes in prop::collection::vec(any::<u8>(), 0..64), m in mutation()) {
            let mut changed = bytes.clone();
            apply(&mut changed, &m);
            match m {
                Mutation::Flip(..) if !bytes.is_empty() => prop_assert_ne!(&changed, &bytes),
                Mutation::Truncate(_) | Mutation::Remove(..) => prop_assert!(changed.len() <= bytes.len()),
                _ => prop_assert!(changed.len() >= bytes.len()),
            }
        }
    }
}
