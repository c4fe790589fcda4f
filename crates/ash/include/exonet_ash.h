/*
 * exonet_ash.h: the ABI of exonet's application-specific safe handlers (ASH).
 *
 * A handler is a WebAssembly module the multiplexer runs on every frame its
 * channel's filter accepts, before delivery (Wallach, Engler, Kaashoek,
 * "ASHs: Application-Specific Handlers for High-Performance Messaging", §2-3).
 * It sees the frame only through the imports below, keeps private state in
 * its own memory and globals across invocations, and may write the window:
 * the part of the application's segment the application granted it
 * ("message vectoring"). Fuel bounds each invocation.
 *
 * Installed with UDP below it (HandlerSpec::below = Udp), the handler's
 * message is the UDP payload, not the frame: the multiplexer checks the
 * Ethernet, IPv4 and UDP headers, runs the UDP checksum inside every
 * consume_window, and drops a datagram whose checksum fails (with what the
 * handler sent). The imports below then read "message" for "frame";
 * reply_udp still answers the datagram.
 *
 * Build (clang and wasm-ld; no libc):
 *
 *   clang --target=wasm32 -nostdlib -O2 -mcpu=mvp -mmutable-globals \
 *         -msign-ext -mbulk-memory -Wl,--no-entry -Wl,--export=ash_handle \
 *         -Wl,--export=__stack_pointer -I include -o h.wasm h.c
 *
 * -mcpu=mvp plus the three features is what the runtime accepts, whatever
 * clang's default CPU; -mbulk-memory also turns struct copies and zeroing
 * into memory.copy/memory.fill, since there is no libc memcpy. Exporting
 * __stack_pointer (a mutable global, hence -mmutable-globals) lets the
 * runtime reset the C stack after an abort, which leaves the aborting
 * functions' frames allocated. Floating point is refused.
 *
 * The entry point:
 *
 *   int ash_handle(int frame_len);
 *
 * returns ASH_CONSUMED (the frame is not delivered) or ASH_DELIVER (delivered
 * as usual). Anything else, a trap, misuse of an import or running out of fuel
 * aborts the invocation: the frame is delivered untouched and the
 * invocation's sends are discarded; window writes already made stay (undoing
 * them is the handler's concern, §3.2).
 *
 * Fuel (the per-invocation budget): one unit per instruction, one per byte
 * for memory.copy/memory.fill, 8 plus one per 8 bytes for imports that move
 * bytes, 8 plus the pipe list's cost for consume_window through one.
 *
 * Misuse (aborts): a negative length or frame offset, a range outside the
 * handler's memory or the window, no window granted, an unknown pipe list or
 * register. A frame too short for a request is not misuse: the import
 * returns -1.
 */
#ifndef EXONET_ASH_H
#define EXONET_ASH_H

#include <stdint.h>

#define ASH_CONSUMED 0
#define ASH_DELIVER 1
/* consume_window's pipe list for a plain copy. */
#define NULL_PIPE (-1)

#define ASH_IMPORT(name) __attribute__((import_module("exonet"), import_name(#name)))

/* Length of the frame. */
ASH_IMPORT(msg_len) int32_t msg_len(void);
/* Copies frame bytes [off, off+n) to dst; n, or -1 if the frame is shorter. */
ASH_IMPORT(peek) int32_t peek(void *dst, int32_t off, int32_t n);
/* Copies the n bytes at the cursor to dst and advances the cursor; n, or -1
 * if the frame is short (cursor unchanged). Figure 3's consume(dst, n,
 * NULL_PIPE) into private memory. */
ASH_IMPORT(consume) int32_t consume(void *dst, int32_t n);
/* Advances the cursor by n; n, or -1 past the frame's end. */
ASH_IMPORT(skip) int32_t skip(int32_t n);
/* The cursor. */
ASH_IMPORT(cursor) int32_t cursor(void);
/* Moves the cursor to off; off, or -1 past the frame's end. */
ASH_IMPORT(seek) int32_t seek(int32_t off);
/* Moves the n bytes at the cursor into the window at win_off through pipe
 * list pipe_list (NULL_PIPE: a plain copy) and advances; n, or -1 if the frame
 * is short. Charged the pipe list's cost. */
