//! A JSON reader for the reviews the API server writes, quicker than `serde_json` where the
//! webhook spends its time: scanning strings sixteen bytes a step on x86-64
//! (`injector_core::json_scan`), and skipping what is not read (most of a Pod) with a loop
//! that checks the syntax but builds nothing.
//!
//! It refuses what it is not sure to read exactly as `serde_json` does: numbers with a
//! fraction or an exponent, beyond 64 bits, or `-0`; nesting deeper than [`MAX_DEPTH`];
//! `serde_json`'s own types (`RawValue`); structs written as arrays, enums and bytes; and any
//! error a visitor raises. A refused review is read again by `serde_json`, which answers it or
//! says what is wrong; so what this reader accepts it reads as `serde_json` would (the tests
//! compare the two on generated JSON), and it never needs an error message of its own.
//! `serde_json` has no hook for a faster skip or scan, and the faster parsers are slower
//! through `serde` or need memory for every value of the body (docs/architecture.md,
//! decision 21).

use std::fmt;

use injector_core::json_scan::plain_end;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Nesting deeper than this is refused (`serde_json` reads up to 127 levels).
const MAX_DEPTH: u32 = 100;

/// Why the body is left to `serde_json`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The reader is not sure to read it as `serde_json` does.
    Unsure,
    /// A visitor refused what it was given: through `serde_json` it is given the same, and
    /// refuses it the same.
    ByVisitor,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for Refused {}

impl de::Error for Refused {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Refused::ByVisitor
    }
}

type Result<T> = std::result::Result<T, Refused>;

/// Reads one JSON text; deserialize from `&mut Reader`, then call [`Reader::end`].
pub(super) struct Reader<'de> {
    text: &'de str,
    at: usize,
    /// How many objects and arrays are open.
    depth: u32,
}

/// A string read: borrowed from the text, or unescaped.
enum Str<'de> {
    Borrowed(&'de str),
    Unescaped(String),
}

/// A number read: one of those `serde_json` gives as an integer.
enum Integer {
    Unsigned(u64),
    Negative(i64),
}

impl<'de> Reader<'de> {
    pub(super) fn new(text: &'de str) -> Self {
        Reader {
            text,
            at: 0,
            depth: 0,
        }
    }

    /// Checks that only whitespace follows what was read.
    pub(super) fn end(&mut self) -> Result<()> {
        self.skip_whitespace();
        if self.at == self.text.len() {
            Ok(())
        } else {
            Err(Refused::Unsure)
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        self.at = past_whitespace(self.text.as_bytes(), self.at);
    }

    /// The first byte of the next value.
    fn peek_value(&mut self) -> Result<u8> {
        self.skip_whitespace();
        self.peek().ok_or(Refused::Unsure)
    }

    fn eat(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(Refused::Unsure)
        }
    }

