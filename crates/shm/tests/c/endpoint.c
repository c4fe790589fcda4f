/* Drives exonet_endpoint.h from C, for tests/c_header.rs.
 *   endpoint layout          print sizes, offsets and constants
 *   endpoint echo FD KICK COUNT
 *                            be the application of the segment on FD: give
 *                            all buffers to the free ring, send COUNT
 *                            received frames back on tx, recycle completions,
 *                            and ring the doorbell end KICK when the
 *                            multiplexer's wake-up word asks for it */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exonet_endpoint.h"

#define P(name, value) printf("%s %llu\n", name, (unsigned long long)(value))

static int layout(void) {
    P("sizeof_desc", sizeof(struct exonet_desc));
    P("desc.offset", offsetof(struct exonet_desc, offset));
    P("desc.len", offsetof(struct exonet_desc, len));
    P("desc.channel", offsetof(struct exonet_desc, channel));
    P("desc.flags", offsetof(struct exonet_desc, flags));
    P("sizeof_ring_info", sizeof(struct exonet_ring_info));
    P("ring_info.offset", offsetof(struct exonet_ring_info, offset));
    P("ring_info.entries", offsetof(struct exonet_ring_info, entries));
    P("ring_info.inline_size", offsetof(struct exonet_ring_info, inline_size));
    P("sizeof_wake", sizeof(struct exonet_wake));
    P("alignof_wake", _Alignof(struct exonet_wake));
    P("wake.flags", offsetof(struct exonet_wake, flags));
    P("wake.almost_full", offsetof(struct exonet_wake, almost_full));
    P("wake.rung", offsetof(struct exonet_wake, rung));
    P("sizeof_header", sizeof(struct exonet_segment_header));
    P("header.magic", offsetof(struct exonet_segment_header, magic));
    P("header.version", offsetof(struct exonet_segment_header, version));
    P("header.header_size", offsetof(struct exonet_segment_header, header_size));
    P("header.segment_size", offsetof(struct exonet_segment_header, segment_size));
    P("header.frames_offset", offsetof(struct exonet_segment_header, frames_offset));
    P("header.frame_size", offsetof(struct exonet_segment_header, frame_size));
    P("header.frame_count", offsetof(struct exonet_segment_header, frame_count));
    P("header.rings", offsetof(struct exonet_segment_header, rings));
    P("header.app_wake", offsetof(struct exonet_segment_header, app_wake));
    P("header.mux_wake", offsetof(struct exonet_segment_header, mux_wake));
    P("sizeof_ring_head", sizeof(struct exonet_ring_head));
    P("ring_head.producer", offsetof(struct exonet_ring_head, producer));
    P("ring_head.consumer", offsetof(struct exonet_ring_head, consumer));
    P("SEGMENT_MAGIC", EXONET_SEGMENT_MAGIC);
    P("SEGMENT_VERSION", EXONET_SEGMENT_VERSION);
    P("HEADER_SIZE", EXONET_HEADER_SIZE);
    P("RING_DESCS_OFFSET", EXONET_RING_DESCS_OFFSET);
    P("INLINE_MAX", EXONET_INLINE_MAX);
    P("RING_FREE", EXONET_RING_FREE);
    P("RING_RX", EXONET_RING_RX);
    P("RING_TX", EXONET_RING_TX);
    P("RING_COMPLETION", EXONET_RING_COMPLETION);
    P("DESC_INLINE", EXONET_DESC_INLINE);
    P("DESC_REJECTED", EXONET_DESC_REJECTED);
    P("DESC_MORE", EXONET_DESC_MORE);
    P("DESC_CHAIN", EXONET_DESC_CHAIN);
    P("DESC_QUIET", EXONET_DESC_QUIET);
    P("DESC_CSUM_OK", EXONET_DESC_CSUM_OK);
    P("MAX_PARTS", EXONET_MAX_PARTS);
    P("WAKE_SLEEPING", EXONET_WAKE_SLEEPING);
    P("WAKE_UPCALLS_OFF", EXONET_WAKE_UPCALLS_OFF);
    P("WAKE_ALMOST_FULL", EXONET_WAKE_ALMOST_FULL);
    P("WAKE_RX_ONLY", EXONET_WAKE_RX_ONLY);
    P("WAKE_FUTEX", EXONET_WAKE_FUTEX);
    return 0;
}

