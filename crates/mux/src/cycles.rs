//! The clock the multiplexer charges endpoints with: CPU cycles (the time
//! stamp counter) on x86-64, nanoseconds elsewhere. Reading it costs a few
//! cycles, where `clock_gettime` costs tens of nanoseconds in a VM, and the
//! accounting reads it several times per frame.

/// The current count.
#[inline]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC reads a counter; it has no preconditions and no
        // side effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}
