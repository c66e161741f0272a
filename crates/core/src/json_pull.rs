//! A pull reader for the JSON the API server writes, quicker than `serde_json` where the
//! webhook spends its time: the caller asks for what it expects next (an object's next key, a
//! string, …) and skips the rest, so no visitor sits between the text and what is built;
//! strings are scanned sixteen bytes a step on x86-64 ([`crate::json_scan`]); what is not read
//! (most of a Pod) is skipped by a loop that checks the syntax but builds nothing.
//!
//! It refuses ([`Refused`]) what it is not sure to read exactly as `serde_json` does: keys read
//! with escapes (keys skipped are only checked), integers read beyond 64 bits, `-0` or
//! `i64::MIN`, and numbers read with a fraction or an exponent (a skipped number is only
//! checked, as `serde_json` checks one it ignores); nesting deeper than [`MAX_DEPTH`]; and
//! anything that is not JSON. A caller that meets what it does
//! not expect refuses too. A refused text is read again by `serde_json`, which answers it or
//! says what is wrong; so what this reader accepts it reads as `serde_json` would (the tests
//! compare the two on generated JSON), and it never needs an error message of its own.
//! `serde_json` has no hook for a faster skip or scan, and the faster parsers are slower
//! through `serde` or need memory for every value of the body (docs/architecture.md,
//! decision 21).

use std::borrow::Cow;
use std::fmt;

use crate::json_scan::plain_end;

/// Nesting deeper than this is refused (`serde_json` reads up to 127 levels).
pub const MAX_DEPTH: u32 = 100;

/// The text is left to `serde_json`: the reader or its caller is not sure to read it as
/// `serde_json` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for Refused {}

/// What the reader gives, or [`Refused`].
pub type Result<T> = std::result::Result<T, Refused>;

/// Reads one JSON text, value by value as the caller asks; then call [`Reader::end`].
pub struct Reader<'j> {
    text: &'j str,
    at: usize,
    /// How many objects and arrays are open.
    depth: u32,
}

/// A number read: one of those `serde_json` gives as an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integer {
    /// Zero or more.
    Unsigned(u64),
    /// Less than zero.
    Negative(i64),
}

impl<'j> Reader<'j> {
    /// A reader at the start of `text`.
    pub fn new(text: &'j str) -> Self {
        Reader {
            text,
            at: 0,
            depth: 0,
        }
    }

    /// Checks that only whitespace follows what was read.
    pub fn end(&mut self) -> Result<()> {
        self.skip_whitespace();
        if self.at == self.text.len() {
            Ok(())
        } else {
            Err(Refused)
        }
    }

    /// The first byte of the next value. Inline, and past whitespace only when there is some:
    /// the API server writes none, and this is asked before most values read.
    #[inline]
    pub fn peek(&mut self) -> Result<u8> {
        match self.byte() {
            Some(b' ' | b'\n' | b'\t' | b'\r') => self.peek_past_whitespace(),
            Some(byte) => Ok(byte),
            None => Err(Refused),
        }
    }

    /// [`Reader::peek`] where whitespace comes first.
    #[cold]
    #[inline(never)]
    fn peek_past_whitespace(&mut self) -> Result<u8> {
        self.skip_whitespace();
        self.byte().ok_or(Refused)
    }

    /// Reads `null` when it comes next: whether it did.
    #[inline]
    pub fn null(&mut self) -> Result<bool> {
        if self.peek()? != b'n' {
            return Ok(false);
        }
        self.null_here()?;
        Ok(true)
    }

    /// Reads the `null` whose `n` is at the position.
    #[inline]
    fn null_here(&mut self) -> Result<()> {
        self.at = literal_end(self.text.as_bytes(), self.at, b"null")?;
        Ok(())
    }

    /// Opens the object that comes next; read its entries with [`Reader::key`].
    pub fn object(&mut self) -> Result<()> {
        self.open(b'{')
    }