    fn eat_literal(&mut self, literal: &[u8]) -> Result<()> {
        self.at = literal_end(self.text.as_bytes(), self.at, literal)?;
        Ok(())
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Refused::Unsure);
        }
        Ok(())
    }

    /// Reads a string whose opening quote was read.
    #[inline]
    fn read_str(&mut self) -> Result<Str<'de>> {
        let start = self.at;
        let end = plain_end(self.text.as_bytes(), start);
        if self.text.as_bytes().get(end) == Some(&b'"') {
            self.at = end + 1;
            return self
                .text
                .get(start..end)
                .map(Str::Borrowed)
                .ok_or(Refused::Unsure);
        }
        self.read_escaped_str(start, end)
    }

    /// Reads a string from `start`, whose plain text ends at `end` with an escape (or what
    /// ends it otherwise, which [`escaped_string_end`] refuses).
    #[cold]
    #[inline(never)]
    fn read_escaped_str(&mut self, start: usize, end: usize) -> Result<Str<'de>> {
        self.at = escaped_string_end(self.text.as_bytes(), end)?;
        // Escapes are rare in what the API server writes: `serde_json` unescapes them, so that
        // surrogates and the rest are read as it reads them.
        let quoted = self
            .text
            .get(start.saturating_sub(1)..self.at)
            .ok_or(Refused::Unsure)?;
        serde_json::from_str(quoted)
            .map(Str::Unescaped)
            .map_err(|_| Refused::Unsure)
    }

    /// Reads an integer as `serde_json` gives it; anything else it would read as a float is
    /// refused.
    fn read_integer(&mut self) -> Result<Integer> {
        let bytes = self.text.as_bytes();
        let negative = self.peek() == Some(b'-');
        let digits = self.at + usize::from(negative);
        self.at = integer_end(bytes, digits)?;
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(Refused::Unsure);
        }
        let magnitude: u64 = self
            .text
            .get(digits..self.at)
            .and_then(|digits| digits.parse().ok())
            .ok_or(Refused::Unsure)?;
        if negative {
            match i64::try_from(magnitude) {
                Ok(magnitude) if magnitude > 0 => Ok(Integer::Negative(-magnitude)),
                _ => Err(Refused::Unsure),
            }
        } else {
            Ok(Integer::Unsigned(magnitude))
        }
    }

    /// Skips one value, checking its syntax, without recursion: the containers open inside
    /// it are bits of a `u128`, the innermost lowest (1 an object, 0 an array). The position is
    /// kept in a local, not in `self`, as the loop runs over most of a Pod. The API server
    /// writes no whitespace: each place looks first for what comes next, and only then past
    /// whitespace.
    fn skip_value(&mut self) -> Result<()> {
        let bytes = self.text.as_bytes();
        let mut at = self.at;
        let mut open: u128 = 0;
        let mut depth = 0;
        'value: loop {
            match bytes.get(at) {
                Some(b'"') => at = string_end(bytes, at + 1)?,
                Some(&opening @ (b'{' | b'[')) => {
                    depth += 1;
                    if self.depth + depth > MAX_DEPTH {
                        return Err(Refused::Unsure);
                    }
                    let object = opening == b'{';
                    open = open << 1 | u128::from(object);
                    at += 1;
                    if object {
                        if bytes.get(at) == Some(&b'"') {
                            at = key_end(bytes, at)?;
                            continue 'value;
                        }
                        at = past_whitespace(bytes, at);
                        if bytes.get(at) != Some(&b'}') {
                            at = key_end(bytes, at)?;
                            continue 'value;
                        }
                    } else {
                        at = past_whitespace(bytes, at);
                        if bytes.get(at) != Some(&b']') {
                            continue 'value;
                        }
                    }
                    at += 1;
                    open >>= 1;
                    depth -= 1;
                }
                Some(b't') => at = literal_end(bytes, at, b"true")?,
                Some(b'f') => at = literal_end(bytes, at, b"false")?,
                Some(b'n') => at = literal_end(bytes, at, b"null")?,
                Some(b'-' | b'0'..=b'9') => at = number_end(bytes, at)?,
                Some(b' ' | b'\n' | b'\t' | b'\r') => {
                    at = past_whitespace(bytes, at + 1);
                    continue 'value;
                }
                _ => return Err(Refused::Unsure),
            }
            // A value ended: close the containers that end with it, up to the next value.
            while depth > 0 {
                let object = open & 1 == 1;
                match (bytes.get(at), object) {
                    (Some(b','), true) => {
                        at = key_end(bytes, at + 1)?;
                        continue 'value;
                    }
                    (Some(b','), false) => {
                        at += 1;
                        continue 'value;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        at += 1;
                        open >>= 1;
                        depth -= 1;
                    }
                    (Some(b' ' | b'\n' | b'\t' | b'\r'), _) => at = past_whitespace(bytes, at + 1),
                    _ => return Err(Refused::Unsure),
                }
            }
            self.at = at;
            return Ok(());
        }
    }

    fn visit_str<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        match self.read_str()? {
            Str::Borrowed(text) => visitor.visit_borrowed_str(text),
            Str::Unescaped(text) => visitor.visit_str(&text),
        }
    }

    fn visit_map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.enter()?;
        self.at += 1;
        let value = visitor.visit_map(Entries {
            reader: self,
            first: true,
        })?;
        self.skip_whitespace();
        self.eat(b'}')?;
        self.depth -= 1;
        Ok(value)
    }

    fn visit_seq<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.enter()?;
        self.at += 1;
        let value = visitor.visit_seq(Elements {
            reader: self,
            first: true,
        })?;
        self.skip_whitespace();
        self.eat(b']')?;
        self.depth -= 1;
        Ok(value)
    }
}

/// From `at`, past any whitespace.
#[inline]
fn past_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// Past the end of the string whose opening quote is just before `at`, checking its escapes
/// as `serde_json` does when it skips one (four hex digits after `\u`, surrogates unchecked).
/// Most strings end within their first sixteen bytes without an escape: that case is inline.
#[inline]
fn string_end(bytes: &[u8], at: usize) -> Result<usize> {
    let end = plain_end(bytes, at);
    if bytes.get(end) == Some(&b'"') {
        return Ok(end + 1);
    }
    escaped_string_end(bytes, end)
}

