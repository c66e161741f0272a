#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Number, Value, json};

use super::*;

/// `text` read into a `Value` by the quick reader.
fn quickly(text: &str) -> Result<Value> {
    let mut reader = Reader::new(text);
    let value = Value::deserialize(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// Whether the quick reader skips `text` as one value.
fn skips(text: &str) -> bool {
    let mut reader = Reader::new(text);
    IgnoredAny::deserialize(&mut reader).is_ok() && reader.end().is_ok()
}

/// What the quick reader accepts, `serde_json` reads the same; what it skips, `serde_json`
/// skips. Returns whether it read `text`.
fn agrees(text: &str) -> bool {
    let read = quickly(text);
    if let Ok(value) = &read {
        assert_eq!(
            Some(value),
            serde_json::from_str::<Value>(text).ok().as_ref(),
            "{text:?}"
        );
    }
    let skipped = skips(text);
    if skipped {
        assert!(
            serde_json::from_str::<IgnoredAny>(text).is_ok(),
            "skipped {text:?}"
        );
    }
    assert!(read.is_err() || skipped, "read but not skipped: {text:?}");
    // Entry by entry, keys and values ignored (keys are then read as strings).
    let mut reader = Reader::new(text);
    if Entries::deserialize(&mut reader).is_ok() && reader.end().is_ok() {
        assert!(
            serde_json::from_str::<Entries>(text).is_ok(),
            "entries of {text:?}"
        );
    }
    read.is_ok()
}

#[test]
fn what_the_api_server_writes_is_read_as_serde_json_reads_it() {
    let review = include_str!("../../../../../bench/fixtures/typical-pod-review.json");
    assert!(agrees(review));
    assert!(skips(review));
    let pretty = serde_json::to_string_pretty(&serde_json::from_str::<Value>(review).unwrap());
    assert!(agrees(&pretty.unwrap()));
    for text in [
        r#""plain""#,
        r#""a\"b\\c\/d\b\f\n\r\t\u00e9\u2028 \ud83d\ude00""#,
        "\"\u{e9}\u{1F600}\u{7f}\"",
        "0",
        "-1",
        "18446744073709551615",
        "-9223372036854775807",
        "true",
        "false",
        "null",
        "[]",
        "{}",
        " [ 1 , { \"a\" : [ ] } , null ] ",
        "\t{\n\"k\"\r:\"v\"}\n",
        "{ }",
        "[ ]",
        "{ \"a\" : { } ,\n\"b\" :[\t] , \"c\":{\"d\" :1 }\r}",
        r#"{"a":1,"a":2}"#,
    ] {
        assert!(agrees(text), "refused {text:?}");
    }
}

#[test]
fn what_it_is_not_sure_of_is_refused() {
    for text in [
        // Read by serde_json as floats.
        "1.5",
        "1e3",
        "-0",
        "18446744073709551616",
        // Read by serde_json as i64::MIN: refused all the same.
        "-9223372036854775808",
        // Not JSON.
        "",
        "01",
        "1.",
        "1e",
        "+1",
        "[1,]",
        "[,1]",
        "[1 2]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{,"a":1}"#,
        r#"{1:1}"#,
        r#"{"a":1]"#,
        "[1}",
        r#""\x""#,
        r#""\u12g4""#,
        "\"a\u{1}b\"",
        "\"open",
        "tru",
        "nul",
        "[] []",
        // A lone surrogate: serde_json refuses it in a string it reads.
        r#""\ud800""#,
    ] {
        assert!(quickly(text).is_err(), "read {text:?}");
        agrees(text);
    }
    // Skipped, a float and a lone surrogate are fine, as with serde_json.
    for text in [
        "1.5",
        "-0",
        "1e3",
        "-2.5E-3",
        r#""\ud800""#,
        r#"[{"a":[1.0e+2]}]"#,
    ] {
        assert!(skips(text), "{text:?}");
        agrees(text);
    }
    for text in [
        "01",
        "1.",
        "[1,]",
        r#"{"a":1,}"#,
        r#""\x""#,
        "\"a\u{1}b\"",
        "tru",
        "{ , }",
        "[ 1 , ]",
        r#"{ "a" }"#,
        r#"{ "a" : 1 , }"#,
        r#"{ "a" : 1 "b" : 2 }"#,
        "[ ,1]",
        "[1 ,]",
        r#"{"a" :}"#,
        r#"{"a":1 ,}"#,
        "{ ",
        "[ ",
        r#"{"a" "#,
        r#"{ 1 : 2 }"#,
    ] {
        assert!(!skips(text), "{text:?}");
        agrees(text);
    }
}

#[test]
fn nesting_is_refused_beyond_its_limit_read_or_skipped() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let limit = MAX_DEPTH as usize;
    assert!(agrees(&nested(limit)));
    assert!(skips(&nested(limit)));
    assert!(quickly(&nested(limit + 1)).is_err());
    assert!(!skips(&nested(limit + 1)));
    // serde_json reads it: it is only left to serde_json.
    assert!(serde_json::from_str::<Value>(&nested(limit + 1)).is_ok());
    // The same with whitespace inside each level, and objects around empty ones.
    let spaced = |depth: usize| format!("{}{}", "[ ".repeat(depth), " ]".repeat(depth));
    assert!(skips(&spaced(limit)));
    assert!(!skips(&spaced(limit + 1)));
    let objects = |depth: usize| {
        format!(
            "{}{{ }}{}",
            r#"{ "a" : "#.repeat(depth - 1),
            " }".repeat(depth - 1)
        )
    };
    assert!(skips(&objects(limit)));
    assert!(!skips(&objects(limit + 1)));

    // Skipped inside what is read: the levels add up.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Only {
        a: u64,
    }
    let only = |depth: usize| {
        let text = format!(r#"{{"a":1,"b":{}}}"#, nested(depth));
        Only::deserialize(&mut Reader::new(&text)).is_ok()
    };
    assert!(only(limit - 1));
    assert!(!only(limit));
}

/// Skips each entry of an object, key and value, as `pod_json` does with a map it does not
/// read.
struct Entries;

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: de::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Skip;
        impl<'de> Visitor<'de> for Skip {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Entries)
            }
        }
        deserializer.deserialize_map(Skip)
    }
}

