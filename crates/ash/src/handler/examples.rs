//! Example handlers, as WebAssembly text (`handlers/*.wat`; each has a C twin
//! `handlers/*.c` with the same behaviour, built against `exonet_ash.h`).
//! Install one with `Handler::install(&engine, EMPTY_WAT.as_bytes(), ...)`.

/// Delivers every frame at once: the runtime's per-invocation overhead.
pub const EMPTY_WAT: &str = include_str!("../../handlers/empty.wat");

/// Consumes every frame at once.
pub const EMPTY_CONSUME_WAT: &str = include_str!("../../handlers/empty_consume.wat");

/// Remote write (Figure 3) over UDP: payload = u32 window offset, u32 length,
/// data; the data goes straight into the window, the frame is consumed.
pub const REMOTE_WRITE_WAT: &str = include_str!("../../handlers/remote_write.wat");

/// Remote increment (Table 6) over UDP: payload = u32 window offset of a u64
/// counter; increments it and replies with the new value (8 bytes LE).
pub const REMOTE_INCREMENT_WAT: &str = include_str!("../../handlers/remote_increment.wat");

/// UDP echo: replies with the same payload.
pub const UDP_ECHO_WAT: &str = include_str!("../../handlers/udp_echo.wat");

/// Cache server: answers a key from the cache in the window ([`CacheLayout`]),
/// aborts on a miss so the application answers.
pub const CACHE_SERVER_WAT: &str = include_str!("../../handlers/cache_server.wat");

/// The cache server's window layout (also in `exonet_ash.h`). Little-endian
/// u32 fields: a header `count, key_size, value_size, 0`, then `count`
/// entries of `key_len (0: empty), value_len, key[key_size],
/// value[value_size]`. A request hits the entry whose key equals its whole
/// UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLayout {
    count: u32,
    key_size: u32,
    value_size: u32,
}

impl CacheLayout {
    /// Bytes before the first entry.
    pub const HEADER_LEN: usize = 16;
    /// Largest key size the cache server accepts.
    pub const MAX_KEY: u32 = 1024;
    /// Largest value size the cache server accepts.
    pub const MAX_VALUE: u32 = 32768;

    /// A layout of `count` entries, or `None` if a size is over the cache
    /// server's limits or the layout would not fit in a window the handler
    /// can address.
    pub fn new(count: u32, key_size: u32, value_size: u32) -> Option<CacheLayout> {
        let entry = 8 + u64::from(key_size) + u64::from(value_size);
        let total = Self::HEADER_LEN as u64 + u64::from(count) * entry;
        // The handler computes offsets in 32-bit arithmetic.
        let fits = total <= i32::MAX as u64;
        (key_size <= Self::MAX_KEY && value_size <= Self::MAX_VALUE && fits).then_some(
            CacheLayout {
                count,
                key_size,
                value_size,
            },
        )
    }

    /// Bytes of one entry.
    pub fn entry_len(&self) -> usize {
        8 + self.key_size as usize + self.value_size as usize
    }

    /// Bytes the whole cache needs.
    pub fn window_len(&self) -> usize {
        Self::HEADER_LEN + self.count as usize * self.entry_len()
    }

    /// Writes the header and empties every entry; false if `window` is too
    /// short.
    pub fn format(&self, window: &mut [u8]) -> bool {
        let Some(cache) = window.get_mut(..self.window_len()) else {
            return false;
        };
        cache.fill(0);
        put(cache, 0, self.count);
        put(cache, 4, self.key_size);
        put(cache, 8, self.value_size);
        true
    }

    /// Stores `key -> value` in entry `slot` of a formatted window; false if
    /// the slot, key (empty or too long) or value does not fit.
    pub fn insert(&self, window: &mut [u8], slot: u32, key: &[u8], value: &[u8]) -> bool {
        let (Ok(key_len), Ok(value_len)) = (u32::try_from(key.len()), u32::try_from(value.len()))
        else {
            return false;
        };
        if key.is_empty() || key_len > self.key_size || value_len > self.value_size {
            return false;
        }
        let Some(e) = self.entry(window, slot) else {
            return false;
        };
        // key_len last: a handler reading concurrently never matches a
        // half-written entry.
        put(e, 0, 0);
        put(e, 4, value_len);
        e[8..8 + key.len()].copy_from_slice(key);
        let v = 8 + self.key_size as usize;
        e[v..v + value.len()].copy_from_slice(value);
        put(e, 0, key_len);
        true
    }

    /// Empties entry `slot`; false if there is no such slot.
    pub fn remove(&self, window: &mut [u8], slot: u32) -> bool {
        self.entry(window, slot).map(|e| put(e, 0, 0)).is_some()
    }

    fn entry<'w>(&self, window: &'w mut [u8], slot: u32) -> Option<&'w mut [u8]> {
        if slot >= self.count {
            return None;
        }
        let start = Self::HEADER_LEN + slot as usize * self.entry_len();
        window.get_mut(start..start + self.entry_len())
    }
}

fn put(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert!(CacheLayout::new(1, CacheLayout::MAX_KEY + 1, 8).is_none());
        assert!(CacheLayout::new(u32::MAX, 1024, 32768).is_none());
        let c = CacheLayout::new(2, 8, 4).expect("valid");
        assert_eq!((c.entry_len(), c.window_len()), (20, 56));
        let mut w = vec![0xaa; 56];
        assert!(!c.format(&mut w[..55]));
        assert!(c.format(&mut w));
        assert_eq!(w[..16], [2, 0, 0, 0, 8, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
        assert!(c.insert(&mut w, 1, b"key", b"val"));
        assert_eq!(w[36..56], *b"\x03\0\0\0\x03\0\0\0key\0\0\0\0\0val\0");
        assert!(!c.insert(&mut w, 2, b"k", b"v"), "no slot 2");
        assert!(!c.insert(&mut w, 0, b"", b"v"), "empty key");
        assert!(!c.insert(&mut w, 0, b"123456789", b"v"), "key too long");
        assert!(!c.insert(&mut w, 0, b"k", b"12345"), "value too long");
        assert!(c.remove(&mut w, 1) && !c.remove(&mut w, 2));
        assert_eq!(w[36..40], [0; 4]);
    }
}
