/*
 * exonet_endpoint.h -- the exonet endpoint (communication segment) layout,
 * version 1, for programs that drive an endpoint without Rust.
 *
 * This is the C twin of crates/shm/src/layout.rs (exonet-shm); a test
 * compiles a program against it and compares every size and offset below
 * with the Rust definitions.
 *
 * THE SEGMENT
 *
 * A memfd, sealed against shrinking and growing, mapped MAP_SHARED by the
 * multiplexer (which creates it) and by the application (which receives the
 * descriptor over the control socket with SCM_RIGHTS):
 *
 *   0                         struct exonet_segment_header (one 4096-byte page)
 *   rings[EXONET_RING_FREE]   free ring        each ring: struct exonet_ring_head
 *   rings[EXONET_RING_RX]     rx ring          (128 bytes), then `entries`
 *   rings[EXONET_RING_TX]     tx ring          struct exonet_desc, then on rx and
 *   rings[EXONET_RING_COMPLETION] completion   tx `entries` inline slots of
 *                                              EXONET_INLINE_MAX bytes
 *   frames_offset             frame_count buffers of frame_size bytes
 *   segment_size
 *
 * The layout is a function of (frame_size, frame_count, entries of each
 * ring): the header page, then each ring in the order free, rx, tx,
 * completion, each starting on a 4096-byte boundary and taking
 * 128 + entries * (16 + inline_size) bytes, then the frame area on the next
 * boundary of max(4096, frame_size) bytes, then the whole rounded up to
 * 4096 bytes.
 * frame_size is a power of two in [128, 65536], frame_count >= 1, entries a
 * power of two in [4, 2^20], segment_size <= 2^32.
 *
 * The side that opens a segment must not trust its header: check magic,
 * version, the ranges above, recompute the layout from the sizes and
 * require every offset and size in the header to equal it, require the
 * file's size (fstat) to equal segment_size and F_SEAL_SHRINK to be set
 * (F_GET_SEALS). Then keep the validated values privately and never read
 * the layout fields of the header again.
 *
 * THE RINGS
 *
 *   ring        producer       consumer       carries
 *   free        application    multiplexer    empty buffers (offset of 1st byte)
 *   rx          multiplexer    application    received frames
 *   tx          application    multiplexer    frames to send
 *   completion  multiplexer    application    buffers of sent frames
 *
 * Indices are free-running uint32_t; entry i is at i & (entries - 1).
 * Producer: fill entries [prod, prod + n), then store prod + n to
 * head->producer with RELEASE. Before reusing entries, load head->consumer
 * with ACQUIRE; prod - cons (mod 2^32) is the number of entries in use.
 * Consumer: load head->producer with ACQUIRE; prod - cons entries are
 * ready; copy them out, then store cons + n to head->consumer with RELEASE.
 * Each side keeps its own index in private memory (never reads it back
 * from the segment) and a cached copy of the other's, which it refreshes
 * only when the cache says full (producer) or empty (consumer).
 *
 * The other side is untrusted. A peer index such that prod - cons (mod
 * 2^32) exceeds `entries` is an error, never followed. Copy each
 * descriptor out of the ring once and validate the copy:
 *  - flags: only EXONET_DESC_INLINE, EXONET_DESC_REJECTED, EXONET_DESC_MORE,
 *    EXONET_DESC_CHAIN, EXONET_DESC_QUIET and EXONET_DESC_CSUM_OK;
 *    EXONET_DESC_MORE only on tx (EXONET_DESC_QUIET means something there
 *    only, on a frame's head; EXONET_DESC_CSUM_OK on rx only);
 *  - rx/tx, inline: len <= EXONET_INLINE_MAX, bytes in the entry's slot;
 *  - rx/tx, in a buffer: frames_offset <= offset, offset inside the frame
 *    area, (offset - frames_offset) % frame_size + len <= frame_size
 *    (the frame may start after some headroom but stays in one buffer);
 *  - free/completion: not inline, offset is the first byte of a buffer.
 * Copy frames out of the segment before checking them (the sender can
 * rewrite them at any time).
 *
 * MULTI-PART TX FRAMES
 *
 * A tx frame may be a chain of 1 to EXONET_MAX_PARTS descriptors, as
 * AF_XDP's XDP_PKT_CONTD: EXONET_DESC_MORE on every part but the last, all
 * on one channel; the frame is the parts' bytes in order, at most the
 * link's frame length in all. The first part is checked as any tx frame
 * (inline, or in one buffer); a later part is not inline and its len
 * bytes at offset lie anywhere in the frame area (across buffers). Publish
 * a chain with one producer store: the multiplexer takes it only once its
 * last part is published. A malformed chain is consumed whole and not
 * sent; one that has not ended after EXONET_MAX_PARTS entries is rejected
 * with the rest of it, up to its next entry without EXONET_DESC_MORE. A
 * chain gets one completion, after all its parts were copied: flagged
 * EXONET_DESC_CHAIN, naming the buffer of its first part that is not inline
 * (with an inline head, the buffer where the second part starts), len the
 * frame's total length.
 *
 * WAKE-UPS
 *
 * Each side owns a struct exonet_wake in the header and a doorbell: a
 * SOCK_DGRAM socketpair, one end (rx) waited on, the other (tx) rung
 * through (both doorbells are passed to both sides). Doorbells are not
 * eventfds because a peer holding an eventfd can make the other side's
 * write block (clear O_NONBLOCK, fill the counter); with sockets every call
 * is non-blocking by its flags (MSG_DONTWAIT), whatever the peer does. To
 * sleep:
 *     flags |= EXONET_WAKE_SLEEPING;  __atomic_thread_fence(SEQ_CST);
 *     if (my rings have work) { flags &= ~SLEEPING; return; }
 *     poll(my doorbell's rx end, timeout);
 *     drain it: recv(rx, buf, sizeof buf, MSG_DONTWAIT) until EAGAIN;
 *     flags &= ~SLEEPING;
 * After each batch that moved an index (entries published, or entries
 * released: the other side may wait for room or for buffers):
 *     __atomic_thread_fence(SEQ_CST);
 *     if ((its flags & (SLEEPING | UPCALLS_OFF)) == SLEEPING)
 *         send(its doorbell's tx end, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
 *     (EAGAIN means rings are already queued: the sleeper will wake.)
 * The multiplexer also signals the application when EXONET_WAKE_ALMOST_FULL
 * is set and rx has just reached `almost_full` outstanding entries. After a
 * transmit scan took an application's tx entries it skips the signal when
 * EXONET_WAKE_RX_ONLY is set: an application sets it before a sleep that
 * waits for received frames only (not for tx room or completions), and
 * clears it, fences and re-checks its rings before one that does not.
 * Switching upcalls back on: clear UPCALLS_OFF, fence, and if a thread of
 * yours sleeps and your rings have work, ring your own doorbell.
 *
 * An application may sleep in FUTEX_WAIT instead (one thread, on its own
 * word; a wake-up across CPUs costs less than a datagram's):
 *     flags |= SLEEPING | FUTEX;  __atomic_thread_fence(SEQ_CST);
 *     seen = __atomic_load_n(&rung, ACQUIRE);
 *     if (my rings have work) { flags &= ~(SLEEPING | FUTEX); return; }
 *     futex(&rung, FUTEX_WAIT, seen, timeout) (not private: shared memory);
 *     flags &= ~(SLEEPING | FUTEX);
 * and whoever would ring it, seeing FUTEX with SLEEPING, does instead
 *     __atomic_fetch_add(&rung, 1, RELEASE);  futex(&rung, FUTEX_WAKE, INT_MAX);
 * A futex does not see the other side go away: look for the control
 * socket's hang-up after each wait that timed out, and drain the doorbell
 * then too (an almost-full signal while awake goes there).
 */