    /// The open object's next key, its colon read, or `None` when the object closes (it is
    /// then closed). `first` is `true` before the object's first key; it is kept by the caller.
    /// A key with an escape is refused: the API server writes none, and `serde_json` checks
    /// their surrogates. Always inline: a Pod decoder reads about 240 keys a review, and as a
    /// call this cost about 7.5k instructions.
    #[inline(always)]
    pub fn key(&mut self, first: &mut bool) -> Result<Option<&'j str>> {
        if !self.next_in(b'}', first)? {
            return Ok(None);
        }
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b'"') {
            return Err(Refused);
        }
        let start = self.at + 1;
        let end = plain_end(bytes, start);
        if bytes.get(end) != Some(&b'"') {
            return Err(Refused);
        }
        let key = self.text.get(start..end).ok_or(Refused)?;
        self.at = key_colon_end(bytes, end + 1)?;
        Ok(Some(key))
    }

    /// Opens the array that comes next; read its items with [`Reader::item`].
    pub fn array(&mut self) -> Result<()> {
        self.open(b'[')
    }

    /// Whether the open array has a next item, to be read next; when not, it is closed.
    /// `first` is `true` before its first item; it is kept by the caller.
    #[inline]
    pub fn item(&mut self, first: &mut bool) -> Result<bool> {
        // A trailing comma is refused by what reads the item: every reader refuses `]`.
        self.next_in(b']', first)
    }

    /// Reads the string or `null` that comes next: `None` for `null`.
    #[inline]
    pub fn string_or_null(&mut self) -> Result<Option<Cow<'j, str>>> {
        match self.peek()? {
            b'"' => self.string_here().map(Some),
            b'n' => self.null_here().map(|()| None),
            _ => Err(Refused),
        }
    }

    /// Reads the string that comes next, borrowed from the text unless it has escapes.
    #[inline]
    pub fn string(&mut self) -> Result<Cow<'j, str>> {
        if self.peek()? != b'"' {
            return Err(Refused);
        }
        self.string_here()
    }

    /// Reads the string whose opening quote is at the position.
    #[inline]
    fn string_here(&mut self) -> Result<Cow<'j, str>> {
        let bytes = self.text.as_bytes();
        let start = self.at + 1;
        let end = plain_end(bytes, start);
        if bytes.get(end) == Some(&b'"') {
            self.at = end + 1;
            return self.text.get(start..end).map(Cow::Borrowed).ok_or(Refused);
        }
        self.escaped_string(start, end).map(Cow::Owned)
    }

    /// Reads the `true` or `false` that comes next.
    pub fn boolean(&mut self) -> Result<bool> {
        let value = match self.peek()? {
            b't' => true,
            b'f' => false,
            _ => return Err(Refused),
        };
        let literal: &[u8] = if value { b"true" } else { b"false" };
        self.at = literal_end(self.text.as_bytes(), self.at, literal)?;
        Ok(value)
    }

    /// Reads the number that comes next as `serde_json` gives it, refusing anything it would
    /// read as a float (and `i64::MIN`); a refused number is not read.
    pub fn integer(&mut self) -> Result<Integer> {
        self.skip_whitespace();
        let bytes = self.text.as_bytes();
        let negative = self.byte() == Some(b'-');
        let digits = self.at + usize::from(negative);
        let end = integer_end(bytes, digits)?;
        if matches!(bytes.get(end), Some(b'.' | b'e' | b'E')) {
            return Err(Refused);
        }
        let magnitude: u64 = self
            .text
            .get(digits..end)
            .and_then(|digits| digits.parse().ok())
            .ok_or(Refused)?;
        let integer = if negative {
            match i64::try_from(magnitude) {
                Ok(magnitude) if magnitude > 0 => Integer::Negative(-magnitude),
                _ => return Err(Refused),
            }
        } else {
            Integer::Unsigned(magnitude)
        };
        // Only now: a refused number is where it was, for the caller to read otherwise.
        self.at = end;
        Ok(integer)
    }

    /// Skips the value that comes next, checking it as `serde_json` checks a value it ignores,
    /// and gives its text.
    pub fn raw(&mut self) -> Result<&'j str> {
        self.skip_whitespace();
        let start = self.at;
        self.skip()?;
        self.text.get(start..self.at).ok_or(Refused)
    }

    fn byte(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        self.at = past_whitespace(self.text.as_bytes(), self.at);
    }

    /// Opens the object or array that comes next, `opening` its first byte.
    fn open(&mut self, opening: u8) -> Result<()> {
        if self.peek()? != opening {
            return Err(Refused);
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Refused);
        }
        self.at += 1;
        Ok(())
    }

    /// Past the comma before the open container's next entry, or its `closing` byte (then it
    /// is closed): whether an entry follows.
    #[inline]
    fn next_in(&mut self, closing: u8, first: &mut bool) -> Result<bool> {
        match self.byte() {
            Some(byte) if byte == closing => {
                self.at += 1;
                self.depth = self.depth.saturating_sub(1);
                return Ok(false);
            }
            Some(b',') if !*first => {
                self.at += 1;
                if let Some(b' ' | b'\n' | b'\t' | b'\r') = self.byte() {
                    self.skip_whitespace();
                }
            }
            Some(b' ' | b'\n' | b'\t' | b'\r') => return self.next_past_whitespace(closing, first),
            _ if *first => {}
            _ => return Err(Refused),
        }
        *first = false;
        Ok(true)
    }

    /// [`Reader::next_in`] where whitespace comes first.
    #[cold]
    #[inline(never)]
    fn next_past_whitespace(&mut self, closing: u8, first: &mut bool) -> Result<bool> {
        self.skip_whitespace();
        self.next_in(closing, first)
    }

    /// Reads a string from `start`, its opening quote before it, whose plain text ends at
    /// `end` with an escape (or what ends it otherwise, which [`escaped_string_end`] refuses).
    #[cold]
    #[inline(never)]
    fn escaped_string(&mut self, start: usize, end: usize) -> Result<String> {
        self.at = escaped_string_end(self.text.as_bytes(), end)?;
        // Escapes are rare in what the API server writes: `serde_json` unescapes them, so that
        // surrogates and the rest are read as it reads them.
        let quoted = self
            .text
            .get(start.saturating_sub(1)..self.at)
            .ok_or(Refused)?;
        serde_json::from_str(quoted).map_err(|_| Refused)
    }

    /// Skips the value that comes next, checking it as `serde_json` checks a value it
    /// ignores. A string is skipped here, inline: about a third of the fields a Pod decoder
    /// skips are strings, and the call to [`Reader::skip_any`] cost more than skipping one.
    #[inline]
    pub fn skip(&mut self) -> Result<()> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) == Some(&b'"') {
            self.at = string_end(bytes, self.at + 1)?;
            return Ok(());
        }
        self.skip_any()
    }

    /// [`Reader::skip`] for any value, without recursion: the containers open inside
    /// it are bits of a `u128`, the innermost lowest (1 an object, 0 an array). The position is
    /// kept in a local, not in `self`, as the loop runs over most of a Pod. The API server
    /// writes no whitespace: each place looks first for what comes next, and only then past
    /// whitespace.
    #[inline(never)]
    fn skip_any(&mut self) -> Result<()> {
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
                        return Err(Refused);
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
                _ => return Err(Refused),
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
                    _ => return Err(Refused),
                }
            }
            self.at = at;
            return Ok(());
        }
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
                        _ => return Err(Refused),
                    },
                    _ => return Err(Refused),
                };
            }
            // A control character, or the end of the text.
            _ => return Err(Refused),
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
    key_colon_end(bytes, string_end(bytes, at + 1)?)
}

