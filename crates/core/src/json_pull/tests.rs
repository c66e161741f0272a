#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::{Map, Number, Value, json};

use super::*;

/// The value that comes next, read into a `Value` with the reader's calls.
fn value(reader: &mut Reader<'_>) -> Result<Value> {
    Ok(match reader.peek()? {
        // At odd depths, strings and `null`s are read as a Pod's optional strings are.
        b'"' | b'n' if reader.depth % 2 == 1 => match reader.string_or_null()? {
            Some(text) => Value::String(text.into_owned()),
            None => Value::Null,
        },
        b'"' => Value::String(reader.string()?.into_owned()),
        b'{' => {
            reader.object()?;
            let mut entries = Map::new();
            let mut first = true;
            while let Some(key) = reader.key(&mut first)? {
                let value = value(reader)?;
                entries.insert(key.to_owned(), value);
            }
            Value::Object(entries)
        }
        b'[' => {
            reader.array()?;
            let mut items = Vec::new();
            let mut first = true;
            while reader.item(&mut first)? {
                items.push(value(reader)?);
            }
            Value::Array(items)
        }
        b't' | b'f' => Value::Bool(reader.boolean()?),
        b'n' if reader.null()? => Value::Null,
        _ => match reader.integer()? {
            Integer::Unsigned(n) => Value::from(n),
            Integer::Negative(n) => Value::from(n),
        },
    })
}

/// `text` read into a `Value` by the reader.
fn quickly(text: &str) -> Result<Value> {
    let mut reader = Reader::new(text);
    let value = value(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// Whether the reader skips `text` as one value.
fn skips(text: &str) -> bool {
    let mut reader = Reader::new(text);
    reader.skip().is_ok() && reader.end().is_ok()
}

/// What the reader accepts, `serde_json` reads the same; what it skips, `serde_json` skips;
/// what it gives as raw text is the value's. Returns whether it read `text`.
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
        let mut reader = Reader::new(text);
        assert_eq!(reader.raw().map(str::trim), Ok(text.trim()));
    }
    assert!(read.is_err() || skipped, "read but not skipped: {text:?}");
    read.is_ok()
}

#[test]
fn what_the_api_server_writes_is_read_as_serde_json_reads_it() {
    let review = include_str!("../../../../bench/fixtures/typical-pod-review.json");
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
fn a_string_or_null_is_read_past_whitespace_and_anything_else_refused() {
    let read = |text: &str| {
        let mut reader = Reader::new(text);
        let read = reader.string_or_null()?;
        reader.end()?;
        Ok(read.map(Cow::into_owned))
    };
    assert_eq!(read(r#""a""#), Ok(Some("a".to_owned())));
    assert_eq!(read(" \n\t\r\"a\\u00e9\" "), Ok(Some("a\u{e9}".to_owned())));
    assert_eq!(read("null"), Ok(None));
    assert_eq!(read("\tnull\n"), Ok(None));
    for text in ["nul", "nulls", "1", "true", "{}", "[]", "", " ", "\"open"] {
        assert_eq!(read(text), Err(Refused), "{text:?}");
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
    let only = |depth: usize| {
        let text = format!(r#"{{"a":1,"b":{}}}"#, nested(depth));
        let mut reader = Reader::new(&text);
        let mut first = true;
        reader.object().is_ok()
            && reader.key(&mut first) == Ok(Some("a"))
            && reader.integer() == Ok(Integer::Unsigned(1))
            && reader.key(&mut first) == Ok(Some("b"))
            && reader.skip().is_ok()
    };
    assert!(only(limit - 1));
    assert!(!only(limit));
}

#[test]
fn keys_with_escapes_and_trailing_commas_are_refused() {
    // A key with an escape: serde_json checks its surrogates; the API server writes none.
    for text in [r#"{"\u00e9":0}"#, r#"{"a\"b":0}"#, r#"{"a":0,"\ud800":1}"#] {
        assert!(quickly(text).is_err(), "{text}");
        assert!(skips(text), "{text}");
    }
    // What follows a comma is read as a value: `]` and `}` are not one.
    for text in ["[1,]", "[1 , ]", r#"{"a":1,}"#, "[,1]", "{,}"] {
        assert!(quickly(text).is_err(), "{text}");
        assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    }
    // Asked for one type, another is refused.
    assert_eq!(Reader::new("1").string(), Err(Refused));
    assert_eq!(Reader::new("\"a\"").boolean(), Err(Refused));
    assert_eq!(Reader::new("null").object(), Err(Refused));
    assert_eq!(Reader::new("[]").integer(), Err(Refused));
    assert_eq!(Reader::new(" true").boolean(), Ok(true));
    // A number refused is not read: its text is there to be read otherwise (found by review).
    for number in ["-0", "-9223372036854775808", "1.5", "18446744073709551616"] {
        let mut reader = Reader::new(number);
        assert_eq!(reader.integer(), Err(Refused), "{number}");
        assert_eq!(reader.raw(), Ok(number));
    }
    assert_eq!(Reader::new("1").null(), Ok(false));
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

/// Whether every number of `value` is one the reader reads, and every key one without an
/// escape.
fn integers_only(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_u64() || n.as_i64().is_some_and(|n| n != i64::MIN),
        Value::Array(items) => items.iter().all(integers_only),
        Value::Object(entries) => entries
            .iter()
            .all(|(key, value)| plain(key) && integers_only(value)),
        _ => true,
    }
}

/// Whether `serde_json` writes `key` without an escape.
fn plain(key: &str) -> bool {
    serde_json::to_string(key).unwrap().len() == key.len() + 2
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
    let text =
        json!({"apiVersion": "v1", "skip": {"x": [1, 2.5, "\u{1}", null]}, "n": -3}).to_string();
    let mut reader = Reader::new(&text);
    let mut first = true;
    reader.object().unwrap();
    assert_eq!(reader.key(&mut first), Ok(Some("apiVersion")));
    assert_eq!(reader.string().as_deref(), Ok("v1"));
    assert_eq!(reader.key(&mut first), Ok(Some("n")));
    assert_eq!(reader.integer(), Ok(Integer::Negative(-3)));
    assert_eq!(reader.key(&mut first), Ok(Some("skip")));
    assert_eq!(reader.raw(), Ok(r#"{"x":[1,2.5,"\u0001",null]}"#));
    assert_eq!(reader.key(&mut first), Ok(None));
    assert_eq!(reader.end(), Ok(()));
    assert!(quickly(&text).is_err());
}