#ifndef EXONET_ENDPOINT_H
#define EXONET_ENDPOINT_H

#include <stddef.h>
#include <stdint.h>

#define EXONET_SEGMENT_MAGIC 0x475354454e4f5845ULL /* "EXONETSG", little-endian */
#define EXONET_SEGMENT_VERSION 1u
#define EXONET_HEADER_SIZE 4096u
#define EXONET_RING_DESCS_OFFSET 128u
#define EXONET_INLINE_MAX 128u

/* Ring indices in exonet_segment_header.rings. */
#define EXONET_RING_FREE 0
#define EXONET_RING_RX 1
#define EXONET_RING_TX 2
#define EXONET_RING_COMPLETION 3

/* Descriptor flags. */
#define EXONET_DESC_INLINE 0x1u   /* frame bytes are in the ring's inline slot */
#define EXONET_DESC_REJECTED 0x2u /* completion: the frame was not sent */
#define EXONET_DESC_MORE 0x4u     /* tx: the frame continues in the next entry */
#define EXONET_DESC_CHAIN 0x8u    /* completion: of a chain (EXONET_DESC_MORE) */
#define EXONET_DESC_QUIET 0x10u   /* tx head: the channel's rx no longer wakes */
#define EXONET_DESC_CSUM_OK 0x20u /* rx: the TCP/UDP checksum is known good */

/* Most descriptors in one tx frame (a chain). */
#define EXONET_MAX_PARTS 4u

/* Wake-up flags. */
#define EXONET_WAKE_SLEEPING 0x1u    /* signal me after giving me work */
#define EXONET_WAKE_UPCALLS_OFF 0x2u /* never signal me */
#define EXONET_WAKE_ALMOST_FULL 0x4u /* signal me when rx reaches almost_full */
#define EXONET_WAKE_RX_ONLY 0x8u     /* my sleep waits for rx only: no signal for tx taken */
#define EXONET_WAKE_FUTEX 0x10u      /* I sleep in FUTEX_WAIT on rung: bump it and FUTEX_WAKE */