ASH_IMPORT(consume_window) int32_t consume_window(uint32_t win_off, int32_t n, int32_t pipe_list);
/* Length of the window (0 if none was granted). */
ASH_IMPORT(window_len) int32_t window_len(void);
/* Copies window bytes [win_off, win_off+n) to dst. */
ASH_IMPORT(window_read) void window_read(void *dst, uint32_t win_off, int32_t n);
/* Copies n bytes from src into the window at win_off. */
ASH_IMPORT(window_write) void window_write(uint32_t win_off, const void *src, int32_t n);
/* Little-endian loads and stores in the window, any alignment. */
ASH_IMPORT(window_load32) uint32_t window_load32(uint32_t win_off);
ASH_IMPORT(window_store32) void window_store32(uint32_t win_off, uint32_t v);
ASH_IMPORT(window_load64) uint64_t window_load64(uint32_t win_off);
ASH_IMPORT(window_store64) void window_store64(uint32_t win_off, uint64_t v);
/* Persistent register reg of pipe pipe in pipe list pl (the paper's import
 * and export of pipe state). */
ASH_IMPORT(pipe_reg) uint64_t pipe_reg(int32_t pl, int32_t pipe, int32_t reg);
ASH_IMPORT(pipe_set_reg) void pipe_set_reg(int32_t pl, int32_t pipe, int32_t reg, uint64_t v);
/* Queues a whole Ethernet frame; 0, or -1 if the outbox is full or len is
 * out of range. The multiplexer checks it against the channel's transmit
 * template. */
ASH_IMPORT(send) int32_t send(const void *frame, int32_t len);
/* If the frame is Ethernet/IPv4/UDP, queues a reply carrying len payload
 * bytes: addresses and ports swapped, fresh IPv4 header, both checksums; 0,
 * or -1 if the frame is not UDP or the reply does not fit. */
ASH_IMPORT(reply_udp) int32_t reply_udp(const void *payload, int32_t len);
/* Aborts the invocation; never returns. */
ASH_IMPORT(abort) __attribute__((noreturn)) void ash_abort(void);

#undef ASH_IMPORT

/* The big-endian 16-bit word at p. */
static inline uint32_t ash_be16(const uint8_t *p) {
    return ((uint32_t)p[0] << 8) | p[1];
}

/* Checks that the frame is untagged Ethernet/IPv4/UDP (unfragmented, its
 * lengths consistent) and moves the cursor to the UDP payload; returns the
 * payload's length (from the UDP header), or -1 (cursor unchanged). */
static inline int32_t ash_skip_udp_headers(void) {
    uint8_t h[24];
    if (peek(h, 0, 24) < 0 || ash_be16(h + 12) != 0x0800 || (h[14] >> 4) != 4 || h[23] != 17)
        return -1;
    int32_t ihl = (h[14] & 0x0f) * 4;
    if (ihl < 20 || (ash_be16(h + 20) & 0x3fff) != 0) /* options too short, or a fragment */
        return -1;
    int32_t ip_len = (int32_t)ash_be16(h + 16);
    uint8_t u[8];
    if (ip_len < ihl + 8 || 14 + ip_len > msg_len() || peek(u, 14 + ihl, 8) < 0)
        return -1;
    int32_t udp_len = (int32_t)ash_be16(u + 4);
    if (udp_len < 8 || udp_len > ip_len - ihl)
        return -1;
    seek(14 + ihl + 8);
    return udp_len - 8;
}

/* Folds a one's-complement sum (RFC 1071) to 16 bits. */
static inline uint32_t ash_cksum_fold(uint64_t sum) {
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint32_t)sum;
}

/*
 * The window layout of the example cache_server (handlers/cache_server.c;
 * the Rust side builds it with exonet_ash::handler::examples::CacheLayout).
 * All fields little-endian u32:
 *
 *   [0, 16)   header: count, key_size, value_size, 0
 *   entry i at ASH_CACHE_HEADER_LEN + i * (8 + key_size + value_size):
 *             key_len (0: empty slot), value_len, key[key_size],
 *             value[value_size]
 *
 * A request's UDP payload is a key (1 to key_size bytes); it hits the entry
 * whose key_len and first key_len key bytes equal it. To update an entry
 * while handlers run, the application clears key_len first and sets it last.
 */
#define ASH_CACHE_HEADER_LEN 16
#define ASH_CACHE_MAX_KEY 1024
#define ASH_CACHE_MAX_VALUE 32768

#endif