static int fail(const char *why) {
    fprintf(stderr, "endpoint echo: %s\n", why);
    return 1;
}

/* After a batch that moved an index: wake the multiplexer if it sleeps. */
static int kick_if_sleeping(uint8_t *seg, int kick) {
    if (exonet_wake_wanted(&((struct exonet_segment_header *)seg)->mux_wake) &&
        send(kick, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1 && errno != EAGAIN)
        return fail("kick");
    return 0;
}

static int echo(int fd, int kick, long count) {
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < EXONET_HEADER_SIZE)
        return fail("fstat");
    uint8_t *seg = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (seg == MAP_FAILED)
        return fail("mmap");
    /* The checks a real application does on its private copy (abridged:
     * the multiplexer is the trusted side here). */
    struct exonet_segment_header h;
    memcpy(&h, seg, sizeof h);
    if (h.magic != EXONET_SEGMENT_MAGIC || h.version != EXONET_SEGMENT_VERSION ||
        h.segment_size != (uint64_t)st.st_size)
        return fail("bad header");
    for (int i = 0; i < 4; i++)
        if (h.rings[i].offset + EXONET_RING_DESCS_OFFSET > h.segment_size)
            return fail("bad ring");

    struct exonet_ring free_ring, rx, tx, completion;
    exonet_ring_init(&free_ring, seg, &h.rings[EXONET_RING_FREE], 1);
    exonet_ring_init(&rx, seg, &h.rings[EXONET_RING_RX], 0);
    exonet_ring_init(&tx, seg, &h.rings[EXONET_RING_TX], 1);
    exonet_ring_init(&completion, seg, &h.rings[EXONET_RING_COMPLETION], 0);

    uint32_t n = h.frame_count < h.rings[EXONET_RING_FREE].entries ? h.frame_count
                                                                   : h.rings[EXONET_RING_FREE].entries;
    if (exonet_ring_reserve(&free_ring, n) != n)
        return fail("free ring");
    for (uint32_t i = 0; i < n; i++) {
        struct exonet_desc d = {(uint32_t)h.frames_offset + i * h.frame_size, 0, 0, 0};
        *exonet_ring_desc(&free_ring, free_ring.local + i) = d;
    }
    exonet_ring_submit(&free_ring, n);
    if (kick_if_sleeping(seg, kick))
        return 1;

    for (long done = 0; done < count;) {
        int64_t k = exonet_ring_peek(&rx, 32);
        if (k < 0)
            return fail("rx index");
        int64_t room = exonet_ring_reserve(&tx, (uint32_t)k);
        if (room < 0)
            return fail("tx index");
        for (int64_t i = 0; i < room; i++) {
            struct exonet_desc d = *exonet_ring_desc(&rx, rx.local + i);
            if (d.flags & ~(EXONET_DESC_INLINE | EXONET_DESC_REJECTED))
                return fail("rx flags");
            if (d.flags & EXONET_DESC_INLINE) {
                if (d.len > EXONET_INLINE_MAX)
                    return fail("rx inline length");
                memcpy(exonet_ring_inline(&tx, tx.local + i), exonet_ring_inline(&rx, rx.local + i), d.len);
            }
            *exonet_ring_desc(&tx, tx.local + i) = d;
        }
        exonet_ring_submit(&tx, (uint32_t)room);
        exonet_ring_release(&rx, (uint32_t)room);
        done += room;

        int64_t c = exonet_ring_peek(&completion, 32);
        if (c < 0)
            return fail("completion index");
        int64_t give = exonet_ring_reserve(&free_ring, (uint32_t)c);
        if (give < 0)
            return fail("free index");
        for (int64_t i = 0; i < give; i++) {
            struct exonet_desc d = *exonet_ring_desc(&completion, completion.local + i);
            d.len = 0;
            *exonet_ring_desc(&free_ring, free_ring.local + i) = d;
        }
        exonet_ring_submit(&free_ring, (uint32_t)give);
        exonet_ring_release(&completion, (uint32_t)give);
        if (room == 0 && give == 0) {
            sched_yield();
            continue;
        }
        if (kick_if_sleeping(seg, kick))
            return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "layout") == 0)
        return layout();
    if (argc == 5 && strcmp(argv[1], "echo") == 0)
        return echo(atoi(argv[2]), atoi(argv[3]), atol(argv[4]));
    fprintf(stderr, "usage: endpoint layout | endpoint echo FD KICK COUNT\n");
    return 2;
}