struct exonet_desc {
    uint32_t offset;  /* from the start of the segment */
    uint32_t len;     /* frame length */
    uint32_t channel; /* channel id */
    uint32_t flags;   /* EXONET_DESC_* */
};

struct exonet_ring_info {
    uint64_t offset;      /* of the ring's exonet_ring_head */
    uint32_t entries;     /* power of two */
    uint32_t inline_size; /* EXONET_INLINE_MAX on rx and tx, else 0 */
};

struct exonet_wake {
    uint32_t flags;       /* EXONET_WAKE_*, written by the owner */
    uint32_t almost_full; /* rx threshold in entries */
    uint32_t rung;        /* bumped before a FUTEX_WAKE, written by the waker */
} __attribute__((aligned(64)));

struct exonet_segment_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint64_t segment_size;
    uint64_t frames_offset;
    uint32_t frame_size;
    uint32_t frame_count;
    struct exonet_ring_info rings[4];
    struct exonet_wake app_wake; /* the application's: the multiplexer reads it */
    struct exonet_wake mux_wake; /* the multiplexer's: the application reads it */
};

struct exonet_index_line {
    uint32_t value;
} __attribute__((aligned(64)));

struct exonet_ring_head {
    struct exonet_index_line producer;
    struct exonet_index_line consumer;
    /* struct exonet_desc descs[entries] at EXONET_RING_DESCS_OFFSET */
};

/* One side's private view of a ring. */
struct exonet_ring {
    struct exonet_ring_head *head;
    struct exonet_desc *descs;
    uint8_t *inline_slots; /* NULL on free and completion */
    uint32_t mask;
    uint32_t local;  /* our index: producer's or consumer's */
    uint32_t cached; /* the other side's index, last read */
};

/* `info` must be the validated private copy. */
static inline void exonet_ring_init(struct exonet_ring *r, void *segment,
                                    const struct exonet_ring_info *info, int producer) {
    uint8_t *base = (uint8_t *)segment + info->offset;
    r->head = (struct exonet_ring_head *)base;
    r->descs = (struct exonet_desc *)(base + EXONET_RING_DESCS_OFFSET);
    r->inline_slots = info->inline_size
        ? base + EXONET_RING_DESCS_OFFSET + (size_t)info->entries * sizeof(struct exonet_desc)
        : NULL;
    r->mask = info->entries - 1;
    r->local = __atomic_load_n(producer ? &r->head->producer.value : &r->head->consumer.value,
                               __ATOMIC_RELAXED);
    r->cached = r->local;
}

static inline struct exonet_desc *exonet_ring_desc(struct exonet_ring *r, uint32_t index) {
    return &r->descs[index & r->mask];
}

static inline uint8_t *exonet_ring_inline(struct exonet_ring *r, uint32_t index) {
    return r->inline_slots + (size_t)(index & r->mask) * EXONET_INLINE_MAX;
}

/* Consumer: entries ready (up to n) from index r->local on; -1 if the
 * peer's producer index is out of range. */
static inline int64_t exonet_ring_peek(struct exonet_ring *r, uint32_t n) {
    uint32_t avail = r->cached - r->local;
    if (avail < n) {
        uint32_t prod = __atomic_load_n(&r->head->producer.value, __ATOMIC_ACQUIRE);
        avail = prod - r->local;
        if (avail > r->mask + 1)
            return -1;
        r->cached = prod;
    }
    return avail < n ? avail : n;
}

static inline void exonet_ring_release(struct exonet_ring *r, uint32_t n) {
    r->local += n;
    __atomic_store_n(&r->head->consumer.value, r->local, __ATOMIC_RELEASE);
}

/* Producer: free entries (up to n) from index r->local on; -1 if the
 * peer's consumer index is out of range. */
static inline int64_t exonet_ring_reserve(struct exonet_ring *r, uint32_t n) {
    uint32_t size = r->mask + 1;
    uint32_t free_entries = size - (r->local - r->cached);
    if (free_entries < n) {
        uint32_t cons = __atomic_load_n(&r->head->consumer.value, __ATOMIC_ACQUIRE);
        uint32_t used = r->local - cons;
        if (used > size)
            return -1;
        r->cached = cons;
        free_entries = size - used;
    }
    return free_entries < n ? free_entries : n;
}

static inline void exonet_ring_submit(struct exonet_ring *r, uint32_t n) {
    r->local += n;
    __atomic_store_n(&r->head->producer.value, r->local, __ATOMIC_RELEASE);
}

/* After publishing work for the side that owns `w`: must its doorbell be
 * rung? */
static inline int exonet_wake_wanted(struct exonet_wake *w) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t f = __atomic_load_n(&w->flags, __ATOMIC_RELAXED);
    return (f & (EXONET_WAKE_SLEEPING | EXONET_WAKE_UPCALLS_OFF)) == EXONET_WAKE_SLEEPING;
}

#endif /* EXONET_ENDPOINT_H */