/// [`string_end`] from `at`, where its plain text stopped: at an escape, or what ends it
/// otherwise.
#[cold]
#[inline(never)]
fn escaped_string_end(bytes: &[u8], mut at: usize) -> Result<usize> {
    loop {
        match bytes.get(at) {
            Some(b'"') => return Ok(at + 1),
            Some(b'\\') => {
                at = match bytes.get(at + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at + 2,
                    Some(b'u') => match bytes.get(at + 2..at + 6) {
                        Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => at + 6,
                        _ => return Err(Refused::Unsure),
                    },
                    _ => return Err(Refused::Unsure),
                };
            }
            // A control character, or the end of the text.
            _ => return Err(Refused::Unsure),
        }
        at = plain_end(bytes, at);
    }
}

/// Past a key and its colon, from `at`: the key's opening quote, or whitespace before it.
/// Always inline: the skipping loop meets a key about 140 times a review, and as a call it
/// cost `decide` about 6k instructions.
#[inline(always)]
fn key_end(bytes: &[u8], at: usize) -> Result<usize> {
    if bytes.get(at) != Some(&b'"') {
        return spaced_key_end(bytes, at);
    }
    let at = string_end(bytes, at + 1)?;
    if bytes.get(at) != Some(&b':') {
        return spaced_colon_end(bytes, at);
    }
    Ok(at + 1)
}

/// [`key_end`] where whitespace may come before the key.
#[cold]
#[inline(never)]
fn spaced_key_end(bytes: &[u8], at: usize) -> Result<usize> {
    let at = past_whitespace(bytes, at);
    if bytes.get(at) != Some(&b'"') {
        return Err(Refused::Unsure);
    }
    spaced_colon_end(bytes, string_end(bytes, at + 1)?)
}

/// Past the colon after a key, from `at`, where whitespace may come before it.
#[cold]
#[inline(never)]
fn spaced_colon_end(bytes: &[u8], at: usize) -> Result<usize> {
    let at = past_whitespace(bytes, at);
    if bytes.get(at) != Some(&b':') {
        return Err(Refused::Unsure);
    }
    Ok(at + 1)
}

/// Past `literal` (`true`, `false`, `null`) at `at`.
fn literal_end(bytes: &[u8], at: usize, literal: &[u8]) -> Result<usize> {
    let rest = bytes.get(at..).unwrap_or_default();
    if rest.starts_with(literal) {
        Ok(at + literal.len())
    } else {
        Err(Refused::Unsure)
    }
}

/// Past the digits of an integer at `at`: `0`, or a digit from 1 to 9 and more digits; a digit
/// after a leading zero is refused.
fn integer_end(bytes: &[u8], at: usize) -> Result<usize> {
    let end = match bytes.get(at) {
        Some(b'0') => at + 1,
        Some(b'1'..=b'9') => digits_end(bytes, at + 1),
        _ => return Err(Refused::Unsure),
    };
    if matches!(bytes.get(end), Some(b'0'..=b'9')) {
        return Err(Refused::Unsure);
    }
    Ok(end)
}

/// Past the digits from `at` (none or more).
fn digits_end(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b'0'..=b'9') = bytes.get(at) {
        at += 1;
    }
    at
}

/// Past one digit or more from `at`.
fn some_digits_end(bytes: &[u8], at: usize) -> Result<usize> {
    match bytes.get(at) {
        Some(b'0'..=b'9') => Ok(digits_end(bytes, at + 1)),
        _ => Err(Refused::Unsure),
    }
}

/// Past a number at `at`, checking it is one.
fn number_end(bytes: &[u8], mut at: usize) -> Result<usize> {
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    at = integer_end(bytes, at)?;
    if bytes.get(at) == Some(&b'.') {
        at = some_digits_end(bytes, at + 1)?;
    }
    if let Some(b'e' | b'E') = bytes.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = bytes.get(at) {
            at += 1;
        }
        at = some_digits_end(bytes, at)?;
    }
    Ok(at)
}

