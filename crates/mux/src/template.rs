//! Transmit header templates (Thekkath et al. §III-C): what every frame sent
//! on a channel must look like.
//!
//! A template is a list of `(offset, bytes, mask)` fields; a frame matches
//! when, for every field, `frame[offset + i] & mask[i] == bytes[i] & mask[i]`
//! for all `i` (and the frame is long enough to hold the field). The check
//! runs on the multiplexer's private copy of the frame, never on shared
//! memory.

use std::sync::OnceLock;

/// One field of a template: `len` bytes at `offset`, whose values (already
/// masked) and masks are at `start` in the template's `values` and `masks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    offset: usize,
    start: usize,
    len: usize,
}

/// The conjunction of its fields. An empty template matches every frame (a
/// privileged channel may send anything).
///
/// Every connection's bind makes one, so the fields' bytes share two
/// vectors instead of two each, and are merged into words once, at the
/// first match, not at each field a builder adds.
#[derive(Clone, Debug, Default)]
pub struct Template {
    fields: Vec<Field>,
    values: Vec<u8>,
    masks: Vec<u8>,
    /// The fields merged into 64-bit compares, for [`matches`](Self::matches).
    words: OnceLock<Words>,
}

impl PartialEq for Template {
    fn eq(&self, other: &Template) -> bool {
        self.each().eq(other.each())
    }
}

impl Eq for Template {}

/// Longest frame prefix a template is merged into words for; one whose
/// fields reach further (none that the multiplexer makes) is checked field
/// by field.
const WORDS_UP_TO: usize = 256;

/// A template's fields merged byte by byte, then cut into 64-bit words that
/// each compare up to 8 bytes under their mask: a socket's template (its
/// MAC, addresses, protocol and ports, some 40 bytes) is a handful of loads
/// instead of a loop over every byte of every field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Words {
    /// No field: every frame matches.
    #[default]
    Empty,
    Merged {
        /// The shortest frame that holds every field.
        need: usize,
        /// `(offset, bytes, mask, value)`: the `bytes` (at most 8) at
        /// `offset`, read little-endian, masked, must equal `value`.
        words: Vec<(usize, usize, u64, u64)>,
    },
    /// Two fields pin a bit to different values: nothing matches.
    Unsatisfiable,
    /// Fields beyond [`WORDS_UP_TO`]: checked field by field.
    Fields,
}

impl Words {
    fn of(t: &Template) -> Words {
        let Some(need) = t
            .each()
            .map(|(offset, bytes, _)| offset.checked_add(bytes.len()))
            .try_fold(0, |a, s| s.map(|s| a.max(s)))
        else {
            return Words::Fields;
        };
        if need > WORDS_UP_TO {
            return Words::Fields;
        }
        let (mut mask, mut value) = (vec![0u8; need], vec![0u8; need]);
        for (offset, bytes, masks) in t.each() {
            for (i, (&b, &m)) in bytes.iter().zip(masks).enumerate() {
                let o = offset + i;
                if (value[o] ^ b) & mask[o] & m != 0 {
                    return Words::Unsatisfiable;
                }
                mask[o] |= m;
                value[o] |= b;
            }
        }
        let mut words = Vec::new();
        let mut o = 0;
        while o < need {
            if mask[o] == 0 {
                o += 1;
                continue;
            }
            // A word that would run past `need` starts earlier instead (a
            // frame holds `need` bytes), unless the frame is that short.
            let start = o.min(need.saturating_sub(8));
            let end = (start + 8).min(need);
            let word = |b: &[u8]| {
                let mut w = [0u8; 8];
                w[..b.len()].copy_from_slice(b);
                u64::from_le_bytes(w)
            };
            words.push((
                start,
                end - start,
                word(&mask[start..end]),
                word(&value[start..end]),
            ));
            o = end;
        }
        if t.fields.is_empty() {
            Words::Empty
        } else {
            Words::Merged { need, words }
        }
    }
}

impl Template {
    pub fn new() -> Template {
        Template::default()
    }

