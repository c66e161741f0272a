use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;

use super::{append, encode};

#[test]
fn matches_the_base64_crate_for_every_length_and_byte() {
    for len in 0..40 {
        for byte in 0..=u8::MAX {
            let bytes: Vec<u8> = (0..len)
                .map(|i| byte.wrapping_add((i as u8).wrapping_mul(37)))
                .collect();
            assert_eq!(encode(&bytes), STANDARD.encode(&bytes), "{bytes:?}");
        }
    }
}

#[test]
fn appends_after_what_is_there() {
    let mut out = b"patch:".to_vec();
    append(b"{\"op\":\"add\"}", &mut out);
    assert_eq!(out, b"patch:eyJvcCI6ImFkZCJ9");
}

proptest! {
    #[test]
    fn matches_the_base64_crate(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(encode(&bytes), STANDARD.encode(&bytes));
    }
}