/// Methods that read a number, refusing anything else before the visitor sees it (as
/// `serde_json` does).
macro_rules! number {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
                match self.peek_value()? {
                    b'-' | b'0'..=b'9' => self.deserialize_any(visitor),
                    _ => Err(Refused::Unsure),
                }
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Refused;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek_value()? {
            b'"' => {
                self.at += 1;
                self.visit_str(visitor)
            }
            b'{' => self.visit_map(visitor),
            b'[' => self.visit_seq(visitor),
            b't' => {
                self.eat_literal(b"true")?;
                visitor.visit_bool(true)
            }
            b'f' => {
                self.eat_literal(b"false")?;
                visitor.visit_bool(false)
            }
            b'n' => {
                self.eat_literal(b"null")?;
                visitor.visit_unit()
            }
            b'-' | b'0'..=b'9' => match self.read_integer()? {
                Integer::Unsigned(n) => visitor.visit_u64(n),
                Integer::Negative(n) => visitor.visit_i64(n),
            },
            _ => Err(Refused::Unsure),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip_value()?;
        visitor.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek_value()? == b'n' {
            self.eat_literal(b"null")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.eat_opening(b'"')?;
        self.visit_str(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek_value()? != b'{' {
            return Err(Refused::Unsure);
        }
        self.visit_map(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_map(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek_value()? != b'[' {
            return Err(Refused::Unsure);
        }
        self.visit_seq(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip_whitespace();
        self.eat_literal(b"null")?;
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        // `serde_json`'s own types (`RawValue`) are read by `serde_json`.
        if name.starts_with("$serde_json::") {
            return Err(Refused::Unsure);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        Err(Refused::Unsure)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Refused::Unsure)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Refused::Unsure)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // As `serde_json`, refused before the visitor sees anything else.
        match self.peek_value()? {
            b't' | b'f' => self.deserialize_any(visitor),
            _ => Err(Refused::Unsure),
        }
    }

    fn deserialize_i128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Refused::Unsure)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Refused::Unsure)
    }

    number! { deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_u8
    deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32 deserialize_f64 }
}

impl Reader<'_> {
    /// Eats the byte that opens the next value, which must be `byte`.
    fn eat_opening(&mut self, byte: u8) -> Result<()> {
        self.skip_whitespace();
        self.eat(byte)
    }
}

/// The entries of an object, as `serde_json` reads them.
struct Entries<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> MapAccess<'de> for Entries<'_, 'de> {
    type Error = Refused;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let reader = &mut *self.reader;
        reader.skip_whitespace();
        match reader.peek() {
            Some(b'}') => return Ok(None),
            Some(b',') if !self.first => {
                reader.at += 1;
                reader.skip_whitespace();
            }
            _ if self.first => {}
            _ => return Err(Refused::Unsure),
        }
        self.first = false;
        reader.eat(b'"')?;
        seed.deserialize(Key { reader }).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        self.reader.skip_whitespace();
        self.reader.eat(b':')?;
        seed.deserialize(&mut *self.reader)
    }
}

/// The elements of an array, as `serde_json` reads them.
struct Elements<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Elements<'_, 'de> {
    type Error = Refused;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        let reader = &mut *self.reader;
        reader.skip_whitespace();
        match reader.peek() {
            Some(b']') => return Ok(None),
            Some(b',') if !self.first => {
                reader.at += 1;
                // A seed may read nothing: a trailing comma is refused here.
                if reader.peek_value()? == b']' {
                    return Err(Refused::Unsure);
                }
            }
            _ if self.first => {}
            _ => return Err(Refused::Unsure),
        }
        self.first = false;
        seed.deserialize(&mut *reader).map(Some)
    }
}

/// A key, whose opening quote was read: a string, or refused when asked for anything else
/// (`serde_json` reads a number or a bool written as a key).
struct Key<'r, 'de> {
    reader: &'r mut Reader<'de>,
}

/// Methods of a deserializer that refuse.
macro_rules! refuse {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $(_: $ty,)* _visitor: V) -> Result<V::Value> {
                Err(Refused::Unsure)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Key<'_, 'de> {
    type Error = Refused;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.reader.visit_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // `serde_json` reads an ignored key as a string, refusing a lone surrogate.
        self.reader.read_str()?;
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! { str string identifier }

    refuse! {
        deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(),
        deserialize_u32(), deserialize_u64(), deserialize_u128(), deserialize_f32(),
        deserialize_f64(), deserialize_char(), deserialize_bytes(), deserialize_byte_buf(),
        deserialize_option(), deserialize_unit(), deserialize_seq(), deserialize_map(),
        deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_struct(name: &'static str, fields: &'static [&'static str]),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    }
}

#[cfg(test)]
#[path = "quick_json/tests.rs"]
mod tests;