/// Reads nothing of an element.
struct Nothing;

impl<'de> Deserialize<'de> for Nothing {
    fn deserialize<D: de::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Ok(Nothing)
    }
}

#[test]
fn what_serde_json_checks_before_a_visitor_sees_it_is_checked_too() {
    // An ignored key is read as a string: a lone surrogate is refused (found by review).
    for text in [r#"{"\ud800":0}"#, r#"{"a":0,"\udc00x":1}"#] {
        assert!(serde_json::from_str::<Entries>(text).is_err());
        assert!(
            Entries::deserialize(&mut Reader::new(text)).is_err(),
            "{text}"
        );
    }
    let text = r#"{"\u00e9":0,"b":[1.5]}"#;
    assert!(serde_json::from_str::<Entries>(text).is_ok());
    assert!(Entries::deserialize(&mut Reader::new(text)).is_ok());
    // A trailing comma, also before an element that reads nothing.
    assert!(serde_json::from_str::<Vec<Nothing>>("[1,]").is_err());
    assert!(<Vec<Nothing>>::deserialize(&mut Reader::new("[1,]")).is_err());
    assert!(<Vec<Nothing>>::deserialize(&mut Reader::new("[ ]")).is_ok());
    // A number or a bool asked for: anything else is refused before a visitor sees it.
    for (text, wanted) in [
        (r#""x""#, "u64"),
        ("1", "bool"),
        ("null", "f64"),
        ("true", "i8"),
    ] {
        let mut reader = Reader::new(text);
        let refused = match wanted {
            "u64" => de::Deserializer::deserialize_u64(&mut reader, AnyStr).err(),
            "bool" => de::Deserializer::deserialize_bool(&mut reader, AnyStr).err(),
            "f64" => de::Deserializer::deserialize_f64(&mut reader, AnyStr).err(),
            _ => de::Deserializer::deserialize_i8(&mut reader, AnyStr).err(),
        };
        assert_eq!(refused, Some(Refused::Unsure), "{text} as {wanted}");
    }
    // 128-bit integers are read by serde_json with visit_i128: left to it.
    assert!(serde_json::from_str::<i128>("5").is_ok());
    assert_eq!(
        i128::deserialize(&mut Reader::new("5")).err(),
        Some(Refused::Unsure)
    );
    assert_eq!(u64::deserialize(&mut Reader::new("5")), Ok(5));
    assert_eq!(bool::deserialize(&mut Reader::new(" true")), Ok(true));
}

/// Accepts anything it is given.
struct AnyStr;

impl<'de> Visitor<'de> for AnyStr {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }
    fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<(), E> {
        Ok(())
    }
}

