/* Remote increment (the paper's Table 6) over UDP: the payload is the u32
 * window offset of a u64 counter; increment it and reply with the new value
 * (8 bytes, little-endian). The reply is queued before the counter is
 * written, so an abort leaves the counter alone. */
#include "exonet_ash.h"

int ash_handle(int frame_len) {
    (void)frame_len;
    uint32_t off;
    if (ash_skip_udp_headers() < 4)
        ash_abort();
    consume(&off, sizeof off);
    uint32_t w = (uint32_t)window_len();
    if (w < 8 || off > w - 8)
        ash_abort();
    uint64_t v = window_load64(off) + 1;
    if (reply_udp(&v, sizeof v) < 0)
        ash_abort();
    window_store64(off, v);
    return ASH_CONSUMED;
}
