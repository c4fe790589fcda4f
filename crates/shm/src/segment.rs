//! The communication segment: a sealed memfd mapped by both sides.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};

use crate::desc::{Desc, DescError};
use crate::event::{Doorbells, Notifier, Sleeper};
use crate::layout::{
    HeaderFields, Layout, RingHead, RingId, SegmentConfig, SegmentError, SegmentHeader, HEADER_SIZE,
};
use crate::ring::{Consumer, DescSlot, InlineSlot, Producer, RingPtrs};
use crate::wake::WakeWord;

/// One `mmap` of a segment's memfd. Invariant: `base` is the start of a
/// shared read-write mapping of `len` bytes that lives as long as this value.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// Taken (once) by `drop`.
    fd: ManuallyDrop<OwnedFd>,
    /// Multiplexer side ([`Populate::Elsewhere`]): unmapped, and its memfd
    /// closed, by the housekeeper thread.
    elsewhere: bool,
}

/// How a mapping's pages are faulted in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Populate {
    /// By `mmap` (`MAP_POPULATE`), before it returns: the application's
    /// side, in its own time.
    Now,
    /// As touched, or by a thread of low priority once the segment is
    /// accepted ([`Segment::populate_elsewhere`]); and the mapping is
    /// unmapped and its memfd closed by that thread too. The multiplexer's
    /// side: a segment of a few megabytes took its loop about a millisecond
    /// to fault in when it was mapped, and as long again to free when its
    /// application was gone (the last close frees the pages), and no frame
    /// moved meanwhile. Nor are the pages of a segment it may yet refuse
    /// faulted in (a sparse memfd of gigabytes).
    Elsewhere,
}

// SAFETY: the mapping is process-wide; the memory in it is only accessed
// through atomics or raw copies, never through references to plain data.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: OwnedFd, len: usize, populate: Populate) -> io::Result<Mapping> {
        let flags = match populate {
            // Pre-faulted, off the fast path.
            Populate::Now => libc::MAP_SHARED | libc::MAP_POPULATE,
            Populate::Elsewhere => libc::MAP_SHARED,
        };
        // SAFETY: a fresh shared mapping chosen by the kernel; it aliases no
        // Rust object.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping {
            base,
            len,
            fd: ManuallyDrop::new(fd),
            elsewhere: populate == Populate::Elsewhere,
        })
    }

    /// Has the housekeeper fault the pages in, holding the mapping meanwhile.
    /// Without it, or on a kernel without `MADV_POPULATE_WRITE` (before
    /// 5.14), they are faulted in as touched.
    fn populate_elsewhere(map: &Arc<Mapping>) {
        if let Some(h) = housekeeper() {
            let _ = h.send(Chore::Populate(Arc::clone(map)));
        }
    }

    /// A pointer to byte `offset` of the mapping, typed.
    ///
    /// # Safety
    /// `offset + size_of::<T>()` must not exceed `len`, and `offset` must be
    /// suitably aligned for `T` (the mapping is page-aligned).
    unsafe fn at<T>(&self, offset: u64) -> NonNull<T> {
        debug_assert!(offset as usize + std::mem::size_of::<T>() <= self.len);
        // SAFETY: in bounds by the caller's promise.
        unsafe { self.base.add(offset as usize).cast() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used after.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        let unmap = Unmap {
            base: self.base.as_ptr() as usize,
            len: self.len,
            _fd: fd,
        };
        if self.elsewhere {
            if let Some(h) = housekeeper() {
                // Dropped there; if the housekeeper is gone, dropped here.
                let _ = h.send(Chore::Unmap(unmap));
            }
        }
    }
}

/// A mapping nobody points into any more, and its memfd: dropping it
/// unmaps the one and closes the other.
struct Unmap {
    base: usize,
    len: usize,
    _fd: OwnedFd,
}

impl Drop for Unmap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping of the `Mapping` that made this
        // value, which is gone; everything that pointed into it held an
        // `Arc` to that `Mapping`, so nothing is left.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

/// What the housekeeper does for [`Populate::Elsewhere`] mappings.
enum Chore {
    /// Faults the mapping's pages in.
    Populate(Arc<Mapping>),
    /// Unmaps a mapping and closes its memfd.
    Unmap(Unmap),
}