/// Past the colon after a key, from `at`, just after the key.
#[inline(always)]
fn key_colon_end(bytes: &[u8], at: usize) -> Result<usize> {
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
        return Err(Refused);
    }
    spaced_colon_end(bytes, string_end(bytes, at + 1)?)
}

/// Past the colon after a key, from `at`, where whitespace may come before it.
#[cold]
#[inline(never)]
fn spaced_colon_end(bytes: &[u8], at: usize) -> Result<usize> {
    let at = past_whitespace(bytes, at);
    if bytes.get(at) != Some(&b':') {
        return Err(Refused);
    }
    Ok(at + 1)
}

/// Past `literal` (`true`, `false`, `null`) at `at`.
fn literal_end(bytes: &[u8], at: usize, literal: &[u8]) -> Result<usize> {
    let rest = bytes.get(at..).unwrap_or_default();
    if rest.starts_with(literal) {
        Ok(at + literal.len())
    } else {
        Err(Refused)
    }
}

/// Past the digits of an integer at `at`: `0`, or a digit from 1 to 9 and more digits; a digit
/// after a leading zero is refused.
fn integer_end(bytes: &[u8], at: usize) -> Result<usize> {
    let end = match bytes.get(at) {
        Some(b'0') => at + 1,
        Some(b'1'..=b'9') => digits_end(bytes, at + 1),
        _ => return Err(Refused),
    };
    if matches!(bytes.get(end), Some(b'0'..=b'9')) {
        return Err(Refused);
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
        _ => Err(Refused),
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

#[cfg(test)]
#[path = "json_pull/tests.rs"]
mod tests;
