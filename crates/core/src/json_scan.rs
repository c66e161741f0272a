//! Where a run of plain JSON string text ends: the first quote, backslash or control
//! character. Reading a review and writing a patch both spend much of their time on this
//! scan over short strings (a Pod's are about ten bytes), so it looks at sixteen bytes a step
//! with SSE2 on x86-64 (through `safe_arch`, as the workspace forbids `unsafe`), and eight a
//! step elsewhere.

/// From `at`, the index of the first quote, backslash or byte below 0x20 in `bytes`, or
/// `bytes.len()` when there is none (also when `at` is past the end).
#[inline]
pub fn plain_end(bytes: &[u8], at: usize) -> usize {
    // Most strings end within their first block: that one is looked at inline, the rest of a
    // longer string in a call.
    match block(bytes, at) {
        Ok(found) => found,
        Err(rest) => plain_end_after(bytes, rest),
    }
}

/// [`plain_end`] past the first block.
#[inline(never)]
fn plain_end_after(bytes: &[u8], at: usize) -> usize {
    match blocks(bytes, at.min(bytes.len())) {
        Ok(found) => found,
        Err(rest) => last_words(bytes, rest),
    }
}

/// [`words`], out of line: on x86-64 only the last fifteen bytes of a text are left to it.
#[inline(never)]
fn last_words(bytes: &[u8], at: usize) -> usize {
    words(bytes, at)
}

/// `Ok` where the first mark of the block at `at` is; else `Err` where to go on: past the
/// block, or at `at` when fewer than sixteen bytes are left.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn block(bytes: &[u8], at: usize) -> Result<usize, usize> {
    let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<16>) else {
        return Err(at);
    };
    match block_marks(chunk) {
        0 => Err(at + 16),
        marks => Ok(at + marks.trailing_zeros() as usize),
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline]
fn block(_bytes: &[u8], at: usize) -> Result<usize, usize> {
    Err(at)
}

/// A bit for each byte of `chunk` that is a quote, a backslash or below 0x20, the first byte's
/// lowest.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn block_marks(chunk: &[u8; 16]) -> i32 {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, m128i, max_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let block = m128i::from(*chunk);
    let below_space = set_splat_i8_m128i(0x1f);
    // A byte is below 0x20 when its unsigned maximum with 0x1f is 0x1f.
    let control = cmp_eq_mask_i8_m128i(max_u8_m128i(block, below_space), below_space);
    let special = bitor_m128i(
        cmp_eq_mask_i8_m128i(block, set_splat_i8_m128i(b'"' as i8)),
        cmp_eq_mask_i8_m128i(block, set_splat_i8_m128i(b'\\' as i8)),
    );
    move_mask_i8_m128i(bitor_m128i(special, control))
}

/// Whether `bytes` hold no quote, backslash or control character: a JSON string of them is
/// written as it is.
#[inline]
pub fn is_plain(bytes: &[u8]) -> bool {
    // A patch's strings are short: one of fewer than sixteen bytes is looked at in one block,
    // padded with a plain byte, rather than word by word.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    if let Some(padded) = padded_block(bytes) {
        return block_marks(&padded) == 0;
    }
    plain_end(bytes, 0) == bytes.len()
}

/// `bytes` padded to a block with a byte that is no mark, when shorter than sixteen.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn padded_block(bytes: &[u8]) -> Option<[u8; 16]> {
    if bytes.len() >= 16 {
        return None;
    }
    let mut block = [b'a'; 16];
    block.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(block)
}

/// [`block`] after block: `Ok` where the first mark is, or `Err` where fewer than sixteen
/// bytes are left.
#[inline]
fn blocks(bytes: &[u8], mut at: usize) -> Result<usize, usize> {
    loop {
        match block(bytes, at) {
            Err(next) if next != at => at = next,
            done => return done,
        }
    }
}

/// Eight bytes a step, then byte by byte.
fn words(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    while let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*chunk);
        // The high bit of each byte that is below 0x20, a quote or a backslash: a byte's own
        // high bit masks out bytes from 0x80, and a borrow can only mark bytes after a marked
        // one, so the lowest mark is exact.
        let control = word.wrapping_sub(ONES * 0x20);
        let quote = (word ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES);
        let backslash = (word ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES);
        let marks = (control | quote | backslash) & !word & HIGH;
        if marks != 0 {
            return at + marks.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests;