/// The one thread, of low priority, that does the [`Chore`]s, in order,
/// started at the first; `None` if it could not be.
fn housekeeper() -> Option<&'static Sender<Chore>> {
    static HOUSEKEEPER: OnceLock<Option<Sender<Chore>>> = OnceLock::new();
    HOUSEKEEPER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Chore>();
            std::thread::Builder::new()
                .name("exonet-housekeeper".into())
                .spawn(move || {
                    lowest_priority();
                    for chore in rx {
                        match chore {
                            // SAFETY: advice over exactly the mapping `map`
                            // owns, kept alive by it for the call; it writes
                            // no data (the pages are shared memory, zero or
                            // as the other side left them).
                            Chore::Populate(map) => unsafe {
                                libc::madvise(
                                    map.base.as_ptr().cast(),
                                    map.len,
                                    libc::MADV_POPULATE_WRITE,
                                );
                            },
                            Chore::Unmap(unmap) => drop(unmap),
                        }
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Gives the calling thread the lowest priority of its class (nice 19):
/// work that must get done, but after the frames' way.
fn lowest_priority() {
    // SAFETY: plain system calls on the calling thread (its tid as the
    // PRIO_PROCESS id, as Linux takes it), no pointers.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// A communication segment, mapped: the header page, the four rings and
/// the frame buffers (see [`Layout`]).
///
/// The multiplexer [`create`](Self::create)s it and passes [`fd`](Self::fd)
/// to the application, which [`open`](Self::open)s it; then each turns its
/// mapping into its side's endpoint ([`into_app`](Self::into_app),
/// [`into_mux`](Self::into_mux)). In-process use, without a multiplexer
/// process, takes both sides of one mapping with [`split`](Self::split).
pub struct Segment {
    map: Arc<Mapping>,
    layout: Layout,
}

/// Whose wake-up word.
enum Side {
    App,
    Mux,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Segment {
    /// Creates a segment (owner side): a memfd of the layout's size, sealed
    /// so that its size can never change (the peer relies on that: a shrunk
    /// file would fault its accesses), mapped, with the header written.
    pub fn create(config: &SegmentConfig) -> Result<Segment, SegmentError> {
        let layout = Layout::new(config)?;
        // SAFETY: the name is a NUL-terminated literal; a non-negative
        // result is a new descriptor that we own.
        let fd = cvt(unsafe {
            libc::memfd_create(
                c"exonet-segment".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        })?;
        // SAFETY: `fd` is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on our own descriptor.
        unsafe {
            cvt(libc::ftruncate(
                fd.as_raw_fd(),
                layout.segment_size() as libc::off_t,
            ))?;
            cvt(libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ))?;
        }
        let map = Mapping::new(fd, layout.segment_size() as usize, Populate::Now)?;
        let h = layout.header_fields();
        // SAFETY: the header fits in the first page of the fresh mapping,
        // which is zero (so rings and wake words start out empty). Nobody
        // else has the fd yet, so plain writes race with nothing.
        unsafe {
            let hdr = map.at::<SegmentHeader>(0).as_ptr();
            ptr::addr_of_mut!((*hdr).magic).write(h.magic);
            ptr::addr_of_mut!((*hdr).version).write(h.version);
            ptr::addr_of_mut!((*hdr).header_size).write(h.header_size);
            ptr::addr_of_mut!((*hdr).segment_size).write(h.segment_size);
            ptr::addr_of_mut!((*hdr).frames_offset).write(h.frames_offset);
            ptr::addr_of_mut!((*hdr).frame_size).write(h.frame_size);
            ptr::addr_of_mut!((*hdr).frame_count).write(h.frame_count);
            ptr::addr_of_mut!((*hdr).rings).write(h.rings);
        }
        Ok(Segment {
            map: Arc::new(map),
            layout,
        })
    }

    /// Maps a segment received from the other side (peer side), trusting
    /// nothing in it: the file must be sealed against shrinking, its size
    /// must be the header's, and the header must describe exactly the
    /// layout its sizes imply. Any other header is an error. Its pages are
    /// faulted in as touched, or by [`Segment::populate_elsewhere`] once it
    /// is accepted; it is unmapped by a thread of low priority.
    pub fn open(fd: OwnedFd) -> Result<Segment, SegmentError> {
        // SAFETY: F_GET_SEALS on a descriptor we own; no pointers.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(SegmentError::NotSealed);
        }
        // SAFETY: fstat writes into a zeroed local struct.
        let st = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            cvt(libc::fstat(fd.as_raw_fd(), &mut st))?;
            st
        };
        let file_size = st.st_size as u64;
        // Anything larger is refused by the layout check anyway; do not
        // map it first.
        if file_size < HEADER_SIZE as u64 || file_size > 1 << 32 {
            return Err(SegmentError::Size {
                file: file_size,
                header: 0,
            });
        }
        let map = Mapping::new(fd, file_size as usize, Populate::Elsewhere)?;
        // SAFETY: the header lies in the first page, inside the mapping.
        // Volatile reads, each field once, because the peer may be writing
        // them; the copy is what gets validated and used.
        let h = unsafe {
            let hdr = map.at::<SegmentHeader>(0).as_ptr();
            HeaderFields {
                magic: ptr::addr_of!((*hdr).magic).read_volatile(),
                version: ptr::addr_of!((*hdr).version).read_volatile(),
                header_size: ptr::addr_of!((*hdr).header_size).read_volatile(),
                segment_size: ptr::addr_of!((*hdr).segment_size).read_volatile(),
                frames_offset: ptr::addr_of!((*hdr).frames_offset).read_volatile(),
                frame_size: ptr::addr_of!((*hdr).frame_size).read_volatile(),
                frame_count: ptr::addr_of!((*hdr).frame_count).read_volatile(),
                rings: ptr::addr_of!((*hdr).rings).read_volatile(),
            }
        };
        let layout = Layout::from_header(&h, file_size)?;
        Ok(Segment {
            map: Arc::new(map),
            layout,
        })
    }

    /// The memfd, to pass to the other side (SCM_RIGHTS).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd.as_fd()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Faults the segment's pages in on a thread of low priority, so that
    /// the caller's loop neither waits for them now nor meets them one by
    /// one on its fast path later.
    pub fn populate_elsewhere(&self) {
        Mapping::populate_elsewhere(&self.map);
    }

    /// The application's side: produces free and tx, consumes rx and
    /// completion, sleeps on `events.app`, kicks `events.mux`.
    pub fn into_app(self, events: Doorbells) -> AppEndpoint {
        // SAFETY: the wake words live in the header as long as the mapping
        // each handle keeps.
        let (wake, kick) = unsafe {
            (
                Sleeper::new(self.wake_word(Side::App), self.map.clone(), events.app),
                Notifier::new(self.wake_word(Side::Mux), self.map.clone(), events.mux),
            )
        };
        AppEndpoint {
            free: self.producer(RingId::Free),
            rx: self.consumer(RingId::Rx),
            tx: self.producer(RingId::Tx),
            completion: self.consumer(RingId::Completion),
            frames: self.frames(),
            wake,
            kick,
        }
    }

    /// The multiplexer's side: consumes free and tx, produces rx and
    /// completion, sleeps on `events.mux`, signals `events.app`.
    pub fn into_mux(self, events: Doorbells) -> MuxEndpoint {
        // SAFETY: as in `into_app`.
        let (wake, upcall) = unsafe {
            (
                Sleeper::new(self.wake_word(Side::Mux), self.map.clone(), events.mux),
                Notifier::new(self.wake_word(Side::App), self.map.clone(), events.app),
            )
        };
        MuxEndpoint {
            free: self.consumer(RingId::Free),
            rx: self.producer(RingId::Rx),
            tx: self.consumer(RingId::Tx),
            completion: self.producer(RingId::Completion),
            frames: self.frames(),
            wake,
            upcall,
        }
    }

    /// Both sides of one mapping, with a fresh pair of doorbells: an
    /// endpoint served in-process.
    pub fn split(self) -> io::Result<(AppEndpoint, MuxEndpoint)> {
        let events = Doorbells::new()?;
        let mux_events = events.try_clone()?;
        let other = Segment {
            map: self.map.clone(),
            layout: self.layout,
        };
        Ok((self.into_app(events), other.into_mux(mux_events)))
    }

    fn wake_word(&self, side: Side) -> NonNull<WakeWord> {
        let offset = match side {
            Side::App => std::mem::offset_of!(SegmentHeader, app_wake),
            Side::Mux => std::mem::offset_of!(SegmentHeader, mux_wake),
        };
        // SAFETY: a field of the header, in the first page of the mapping.
        unsafe { self.map.at(offset as u64) }
    }

    fn ring_ptrs(&self, id: RingId) -> RingPtrs {
        let info = self.layout.ring(id);
        // SAFETY: `Layout` places the ring's head, descriptors and inline
        // slots inside the segment, 64-byte aligned, and the mapping has the
        // layout's size.
        unsafe {
            let head = self.map.at::<RingHead>(info.offset).as_ptr();
            RingPtrs {
                producer: NonNull::from(&(*head).producer.value),
                consumer: NonNull::from(&(*head).consumer.value),
                descs: self
                    .map
                    .at::<DescSlot>(info.offset + crate::layout::RING_DESCS_OFFSET),
                inline: (info.inline_size > 0)
                    .then(|| self.map.at::<InlineSlot>(info.inline_offset())),
                mask: info.entries - 1,
            }
        }
    }

    fn producer(&self, id: RingId) -> Producer {
        // SAFETY: `ring_ptrs` points into the mapping that the `Arc` keeps.
        unsafe { Producer::new(self.ring_ptrs(id), self.map.clone()) }
    }

    fn consumer(&self, id: RingId) -> Consumer {
        // SAFETY: as in `producer`.
        unsafe { Consumer::new(self.ring_ptrs(id), self.map.clone()) }
    }

    fn frames(&self) -> Frames {
        Frames {
            map: self.map.clone(),
            layout: self.layout,
        }
    }
}

/// The frame buffers of a segment, with the layout to check offsets
/// against. Copies in and out are bounds-checked; the bytes themselves are
/// whatever the other side left there.
#[derive(Clone)]
pub struct Frames {
    map: Arc<Mapping>,
    layout: Layout,
}

impl Frames {
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// A pointer to `len` bytes at `offset`, which must lie in one frame
    /// buffer: for building or reading a frame in place. Using it is up to
    /// the caller: the other side can write the same bytes at any time.
    pub fn frame_ptr(&self, offset: u32, len: u32) -> Result<NonNull<u8>, DescError> {
        self.layout.check_range(offset, len)?;
        // SAFETY: `check_range` put the bytes inside the frame area, which
        // is inside the mapping.
        Ok(unsafe { self.map.at::<u8>(offset as u64) })
    }

    /// A pointer to `len` bytes at `offset` anywhere in the frame area (see
    /// [`Layout::check_area`]): a handler's window. As with
    /// [`frame_ptr`](Self::frame_ptr), the other side can write the same
    /// bytes at any time.
    pub fn area_ptr(&self, offset: u32, len: u32) -> Result<NonNull<u8>, DescError> {
        self.layout.check_area(offset, len)?;
        // SAFETY: `check_area` put the bytes inside the frame area, which
        // is inside the mapping.
        Ok(unsafe { self.map.at::<u8>(offset as u64) })
    }

    /// Copies `out.len()` bytes at `offset` of the frame area (see
    /// [`area_ptr`](Self::area_ptr)) out.
    pub fn read_area(&self, offset: u32, out: &mut [u8]) -> Result<(), DescError> {
        let src = self.area_ptr(offset, area_len(offset, out.len())?)?;
        // SAFETY: `area_ptr` checked the range; `out` is private memory. A
        // raw copy forms no reference to shared memory.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `offset` of the frame area.
    pub fn write_area(&self, offset: u32, data: &[u8]) -> Result<(), DescError> {
        let dst = self.area_ptr(offset, area_len(offset, data.len())?)?;
        // SAFETY: as in `read_area`, the other way round.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.as_ptr(), data.len()) };
        Ok(())
    }

    /// The little-endian `u64` at `offset` of the frame area; read whole
    /// (never torn by a concurrent store) when aligned.
    pub fn load_u64(&self, offset: u32) -> Result<u64, DescError> {
        let p = self.area_ptr(offset, 8)?.as_ptr().cast::<u64>();
        // SAFETY: `area_ptr` checked the 8 bytes. An aligned volatile load
        // is one instruction.
        let v = unsafe {
            if p.is_aligned() {
                ptr::read_volatile(p)
            } else {
                ptr::read_unaligned(p)
            }
        };
        Ok(u64::from_le(v))
    }

    /// Stores a little-endian `u64` at `offset` of the frame area, whole
    /// when aligned.
    pub fn store_u64(&self, offset: u32, v: u64) -> Result<(), DescError> {
        let p = self.area_ptr(offset, 8)?.as_ptr().cast::<u64>();
        // SAFETY: as in `load_u64`.
        unsafe {
            if p.is_aligned() {
                ptr::write_volatile(p, v.to_le())
            } else {
                ptr::write_unaligned(p, v.to_le())
            }
        }
        Ok(())
    }

    /// Copies `data` to `offset`; all of it must land in one frame buffer.
    pub fn write(&self, offset: u32, data: &[u8]) -> Result<(), DescError> {
        let len = u32::try_from(data.len()).map_err(|_| DescError::TooLong {
            offset,
            len: u32::MAX,
        })?;
        let dst = self.frame_ptr(offset, len)?;
        // SAFETY: `frame_ptr` checked the destination range; it cannot
        // overlap `data`, which is private memory. A raw copy creates no
        // reference to shared memory.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.as_ptr(), data.len()) };
        Ok(())
    }

    /// Validates a frame descriptor (it must not be inline: inline bytes are
    /// read from the ring) and copies its bytes, at most `out.len()` of them,
    /// into `out`; returns how many it copied. Copying out first is what the
    /// multiplexer does before checking a frame, so that the application
    /// cannot change it after the check.
    pub fn read(&self, desc: Desc, out: &mut [u8]) -> Result<usize, DescError> {
        self.layout.validate_frame(desc)?;
        if desc.is_inline() {
            return Err(DescError::Inline);
        }
        let n = (desc.len as usize).min(out.len());
        let src = self.frame_ptr(desc.offset, n as u32)?;
        // SAFETY: as in `write`, the other way round; torn bytes from a
        // peer writing concurrently are just untrusted data.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr(), n) };
        Ok(n)
    }
}

/// A length that fits a descriptor's.
fn area_len(offset: u32, n: usize) -> Result<u32, DescError> {
    u32::try_from(n).map_err(|_| DescError::TooLong {
        offset,
        len: u32::MAX,
    })
}

/// The application's side of an endpoint.
pub struct AppEndpoint {
    /// Empty buffers for the multiplexer to receive into.
    pub free: Producer,
    /// Received frames.
    pub rx: Consumer,
    /// Frames to send.
    pub tx: Producer,
    /// Buffers of sent frames, given back.
    pub completion: Consumer,
    pub frames: Frames,
    /// Sleep until rx or completion has work; upcall control.
    pub wake: Sleeper,
    /// Wake the multiplexer (only if it sleeps), after each batch that
    /// moved an index: tx or free pushed, rx or completion released.
    pub kick: Notifier,
}

/// The multiplexer's side of an endpoint.
pub struct MuxEndpoint {
    /// Buffers the application gave for receiving (untrusted offsets).
    pub free: Consumer,
    /// Received frames, for the application.
    pub rx: Producer,
    /// Frames the application wants sent (untrusted descriptors).
    pub tx: Consumer,
    /// Sent buffers, back to the application.
    pub completion: Producer,
    pub frames: Frames,
    /// Sleep until tx or free has work.
    pub wake: Sleeper,
    /// Wake the application, after each batch that moved an index: rx
    /// pushed ([`Notifier::notify_rx`], which also checks "almost full"),
    /// completion pushed or tx released ([`Notifier::notify_if_sleeping`]).
    pub upcall: Notifier,
}

/// A sealed memfd holding `bytes`: how an application hands the
/// multiplexer something too large for a control message (a handler's
/// module). Sealed against writes, so what the multiplexer reads is what
/// was sent.
pub fn blob_memfd(bytes: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal; a non-negative result
    // is a new descriptor that we own.
    let fd = cvt(unsafe {
        libc::memfd_create(
            c"exonet-blob".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    })?;
    // SAFETY: `fd` is fresh and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: writes from a live slice's remaining bytes.
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    // SAFETY: a plain syscall on our own descriptor.
    cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    })?;
    Ok(fd)
}

/// Reads the `len` bytes of a blob from an untrusted peer: the descriptor
/// must be a memfd (anything else could block the reader: a pipe, a
/// socket, a file on a hung file system) of at least `len` bytes.
pub fn read_blob(fd: &OwnedFd, len: usize) -> io::Result<Vec<u8>> {
    // SAFETY: F_GET_SEALS on a descriptor we own; it fails on anything
    // but a memfd (or shmem file), which is the check.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) } < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the descriptor is not a memfd",
        ));
    }
    let mut out = vec![0u8; len];
    let mut done = 0;
    while done < len {
        // SAFETY: reads into the remaining bytes of our own buffer.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                out[done..].as_mut_ptr().cast(),
                len - done,
                done as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the memfd holds {done} bytes, not {len}"),
            ));
        }
        done += n as usize;
    }
    Ok(out)
}