    /// An empty template with room for `fields` fields of `bytes` bytes in
    /// all.
    pub fn with_capacity(fields: usize, bytes: usize) -> Template {
        Template {
            fields: Vec::with_capacity(fields),
            values: Vec::with_capacity(bytes),
            masks: Vec::with_capacity(bytes),
            words: OnceLock::new(),
        }
    }

    /// Builder: `bytes` at `offset`, every bit compared.
    pub fn field(mut self, offset: usize, bytes: &[u8]) -> Template {
        self.push(offset, bytes.len());
        self.values.extend_from_slice(bytes);
        self.masks.resize(self.values.len(), 0xff);
        self
    }

    /// Builder: `bytes` at `offset`, compared under `mask`.
    ///
    /// # Panics
    /// If `mask` and `bytes` differ in length.
    pub fn masked(mut self, offset: usize, bytes: &[u8], mask: &[u8]) -> Template {
        assert_eq!(
            bytes.len(),
            mask.len(),
            "template mask and bytes differ in length"
        );
        self.push(offset, bytes.len());
        self.values
            .extend(bytes.iter().zip(mask).map(|(b, m)| b & m));
        self.masks.extend_from_slice(mask);
        self
    }

    /// Adds a field whose bytes come next in `values` and `masks`.
    fn push(&mut self, offset: usize, len: usize) {
        self.fields.push(Field {
            offset,
            start: self.values.len(),
            len,
        });
        self.words = OnceLock::new();
    }

