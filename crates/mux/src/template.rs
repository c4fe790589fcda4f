//! Transmit header templates (Thekkath et al. §III-C): what every frame sent
//! on a channel must look like.
//!
//! A template is a list of `(offset, bytes, mask)` fields; a frame matches
//! when, for every field, `frame[offset + i] & mask[i] == bytes[i] & mask[i]`
//! for all `i` (and the frame is long enough to hold the field). The check
//! runs on the multiplexer's private copy of the frame, never on shared
//! memory.

/// One field of a template: `bytes` at `offset`, compared under `mask`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateField {
    pub offset: usize,
    pub bytes: Vec<u8>,
    pub mask: Vec<u8>,
}

/// The conjunction of its fields. An empty template matches every frame (a
/// privileged channel may send anything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Template {
    fields: Vec<TemplateField>,
}

impl Template {
    pub fn new() -> Template {
        Template::default()
    }

    /// Builder: `bytes` at `offset`, every bit compared.
    pub fn field(self, offset: usize, bytes: &[u8]) -> Template {
        self.masked(offset, bytes, &vec![0xff; bytes.len()])
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
        self.fields.push(TemplateField {
            offset,
            bytes: bytes.iter().zip(mask).map(|(b, m)| b & m).collect(),
            mask: mask.to_vec(),
        });
        self
    }

    pub fn fields(&self) -> &[TemplateField] {
        &self.fields
    }

    /// Whether `frame` matches every field.
    pub fn matches(&self, frame: &[u8]) -> bool {
        self.matches_before(frame, usize::MAX)
    }

    /// Whether `frame` matches every field in the bytes before `end` (the
    /// bytes from `end` on are not looked at): how a body fragment, which
    /// has no transport header, is checked.
    pub fn matches_before(&self, frame: &[u8], end: usize) -> bool {
        self.fields.iter().all(|f| {
            let Some(stop) = f.offset.checked_add(f.bytes.len()) else {
                return false;
            };
            let stop = stop.min(end.max(f.offset));
            let n = stop - f.offset;
            if n == 0 {
                return true;
            }
            match frame.get(f.offset..stop) {
                Some(got) => got
                    .iter()
                    .zip(&f.bytes[..n])
                    .zip(&f.mask)
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
        for f in &self.fields {
            if let Some(i) = offset.checked_sub(f.offset).filter(|&i| i < f.bytes.len()) {
                mask |= f.mask[i];
                value |= f.bytes[i];
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
