use proptest::prelude::*;

use super::{is_plain, plain_end, words};

/// The scan byte by byte.
fn reference(bytes: &[u8], at: usize) -> usize {
    let at = at.min(bytes.len());
    bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map_or(bytes.len(), |found| at + found)
}

#[test]
fn finds_each_kind_of_mark_at_every_offset_of_a_block() {
    for mark in [b'"', b'\\', 0x00, 0x0a, 0x1f] {
        for len in 0..40 {
            for place in 0..len {
                let mut bytes = vec![b'a'; len];
                bytes[place] = mark;
                assert_eq!(
                    plain_end(&bytes, 0),
                    place,
                    "mark {mark:#x} at {place} of {len}"
                );
                assert_eq!(
                    words(&bytes, 0),
                    place,
                    "mark {mark:#x} at {place} of {len}"
                );
            }
            assert_eq!(plain_end(&vec![b'a'; len], 0), len);
        }
    }
}

#[test]
fn every_byte_is_told_apart_at_every_offset_of_two_blocks() {
    for len in 1..36 {
        for at in 0..len {
            for byte in 0..=u8::MAX {
                let mut bytes = vec![b'a'; len];
                bytes[at] = byte;
                assert_eq!(plain_end(&bytes, 0), reference(&bytes, 0), "{bytes:?}");
                // Beside a byte with its high bit set (UTF-8).
                bytes[(at + 1) % len] = 0xc3;
                assert_eq!(plain_end(&bytes, 0), reference(&bytes, 0), "{bytes:?}");
                assert_eq!(is_plain(&bytes), reference(&bytes, 0) == len, "{bytes:?}");
            }
        }
    }
}

#[test]
fn bytes_next_to_the_marks_are_plain() {
    // 0x20 and 0x7f bound the control range; bytes from 0x80 are UTF-8 and negative as i8.
    let plain: Vec<u8> = [
        0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0x9f, 0xa2, 0xdc, 0xff,
    ]
    .into_iter()
    .cycle()
    .take(50)
    .collect();
    assert_eq!(plain_end(&plain, 0), plain.len());
    assert!(is_plain(&plain));
    assert!(!is_plain(b"tab\there"));
    assert!(is_plain(b""));
}

#[test]
fn starts_where_asked() {
    let text = br#"{"name":"storefront","image":"registry.local/shop/storefront:1.4"}"#;
    assert_eq!(plain_end(text, 2), 6);
    assert_eq!(plain_end(text, 30), text.len() - 2);
    assert_eq!(plain_end(text, text.len()), text.len());
    assert_eq!(plain_end(text, text.len() + 5), text.len());
}

proptest! {
    #[test]
    fn agrees_with_a_byte_by_byte_scan(
        bytes in proptest::collection::vec(prop_oneof![
            8 => 0x20u8..0x7f,
            1 => any::<u8>(),
            1 => prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20],
        ], 0..80),
        at in 0usize..90,
    ) {
        prop_assert_eq!(plain_end(&bytes, at), reference(&bytes, at));
        prop_assert_eq!(words(&bytes, at.min(bytes.len())), reference(&bytes, at));
        prop_assert_eq!(is_plain(&bytes), reference(&bytes, 0) == bytes.len());
    }
}