    /// Each field: its offset, values and masks.
    fn each(&self) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
        self.fields.iter().map(|f| {
            let r = f.start..f.start + f.len;
            (f.offset, &self.values[r.clone()], &self.masks[r])
        })
    }

    /// Whether `frame` matches every field.
    pub fn matches(&self, frame: &[u8]) -> bool {
        match self.words.get_or_init(|| Words::of(self)) {
            Words::Empty => true,
            Words::Unsatisfiable => false,
            Words::Fields => self.matches_before(frame, usize::MAX),
            Words::Merged { need, words } => {
                frame.len() >= *need
                    && words.iter().all(|&(o, n, m, v)| {
                        let w = match frame.get(o..o + 8) {
                            Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
                            None => {
                                let mut w = [0u8; 8];
                                w[..n].copy_from_slice(&frame[o..o + n]);
                                u64::from_le_bytes(w)
                            }
                        };
                        w & m == v
                    })
            }
        }
    }

    /// Whether `frame` matches every field in the bytes before `end` (the
    /// bytes from `end` on are not looked at): how a body fragment, which
    /// has no transport header, is checked.
    pub fn matches_before(&self, frame: &[u8], end: usize) -> bool {
        self.each().all(|(offset, bytes, masks)| {
            let Some(stop) = offset.checked_add(bytes.len()) else {
                return false;
            };
            let stop = stop.min(end.max(offset));
            let n = stop - offset;
            if n == 0 {
                return true;
            }
            match frame.get(offset..stop) {
                Some(got) => got
                    .iter()
                    .zip(&bytes[..n])
                    .zip(masks)
                    .all(|((g, b), m)| g & m == *b),
                None => false,
            }
        })
    }

    /// The bits of byte `offset` that every matching frame has fixed, and
    /// their values: `(mask, value)`. Two fields that pin the same bit to
    /// different values make the template unsatisfiable; that is harmless
    /// (nothing is sent) and shows here as the OR of both.
    pub fn pinned_byte(&self, offset: usize) -> (u8, u8) {
        let mut mask = 0u8;
        let mut value = 0u8;
        for (at, bytes, masks) in self.each() {
            if let Some(i) = offset.checked_sub(at).filter(|&i| i < bytes.len()) {
                mask |= masks[i];
                value |= bytes[i];
            }
        }
        (mask, value)
    }

    /// Whether every matching frame has `want` at `offset` in the bits of
    /// `need` (one mask byte per byte of `want`).
    pub fn implies(&self, offset: usize, want: &[u8], need: &[u8]) -> bool {
        want.iter().zip(need).enumerate().all(|(i, (&w, &n))| {
            let (mask, value) = self.pinned_byte(offset + i);
            mask & n == n && value & n == w & n
        })
    }

    /// The bytes every matching frame has at `offset..offset+len`, if all
    /// their bits are pinned.
    pub fn pinned(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        (offset..offset + len)
            .map(|o| match self.pinned_byte(o) {
                (0xff, v) => Some(v),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn field() -> impl Strategy<Value = (usize, Vec<u8>, Vec<u8>)> {
        (0usize..48, 1usize..12).prop_flat_map(|(offset, len)| {
            let bytes = proptest::collection::vec(any::<u8>(), len);
            // Masks of every kind: whole bytes, none, and single bits.
            let mask =
                proptest::collection::vec(prop_oneof![Just(0xffu8), Just(0u8), any::<u8>()], len);
            (Just(offset), bytes, mask)
        })
    }

    proptest! {
        /// The merged words decide as the fields do, one by one: for
        /// overlapping and conflicting fields, and frames too short.
        #[test]
        fn words_match_as_fields(
            fields in proptest::collection::vec(field(), 0..6),
            frame in proptest::collection::vec(any::<u8>(), 0..64),
            copy in any::<bool>(),
        ) {
            let mut t = Template::new();
            for (o, b, m) in &fields {
                t = t.masked(*o, b, m);
            }
            let mut frame = frame;
            if copy {
                // Mostly matching frames: write the fields in.
                for (o, b, m) in &fields {
                    for (i, (&b, &m)) in b.iter().zip(m).enumerate() {
                        if let Some(x) = frame.get_mut(o + i) {
                            *x = (*x & !m) | (b & m);
                        }
                    }
                }
            }
            prop_assert_eq!(t.matches(&frame), t.matches_before(&frame, usize::MAX));
        }
    }

    #[test]
    fn words_beyond_their_reach_and_conflicts() {
        let far = Template::new().field(WORDS_UP_TO, &[1]);
        let mut f = vec![0u8; WORDS_UP_TO + 1];
        assert!(!far.matches(&f));
        f[WORDS_UP_TO] = 1;
        assert!(far.matches(&f));
        let clash = Template::new().masked(3, &[0x10], &[0x10]).field(3, &[0]);
        assert!(!clash.matches(&[0; 8]));
        assert!(!clash.matches(&[0, 0, 0, 0x10, 0, 0, 0, 0]));
    }

    #[test]
    fn matches_and_implies() {
        let t = Template::new()
            .field(12, &[0x08, 0x00])
            .masked(14, &[0x45], &[0xff])
            .masked(20, &[0x00, 0x00], &[0x3f, 0xff]);
        let mut f = vec![0u8; 40];
        f[12] = 8;
        f[14] = 0x45;
        f[20] = 0x40; // DF is outside the mask
        assert!(t.matches(&f));
        f[21] = 1;
        assert!(!t.matches(&f));
        assert!(!t.matches(&f[..13]));
        assert!(t.implies(12, &[8, 0], &[0xff, 0xff]));
        assert!(t.implies(20, &[0, 0], &[0x1f, 0xff]));
        assert!(!t.implies(20, &[0, 0], &[0xff, 0xff]));
        assert_eq!(t.pinned(12, 3), Some(vec![8, 0, 0x45]));
        assert_eq!(t.pinned(11, 2), None);
        assert!(Template::new().matches(&[]));
        // Before byte 21, only the first field and the first byte of the
        // third count.
        f[21] = 1;
        assert!(t.matches_before(&f, 21));
        assert!(t.matches_before(&f[..21], 21));
        assert!(!t.matches_before(&f, 22));
        f[14] = 0x46;
        assert!(!t.matches_before(&f, 21));
        assert!(t.matches_before(&f, 14));
        // Fields past the end need no bytes.
        assert!(t.matches_before(&f[..13], 12));
    }
}