#[test]
fn serde_json_types_and_what_serde_json_reads_otherwise_are_refused() {
    let mut reader = Reader::new(r#"{"a":1}"#);
    assert!(<&serde_json::value::RawValue>::deserialize(&mut reader).is_err());
    // A struct written as an array (serde_json reads it).
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Pair {
        a: u64,
        b: u64,
    }
    assert!(serde_json::from_str::<Pair>("[1,2]").is_ok());
    assert!(Pair::deserialize(&mut Reader::new("[1,2]")).is_err());
    // A key read as a number (serde_json reads it).
    type Numbered = std::collections::BTreeMap<u64, u64>;
    assert!(serde_json::from_str::<Numbered>(r#"{"1":2}"#).is_ok());
    assert_eq!(
        Numbered::deserialize(&mut Reader::new(r#"{"1":2}"#)).err(),
        Some(Refused::Unsure)
    );
    let mut reader = Reader::new(r#"{"b":2,"a":1}"#);
    let pair = Pair::deserialize(&mut reader).unwrap();
    assert_eq!((pair.a, pair.b), (1, 2));
}

/// Any JSON value, with strings that need escapes and numbers of every kind.
fn any_json() -> impl Strategy<Value = Value> {
    let string = prop_oneof![
        "[a-z0-9./-]{0,24}",
        "\\PC{0,12}",
        Just("\"\\\u{0}\u{1f}\u{7f}\u{2028}\u{1F600}".to_owned()),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        string.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((string.clone(), inner), 0..8)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// Whether every number of `value` is one the quick reader reads.
fn integers_only(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_u64() || n.as_i64().is_some_and(|n| n != i64::MIN),
        Value::Array(items) => items.iter().all(integers_only),
        Value::Object(entries) => entries.values().all(integers_only),
        _ => true,
    }
}

/// Bytes that make or break JSON.
const SIGNIFICANT: &[u8] = b"{}[]\",:\\ 0-1.eEtfnu\x01";

proptest! {
    #[test]
    fn generated_json_is_read_as_serde_json_reads_it(value in any_json()) {
        for text in [value.to_string(), serde_json::to_string_pretty(&value).unwrap()] {
            let read = agrees(&text);
            prop_assert!(skips(&text), "{}", text);
            prop_assert_eq!(read, integers_only(&value), "{}", text);
        }
    }

    #[test]
    fn broken_json_is_never_read_otherwise_than_by_serde_json(
        value in any_json(),
        pretty in any::<bool>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0..SIGNIFICANT.len(), any::<bool>()), 1..4),
    ) {
        // Pretty-printed, broken JSON reaches the whitespace cases of the skipping loop.
        let text = if pretty {
            serde_json::to_string_pretty(&value).unwrap()
        } else {
            value.to_string()
        };
        let mut bytes = text.into_bytes();
        for (at, byte, insert) in edits {
            let at = at.index(bytes.len() + 1);
            if insert || at == bytes.len() {
                bytes.insert(at, SIGNIFICANT[byte]);
            } else {
                bytes.remove(at);
            }
        }
        if let Ok(text) = std::str::from_utf8(&bytes) {
            agrees(text);
        }
    }
}

#[test]
fn what_is_skipped_may_hold_what_would_be_refused_if_read() {
    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Read {
        api_version: String,
        n: i64,
    }
    let text =
        json!({"apiVersion": "v1", "skip": {"x": [1, 2.5, "\u{1}", null]}, "n": -3}).to_string();
    let read = Read::deserialize(&mut Reader::new(&text)).unwrap();
    assert_eq!(read, serde_json::from_str::<Read>(&text).unwrap());
    assert!(quickly(&text).is_err());
}
