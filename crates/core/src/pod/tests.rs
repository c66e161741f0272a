#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

proptest! {
    /// Below and above the count where `get` stops scanning and searches, also after keys are
    /// set, it finds what a map holds: each key's last value, and nothing for a key not given.
    #[test]
    fn strings_give_each_keys_last_value_scanned_or_searched(
        entries in prop::collection::vec(("[a-c]{1,3}", prop::option::of("[xy]{0,2}")), 0..40),
        inserted in prop::collection::vec(("[a-d]{1,3}", "[xy]{0,2}"), 0..6),
        absent in "[a-d]{1,4}",
    ) {
        let mut model: BTreeMap<&str, Option<&str>> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        let mut strings = Strings::from_entries(
            entries
                .iter()
                .map(|(k, v)| (Cow::Borrowed(k.as_str()), v.as_deref().map(Cow::Borrowed)))
                .collect(),
        );
        // Keys set afterwards, some across the bound.
        for (key, value) in &inserted {
            model.insert(key, Some(value));
            strings.insert(Cow::Borrowed(key), Cow::Borrowed(value));
        }
        prop_assert_eq!(strings.len(), model.len());
        for (key, value) in &model {
            prop_assert_eq!(strings.get(key), Some(*value));
        }
        prop_assert_eq!(strings.get(&absent), model.get(absent.as_str()).copied());
    }
}
