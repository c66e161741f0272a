#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

proptest! {
    /// Below and above the count where `get` stops scanning and searches, it finds what a map
    /// holds: each key's last value, and nothing for a key not given.
    #[test]
    fn strings_give_each_keys_last_value_scanned_or_searched(
        entries in prop::collection::vec(("[a-c]{1,3}", prop::option::of("[xy]{0,2}")), 0..40),
        absent in "[a-d]{1,4}",
    ) {
        let model: BTreeMap<&str, Option<&str>> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        let strings = Strings::from_entries(
            entries
                .iter()
                .map(|(k, v)| (Cow::Borrowed(k.as_str()), v.as_deref().map(Cow::Borrowed)))
                .collect(),
        );
        prop_assert_eq!(strings.len(), model.len());
        for (key, value) in &model {
            prop_assert_eq!(strings.get(key), Some(*value));
        }
        prop_assert_eq!(strings.get(&absent), model.get(absent.as_str()).copied());
    }
}
