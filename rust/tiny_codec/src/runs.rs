//! Finding the end of a run of bytes, 16 at a time: the two inner loops of the scanner.
//!
//! - [`string_run`]: plain string content, up to the first `"`, `\`, control character
//!   (< 0x20) or non-ASCII byte (>= 0x80);
//! - [`digit_run`]: ASCII digits;
//!
//! and [`quotes_and_specials`], the per-16-byte step of the compact fast path (fast.rs).
//!
//! On x86_64 one SSE2 compare-and-movemask answers for 16 bytes, so a typical field (a few
//! to 16 bytes) ends in one step with no data-dependent loop branch, which also keeps the
//! branch predictor right when keys come in a random order. SSE2 is part of every x86_64
//! CPU, so there is no runtime detection. Elsewhere, and for the last bytes of a line, a
//! plain byte loop does the same.

/// Bytes that end a plain string run.
#[inline(always)]
fn string_stop(b: u8) -> bool {
    b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b)
}

/// Index of the first byte at or after `i` that ends a plain string run, or `s.len()`.
#[inline(always)]
pub(crate) fn string_run(s: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    while let Some(chunk) = chunk16(s, i) {
        let mask = sse2::string_stops(chunk);
        if mask != 0 {
            return i + mask.trailing_zeros() as usize;
        }
        i += 16;
    }
    while let Some(&b) = s.get(i) {
        if string_stop(b) {
            return i;
        }
        i += 1;
    }
    i
}

/// Index of the first byte at or after `i` that is not an ASCII digit, or `s.len()`.
#[inline(always)]
pub(crate) fn digit_run(s: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    while let Some(chunk) = chunk16(s, i) {
        let mask = sse2::non_digits(chunk);
        if mask != 0 {
            return i + mask.trailing_zeros() as usize;
        }
        i += 16;
    }
    while let Some(b) = s.get(i) {
        if !b.is_ascii_digit() {
            return i;
        }
        i += 1;
    }
    i
}

/// For 16 bytes: bit k of the first mask is set when byte k is `"`; the second is nonzero
/// when any byte is `\\`, a control character or non-ASCII (a "special" byte).
#[inline(always)]
pub(crate) fn quotes_and_specials(chunk: &[u8; 16]) -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    return sse2::quotes_and_specials(chunk);
    #[cfg(not(target_arch = "x86_64"))]
    return quotes_and_specials_bytes(chunk);
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))] // the x86_64 build only tests with it
fn quotes_and_specials_bytes(chunk: &[u8; 16]) -> (u32, u32) {
    let (mut quotes, mut specials) = (0, 0);
    for (k, &b) in chunk.iter().enumerate() {
        quotes |= ((b == b'"') as u32) << k;
        specials |= ((b == b'\\' || !(0x20..0x80).contains(&b)) as u32) << k;
    }
    (quotes, specials)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chunk16(s: &[u8], i: usize) -> Option<&[u8; 16]> {
    s.get(i..i.checked_add(16)?).and_then(|chunk| chunk.try_into().ok())
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    // SAFETY (every `unsafe` below): SSE2 is part of the x86_64 baseline, so these
    // intrinsics are always available, and each load reads exactly the 16 bytes of the
    // `&[u8; 16]` it is given (`loadu`: no alignment requirement).

    /// Bit k set when byte k ends a plain string run.
    #[inline(always)]
    pub fn string_stops(chunk: &[u8; 16]) -> u32 {
        unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            // A signed compare: bytes >= 0x80 are negative, so "< 0x20" also flags non-ASCII.
            let outside = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
            _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), outside)) as u32
        }
    }

    /// See [`super::quotes_and_specials`].
    #[inline(always)]
    pub fn quotes_and_specials(chunk: &[u8; 16]) -> (u32, u32) {
        unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            let outside = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)); // < 0x20 or >= 0x80
            let specials = _mm_or_si128(backslash, outside);
            (_mm_movemask_epi8(quote) as u32, _mm_movemask_epi8(specials) as u32)
        }
    }

    /// Bit k set when byte k is not an ASCII digit.
    #[inline(always)]
    pub fn non_digits(chunk: &[u8; 16]) -> u32 {
        unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            // Signed compares: bytes >= 0x80 are negative, so below b'0' too.
            let below = _mm_cmplt_epi8(v, _mm_set1_epi8(b'0' as i8));
            let above = _mm_cmpgt_epi8(v, _mm_set1_epi8(b'9' as i8));
            _mm_movemask_epi8(_mm_or_si128(below, above)) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths (16-byte chunks and the byte tail) against a plain definition, for every
    /// stop byte at every offset of a 40-byte line.
    #[test]
    fn runs_match_a_byte_loop() {
        for stop in 0..=255u8 {
            for at in 0..40 {
                let mut line = [b'a'; 40];
                line[at] = stop;
                let expected = line.iter().position(|&b| string_stop(b)).unwrap_or(40);
                assert_eq!(string_run(&line, 0), expected, "string stop {stop:#x} at {at}");
                assert_eq!(string_run(&line, at.min(3)), expected.max(at.min(3)));
                let mut digits = [b'7'; 40];
                digits[at] = stop;
                let expected = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(40);
                assert_eq!(digit_run(&digits, 0), expected, "digit stop {stop:#x} at {at}");
            }
        }
        for stop in 0..=255u8 {
            for at in 0..16 {
                let mut chunk = [b'a'; 16];
                chunk[at] = stop;
                chunk[(at + 5) % 16] = b'"';
                assert_eq!(quotes_and_specials(&chunk), quotes_and_specials_bytes(&chunk), "{stop:#x} at {at}");
            }
        }
        assert_eq!(string_run(b"", 0), 0);
        assert_eq!(string_run(b"abc", 5), 5);
        assert_eq!(digit_run(b"123", 3), 3);
    }
}
